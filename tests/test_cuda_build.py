"""tuneforge.cuda: CUDA C++ -> cubin for a real sm_XX with nvcc or NVRTC, cached by content; driver-API launch.

Compiling needs no GPU (nvcc and NVRTC come from the nvidia-cuda-nvcc / -nvrtc wheels); the tests that
load and launch are marked gpu and skip without one.
"""

from __future__ import annotations

import ctypes
import json
import os
import struct
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tuneforge import config
from tuneforge.compile import cuda_toolchain
from tuneforge.compile.cuda import normalise_arch
from tuneforge.compile.cuda_driver import kernel_arg
from tuneforge.cuda import CudaBuild, CudaError, artifact_key, build, cubin_arch
from tuneforge.errors import CompileError, ToolchainError

from .conftest import run_python

NVCC = cuda_toolchain.find_nvcc()
NVRTC = cuda_toolchain.find_nvrtc()
pytestmark = pytest.mark.skipif(NVCC is None and NVRTC is None, reason="neither nvcc nor NVRTC is installed")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
needs_nvrtc = pytest.mark.skipif(NVRTC is None, reason="NVRTC (libnvrtc.so) is not installed")
COMPILERS = [pytest.param("nvcc", marks=needs_nvcc), pytest.param("nvrtc", marks=needs_nvrtc)]

SAXPY = textwrap.dedent("""\
    extern "C" __global__ void saxpy(float a, const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = a * x[i] + y[i];
    }
    """)
BROKEN = 'extern "C" __global__ void broken(float* y) { y[0] = undefined_symbol; }\n'


def elf_sm(image: bytes) -> int:
    """The SM a cubin is for, read straight from its ELF header (CUDA 13 layout: ABI version 8,
    SM number in bits 8-15 of e_flags), independently of tuneforge's own reader."""
    assert image[:4] == b"\x7fELF" and image[7] == 0x41  # ELF, EI_OSABI = CUDA
    (machine,) = struct.unpack_from("<H", image, 18)
    (flags,) = struct.unpack_from("<I", image, 48)
    assert machine == 190  # EM_CUDA
    return (flags >> 8) & 0xFF if image[8] >= 8 else flags & 0xFF


