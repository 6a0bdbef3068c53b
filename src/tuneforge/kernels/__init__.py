"""Kernel families shipped with tuneforge, each a template plus a choice generator."""
