"""The public entry point for C++ kernels: ``tuneforge.cpp.load(source)`` (ctypes) and
``tuneforge.cpp.load_module(source)`` (an extension module). The code lives in `tuneforge.compile.cpp`;
this name is the one users import and the one that stays stable when the compile layer moves."""

from tuneforge.compile.cpp import CppArtifact, CppBuild, artifact_key, build, load, load_module

__all__ = ["CppArtifact", "CppBuild", "artifact_key", "build", "load", "load_module"]