@pytest.fixture
def logging_nvcc(tmp_path: Path) -> tuple[Path, Path]:
    """A CUDA_HOME whose bin/nvcc logs each compile (not the --version probe) and runs the real nvcc.

    TUNEFORGE_TEST_SLOW_COMPILE=<s> makes a compile sleep first; TUNEFORGE_TEST_BAD_CUBIN replaces its output.
    """
    if NVCC is None:
        pytest.skip("nvcc is not installed")
    home, log = tmp_path / "cuda_home", tmp_path / "nvcc.log"
    (home / "bin").mkdir(parents=True)
    script = home / "bin" / "nvcc"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case " $* " in
          *" -cubin "*)
            echo "$*" >> {log}
            if [ -n "$TUNEFORGE_TEST_SLOW_COMPILE" ]; then sleep "$TUNEFORGE_TEST_SLOW_COMPILE"; fi
            if [ -n "$TUNEFORGE_TEST_BAD_CUBIN" ]; then "{NVCC}" "$@" && printf 'not a cubin' > kernel.cubin; exit; fi
            ;;
        esac
        exec "{NVCC}" "$@"
        """))
    script.chmod(0o755)
    return home, log


def compiles(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


# ------------------------------------------------------------------------------------- compiling


@pytest.mark.parametrize("compiler", COMPILERS)
def test_builds_a_cubin_for_the_real_sm(cache_dir: Path, compiler: str) -> None:
    started = time.perf_counter()
    artifact = build(CudaBuild(SAXPY, arch="sm_90", compiler=compiler))
    cold = time.perf_counter() - started
    image = artifact.cubin_path.read_bytes()
    assert artifact.compiled and artifact.arch == "sm_90" and artifact.key.startswith("cuda")
    assert elf_sm(image) == 90 and cubin_arch(image) == 90
    assert artifact.entry.meta["arch"] == "sm_90" and artifact.entry.meta["compiler"] == compiler
    assert artifact.key_inputs["compiler"]["kind"] == compiler

    older = build(CudaBuild(SAXPY, arch=80, compiler=compiler))  # the header check tells the two apart
    assert elf_sm(older.cubin_path.read_bytes()) == 80 and older.key != artifact.key

    started = time.perf_counter()
    again = build(CudaBuild(SAXPY, arch=90, compiler=compiler))
    hit = time.perf_counter() - started
    assert not again.compiled and again.key == artifact.key
    print(f"{compiler}: cold build {cold * 1e3:.0f} ms, in-process hit {hit * 1e3:.2f} ms")


def test_second_nvcc_build_in_a_fresh_process_runs_no_compiler(cache_dir: Path, logging_nvcc: tuple[Path, Path],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    home, log = logging_nvcc
    monkeypatch.setenv("CUDA_HOME", str(home))
    code = f"""
        import json, sys, time
        spawned = []
        sys.addaudithook(lambda event, args: spawned.append(str(args[0])) if event == "subprocess.Popen" else None)
        from tuneforge.cuda import CudaBuild, build
        started = time.perf_counter()
        artifact = build(CudaBuild({SAXPY!r}, arch="sm_90"))
        print(json.dumps([artifact.key, artifact.compiled, spawned, time.perf_counter() - started]))
        """
    first_key, first_compiled, _, cold_s = json.loads(run_python(code).stdout)
    assert first_compiled and compiles(log) == 1
    key, compiled, spawned, hit_s = json.loads(run_python(code).stdout)
    assert (key, compiled) == (first_key, False)
    assert compiles(log) == 1 and spawned == []  # no compile and no probe: the probe was kept on disk
    print(f"nvcc: cold build {cold_s * 1e3:.0f} ms, fresh-process hit {hit_s * 1e3:.2f} ms")


@needs_nvrtc
def test_second_nvrtc_build_in_a_fresh_process_runs_no_compiler(cache_dir: Path) -> None:
    code = f"""
        import json, sys
        events = []
        sys.addaudithook(lambda e, a: events.append(f"{{e}} {{a[:2]}}") if e in ("subprocess.Popen", "ctypes.dlopen")
                         else None)
        from tuneforge.cuda import CudaBuild, build
        artifact = build(CudaBuild({SAXPY!r}, arch="sm_90", compiler="nvrtc"))
        print(json.dumps([artifact.key, artifact.compiled, events]))
        """
    first_key, first_compiled, first_events = json.loads(run_python(code).stdout)
    assert first_compiled and any("cuda_nvrtc.py" in e for e in first_events)  # the audit hook sees the compile
    key, compiled, events = json.loads(run_python(code).stdout)
    assert (key, compiled) == (first_key, False)
    assert [e for e in events if "Popen" in e or "nvrtc" in e] == []  # no compiler, no probe, no libnvrtc


def test_keys_cover_arch_flags_source_compiler_and_headers(cache_dir: Path, tmp_path: Path) -> None:
    compilers = [c for c, found in (("nvcc", NVCC), ("nvrtc", NVRTC)) if found]
    headers = tmp_path / "include"
    headers.mkdir()
    (headers / "scale.cuh").write_text("#define SCALE 2.0f\n")
    variants = {
        "base": CudaBuild(SAXPY, arch="sm_90", compiler=compilers[0]),
        "arch": CudaBuild(SAXPY, arch="sm_80", compiler=compilers[0]),
        "arch suffix": CudaBuild(SAXPY, arch="sm_90a", compiler=compilers[0]),
        "flags": CudaBuild(SAXPY, arch="sm_90", flags=("-lineinfo",), compiler=compilers[0]),
        "source": CudaBuild(SAXPY + "\n", arch="sm_90", compiler=compilers[0]),
        "headers": CudaBuild(SAXPY, arch="sm_90", include_dirs=(str(headers),), compiler=compilers[0]),
    }
    if len(compilers) == 2:
        variants["compiler"] = CudaBuild(SAXPY, arch="sm_90", compiler=compilers[1])
    keys = {name: artifact_key(b)[0] for name, b in variants.items()}
    assert len(set(keys.values())) == len(keys), keys
    assert artifact_key(CudaBuild(SAXPY, arch=90, compiler=compilers[0]))[0] == keys["base"]

    (headers / "scale.cuh").write_text("#define SCALE 3.0f\n")
    assert artifact_key(variants["headers"])[0] != keys["headers"]
    material = artifact_key(variants["headers"])[1]
    assert not any(str(tmp_path) in arg for arg in material["command"])  # include dirs by content, not path

    code = f"""
        from tuneforge.cuda import CudaBuild, artifact_key
        for compiler in {compilers!r}:
            print(artifact_key(CudaBuild({SAXPY!r}, arch="sm_90", compiler=compiler))[0])
        """
    other = run_python(code).stdout.split()
    assert other == [artifact_key(CudaBuild(SAXPY, arch="sm_90", compiler=c))[0] for c in compilers]


@pytest.mark.parametrize("compiler", COMPILERS)
def test_compile_error_carries_the_compiler_output_and_the_kept_source(cache_dir: Path, compiler: str) -> None:
    with pytest.raises(CompileError) as caught:
        build(CudaBuild(BROKEN, arch="sm_90", compiler=compiler))
    error = caught.value
    assert "undefined_symbol" in error.stderr and "undefined_symbol" in str(error)
    assert error.source_path is not None and error.source_path.read_text() == BROKEN
    assert error.source_path.is_relative_to(cache_dir / "failed")
    assert "-arch=sm_90" in error.command if compiler == "nvcc" else "--gpu-architecture=sm_90" in error.command
    assert not list((cache_dir / "artifacts").glob("cuda*"))  # nothing half-written was published


def test_compile_timeout_kills_nvcc(cache_dir: Path, logging_nvcc: tuple[Path, Path],
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    home, _ = logging_nvcc
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.setenv("TUNEFORGE_TEST_SLOW_COMPILE", "30")
    started = time.perf_counter()
    with config.patch(compile_timeout_s=1.0), pytest.raises(CompileError, match="timed out"):
        build(CudaBuild(SAXPY, arch="sm_90", compiler="nvcc"))
    assert time.perf_counter() - started < 10


def test_output_that_is_not_a_cubin_for_the_arch_is_never_stored(cache_dir: Path, logging_nvcc: tuple[Path, Path],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    home, _ = logging_nvcc
    monkeypatch.setenv("CUDA_HOME", str(home))
    monkeypatch.setenv("TUNEFORGE_TEST_BAD_CUBIN", "1")
    with pytest.raises(CompileError, match="no CUDA cubin"):
        build(CudaBuild(SAXPY, arch="sm_90", compiler="nvcc"))
    monkeypatch.delenv("TUNEFORGE_TEST_BAD_CUBIN")
    assert build(CudaBuild(SAXPY, arch="sm_90", compiler="nvcc")).compiled


# ------------------------------------------------------------------------------- targets and discovery


@pytest.mark.parametrize("arch", ["compute_90", "native", "all", "lto_90", "sm_", "gfx90a", "9"])
def test_generic_or_unknown_targets_are_refused(arch: str) -> None:
    with pytest.raises(ValueError, match="arch="):
        CudaBuild(SAXPY, arch=arch)


@pytest.mark.parametrize("flag", ["-arch=compute_90", "--gpu-architecture=sm_80", "-gencode", "-ptx", "-rdc=true"])
def test_flags_that_change_the_target_are_refused(flag: str) -> None:
    with pytest.raises(ValueError, match="arch argument"):
        CudaBuild(SAXPY, arch="sm_90", flags=(flag,))


def test_arch_spellings() -> None:
    assert [normalise_arch(a) for a in ("sm_90", "90", 90, "SM_90A", "sm_100f", None)] == [
        "sm_90", "sm_90", "sm_90", "sm_90a", "sm_100f", None]


@pytest.mark.skipif(os.path.exists("/dev/nvidia0"), reason="this machine has a GPU")
def test_missing_arch_without_a_gpu_names_the_argument(cache_dir: Path) -> None:
    with pytest.raises(CudaError, match=r"arch=None .* Pass arch='sm_90'"):
        build(CudaBuild(SAXPY))


def test_discovery_order(tmp_path: Path, logging_nvcc: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    home, _ = logging_nvcc
    monkeypatch.setenv("CUDA_HOME", str(home))
    assert cuda_toolchain.find_nvcc() == str(home / "bin" / "nvcc")  # $CUDA_HOME first
    monkeypatch.delenv("CUDA_HOME")
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(home / "bin"))
    assert cuda_toolchain.find_nvcc() == str(home / "bin" / "nvcc")  # then PATH
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    found = cuda_toolchain.find_nvcc()  # then the wheel
    assert found is None or ("site-packages" in found and found.endswith("/bin/nvcc")), found
    if NVRTC or found is not None:
        assert cuda_toolchain.select_toolchain("nvrtc" if NVRTC else "nvcc").kind == ("nvrtc" if NVRTC else "nvcc")
    else:  # README's test command installs no CUDA wheel: then nothing is found, and the error says what to do
        with pytest.raises(ToolchainError, match="no nvcc was found: set CUDA_HOME"):
            cuda_toolchain.select_toolchain("nvcc")
    with pytest.raises(ToolchainError, match="compiler='clang'"):
        cuda_toolchain.select_toolchain("clang")


def test_wheel_layouts_are_found(tmp_path: Path, logging_nvcc: tuple[Path, Path],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    home, _ = logging_nvcc
    site = tmp_path / "site"
    (site / "nvidia" / "cuda_nvcc" / "bin").mkdir(parents=True)  # the CUDA 12 wheel's layout
    (site / "nvidia" / "cuda_nvcc" / "bin" / "nvcc").symlink_to(home / "bin" / "nvcc")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    monkeypatch.syspath_prepend(str(site))
    assert cuda_toolchain.find_nvcc() == str(home / "bin" / "nvcc")


def test_builds_with_the_wheels_nvcc_named_by_path(cache_dir: Path) -> None:
    wheel = next((Path(p) / "nvidia/cu13/bin/nvcc" for p in sys.path if (Path(p) / "nvidia/cu13/bin/nvcc").is_file()),
                 None)
    if wheel is None:
        pytest.skip("the nvidia-cuda-nvcc wheel (CUDA 13) is not installed")
    artifact = build(CudaBuild(SAXPY, arch="sm_90", compiler=str(wheel)))
    assert artifact.compiled and elf_sm(artifact.cubin_path.read_bytes()) == 90
    assert artifact.key_inputs["compiler"]["kind"] == "nvcc"
    assert "release 13" in artifact.key_inputs["compiler"]["version"]


# ---------------------------------------------------------------------------------------- launching


def test_kernel_arguments_must_say_their_width() -> None:
    assert kernel_arg(0x7F00_0000_1000, 0).value == 0x7F00_0000_1000
    assert isinstance(kernel_arg(ctypes.c_float(1.5), 1), ctypes.c_float)
    for bad in (1.5, True, -1, "x"):
        with pytest.raises(TypeError, match="ctypes scalar"):
            kernel_arg(bad, 2)


def _gpu_torch() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    return torch


@pytest.mark.gpu
def test_load_and_launch_saxpy_on_torch_tensors(cache_dir: Path) -> None:
    torch = _gpu_torch()
    import tuneforge.cuda as tcuda

    n = 100_003
    x = torch.randn(n, device="cuda")
    y = torch.randn(n, device="cuda")
    expected = 2.5 * x + y
    module = tcuda.load(SAXPY)
    saxpy = module.function("saxpy")
    saxpy(((n + 255) // 256,), (256,), [ctypes.c_float(2.5), x, y.data_ptr(), ctypes.c_int(n)],
          stream=torch.cuda.current_stream())
    torch.cuda.synchronize()
    torch.testing.assert_close(y, expected)
    assert tcuda.load(SAXPY) is module and module.function("saxpy") is saxpy
    with pytest.raises(CudaError, match='extern "C"'):
        module.function("no_such_kernel")


@pytest.mark.gpu
def test_fresh_process_loads_the_cached_cubin_without_compiling(cache_dir: Path) -> None:
    _gpu_torch()
    code = f"""
        import ctypes, json, sys, torch
        spawned = []
        sys.addaudithook(lambda event, args: spawned.append(str(args[0])) if event == "subprocess.Popen" else None)
        import tuneforge.cuda as tcuda
        x = torch.ones(1000, device="cuda"); y = torch.zeros(1000, device="cuda")
        module = tcuda.load({SAXPY!r})
        module.function("saxpy")(4, 256, [ctypes.c_float(3.0), x, y, ctypes.c_int(1000)])
        torch.cuda.synchronize()
        print(json.dumps([module.key, float(y.sum()), spawned]))
        """
    key, total, _ = json.loads(run_python(code).stdout)
    assert json.loads(run_python(code).stdout) == [key, total, []] and total == 3000.0


def test_cuda_settings_fill_what_load_is_not_told(cache_dir: Path, tmp_path: Path) -> None:
    from tuneforge.compile.cuda import request_for
    from tuneforge.errors import ConfigError

    with config.patch(cuda_arch="90", cuda_compiler="nvrtc", cuda_include_dirs=[tmp_path],
                      cuda_flags=["-DFROM_SETTING=1", "--use_fast_math"]):
        request = request_for(SAXPY, flags=["-DMINE=2"])
        assert (request.arch, request.compiler) == ("sm_90", "nvrtc")
        assert request.flags == ("-DFROM_SETTING=1", "--use_fast_math", "-DMINE=2")  # settings first
        assert request.include_dirs == (str(tmp_path),)
        explicit = request_for(SAXPY, arch="sm_80", compiler="nvcc")  # arguments win
        assert (explicit.arch, explicit.compiler) == ("sm_80", "nvcc")
    with config.patch(cuda_arch="compute_90"), \
            pytest.raises(ConfigError, match=r"'cuda.arch' \(environment variable TUNEFORGE_CUDA_ARCH\)"):
        request_for(SAXPY)  # a generic target from the settings names the setting to fix
