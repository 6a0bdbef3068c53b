"""C++ kernels: ``tuneforge.cpp.load(source)`` (ctypes) and ``tuneforge.cpp.load_module(source)``."""

from tuneforge.compile.cpp import CppArtifact, CppBuild, artifact_key, build, load, load_module

__all__ = ["CppArtifact", "CppBuild", "artifact_key", "build", "load", "load_module"]
