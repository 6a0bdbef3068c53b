"""Autotuning: input specs, choices, benchmarking, selection."""
