"""C++ kernels: ``tuneforge.cpp.load(source)`` (ctypes) and ``tuneforge.cpp.load_module(source)``."""

from tuneforge.compile.cpp import CppArtifact, CppBuild, build, load, load_module

__all__ = ["CppArtifact", "CppBuild", "build", "load", "load_module"]
