"""The selection key names the machine: records must never answer for a machine that differs.

A record is found by its selection key alone (op + argument specs + system fingerprint), so every
fact that changes a timing must change the key: the CPU (its name and, where a cloud VM gives every
generation one name, its family/model numbers), the vector features usable, the core count and the
compiler. The real CPU cannot be swapped under a test, so the CPU facts come from a fake
/proc/cpuinfo (the one file cpuinfo reads); the compiler is swapped for real (a different binary).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest

from tuneforge import config, cpuinfo
from tuneforge.tune import fingerprint
from tuneforge.tune.choices import ExternChoice
from tuneforge.tune.select import clear_memo, select_detailed, selection_key
from tuneforge.tune.specs import TensorSpec, key_of

from . import tuning_kernels as k
from .conftest import run_python

pytestmark = pytest.mark.skipif(platform.system() != "Linux", reason="the CPU facts come from /proc/cpuinfo")

ARM = platform.machine().lower() in ("aarch64", "arm64")
# Raw flags as the kernel spells them, for this machine's architecture (the table cpuinfo maps).
KERNEL_FLAGS = sorted(cpuinfo._ARM_FEATURES if ARM else cpuinfo._X86_FEATURES)
BASE_FLAGS = ("fpu", "sse2", "hypervisor", *KERNEL_FLAGS)

ARGS = [np.empty((64, 32), np.float32), np.empty((32, 48), np.float32), np.empty((64, 48), np.float32)]


def x86_text(name: str = "AMD EPYC", *, vendor: str = "AuthenticAMD", family: int = 26, model: int = 2,
             stepping: int = 1, flags: tuple[str, ...] = BASE_FLAGS, processors: int = 2) -> str:
    block = (f"vendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\nmodel name\t: {name}\n"
             f"stepping\t: {stepping}\nflags\t\t: {' '.join(flags)}\n")
    return "\n".join(f"processor\t: {i}\n{block}" for i in range(processors))


def arm_text(part: str, *, implementer: str = "0x41", features: tuple[str, ...] = BASE_FLAGS) -> str:
    """An ARM64 kernel's /proc/cpuinfo: no model name, only implementer and part numbers."""
    block = (f"Features\t: {' '.join(features)}\nCPU implementer\t: {implementer}\nCPU architecture: 8\n"
             f"CPU variant\t: 0x1\nCPU part\t: {part}\nCPU revision\t: 1\n")
    return "\n".join(f"processor\t: {i}\n{block}" for i in range(2))


def forget_machine_facts() -> None:
    cpuinfo.cpu_info.cache_clear()
    fingerprint.clear_fingerprint_cache()


@pytest.fixture
def key_on(cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """key_on(cpuinfo_text): the selection key of one gemm-like op on a machine described by that text."""
    counter = iter(range(1_000_000))

    def key(text: str) -> str:
        fake = tmp_path / f"cpuinfo-{next(counter)}"
        fake.write_text(text)
        monkeypatch.setattr(cpuinfo, "PROC_CPUINFO", fake)
        forget_machine_facts()
        return selection_key("gemm", ARGS)

    yield key
    monkeypatch.undo()
    forget_machine_facts()  # the next test sees the real machine again


def test_fake_cpuinfo_is_what_the_key_sees(key_on: Callable[[str], str]) -> None:
    first = key_on(x86_text("Test CPU 9000"))
    assert key_on(x86_text("Test CPU 9000")) == first  # same facts, same key: nothing random in it
    assert cpuinfo.cpu_info().model == "Test CPU 9000"
    assert fingerprint.system_fingerprint()["cpu_model"] == "Test CPU 9000"


def test_cpu_model_name_changes_the_key(key_on: Callable[[str], str]) -> None:
    assert key_on(x86_text("AMD EPYC 7763 64-Core Processor")) != key_on(x86_text("AMD EPYC 9654 96-Core Processor"))


def test_cpu_generations_behind_one_model_name_get_different_keys(key_on: Callable[[str], str]) -> None:
    # Cloud VMs say "AMD EPYC" for Zen 3, 4 and 5 alike; the family/model numbers still differ.
    zen5 = key_on(x86_text("AMD EPYC", family=26, model=2))
    assert key_on(x86_text("AMD EPYC", family=25, model=17)) != zen5
    assert key_on(x86_text("AMD EPYC", family=26, model=17)) != zen5
    assert key_on(x86_text("AMD EPYC", vendor="GenuineIntel")) != zen5
    # One model in another stepping runs the same code at the same speed: records stay shared.
    assert key_on(x86_text("AMD EPYC", family=26, model=2, stepping=0)) == zen5


def test_arm_cpus_without_a_model_name_are_told_apart(key_on: Callable[[str], str]) -> None:
    neoverse_n1, neoverse_v1 = key_on(arm_text("0xd0c")), key_on(arm_text("0xd40"))
    assert neoverse_n1 != neoverse_v1
    assert key_on(arm_text("0xd0c", implementer="0x61")) != neoverse_n1
    assert cpuinfo.cpu_info().ident == "cpu implementer=0x61,cpu variant=0x1,cpu part=0xd0c"


@pytest.mark.parametrize("flag", KERNEL_FLAGS)
def test_each_vector_feature_changes_the_key(key_on: Callable[[str], str], flag: str) -> None:
    # A VM can mask one feature while keeping the model name: -march=native then builds other code.
    every = key_on(x86_text(flags=BASE_FLAGS))
    assert key_on(x86_text(flags=tuple(f for f in BASE_FLAGS if f != flag))) != every


def test_flags_no_kernel_can_use_leave_the_key_alone(key_on: Callable[[str], str]) -> None:
    # A kernel update that reports one more bookkeeping flag must not throw every record away.
    assert key_on(x86_text(flags=(*BASE_FLAGS, "constant_tsc", "arat"))) == key_on(x86_text(flags=BASE_FLAGS))


def test_core_count_changes_the_key(key_on: Callable[[str], str], monkeypatch: pytest.MonkeyPatch) -> None:
    text = x86_text()
    real = key_on(text)
    cores = os.cpu_count() or 1
    monkeypatch.setattr(os, "cpu_count", lambda: cores * 2)
    assert key_on(text) != real
    assert fingerprint.system_fingerprint()["cores"] == cores * 2
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    assert key_on(text) == real


def test_compiler_setting_changes_the_key_in_this_process(cache_dir: Path, wrapper_compiler: Path) -> None:
    default = selection_key("gemm", ARGS)
    with config.patch(cpp_cxx=str(wrapper_compiler)):
        other = selection_key("gemm", ARGS)
        assert fingerprint.system_fingerprint()["compiler"]["name"] == "logging-g++"
    assert other != default
    assert selection_key("gemm", ARGS) == default  # back to the default compiler: its records again


def test_records_tuned_with_one_compiler_do_not_answer_for_another(cache_dir: Path, wrapper_compiler: Path) -> None:
    choices = [ExternChoice(k.add), ExternChoice(k.add_slow)]
    inputs, out = [np.ones(64), np.ones(64)], np.empty(64)
    clear_memo()
    try:
        with config.patch(autotune_bench_time_s=0.003, autotune_warmup_s=0.0, autotune_min_repeats=2):
            first = select_detailed("add", choices, inputs, out=out)
            again = select_detailed("add", choices, inputs, out=out)
            with config.patch(cpp_cxx=str(wrapper_compiler)):
                other = select_detailed("add", choices, inputs, out=out)
    finally:
        clear_memo()
    assert (first.source, again.source, again.key) == ("tuned", "memo", first.key)
    assert other.source == "tuned" and other.key != first.key
    assert sorted(other.benchmarked) == ["add", "add_slow"]


KEY_IN_A_CHILD = """
import numpy as np
from tuneforge.tune.select import selection_key
print(selection_key("gemm", [np.empty((64, 32), np.float32), np.empty((32, 48), np.float32),
                             np.empty((64, 48), np.float32)]))
"""


def test_another_or_upgraded_compiler_gives_another_key_in_a_fresh_process(cache_dir: Path,
                                                                            wrapper_compiler: Path) -> None:
    def child_key(cxx: str | None) -> str:
        env = {"TUNEFORGE_CPP_CXX": cxx} if cxx else {}
        return run_python(KEY_IN_A_CHILD, env=env).stdout.strip()

    default, wrapped = child_key(None), child_key(str(wrapper_compiler))
    assert default == selection_key("gemm", ARGS)  # the same machine and compiler in every process
    assert wrapped != default and child_key(str(wrapper_compiler)) == wrapped
    # An upgrade in place (same path, same version line, other bytes) is another compiler.
    upgraded = wrapper_compiler.with_name("upgraded")
    upgraded.write_text(wrapper_compiler.read_text().replace("exec g++", "# rebuilt\nexec g++"))
    upgraded.chmod(0o755)
    os.replace(upgraded, wrapper_compiler)
    assert child_key(str(wrapper_compiler)) not in (default, wrapped)


def test_a_selection_on_a_gpu_is_keyed_by_that_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    def on(name: str, capability: list[int]) -> str:
        # No GPU here: stand in for what gpu_fingerprint reads off the device, through its own hashing.
        facts = fingerprint.gpu_facts(name=name, capability=capability, sms=132, memory_bytes=80 << 30,
                                      driver=12080, cuda="12.8", torch="2.13.0", triton="3.8.0")
        monkeypatch.setattr(fingerprint, "gpu_fingerprint", lambda index: facts)
        return selection_key("mm", [TensorSpec.contiguous((64, 64), "float16", device="cuda"),
                                    TensorSpec.contiguous((64, 64), "float16", device="cuda")])

    h100, a100, again = on("NVIDIA H100 80GB HBM3", [9, 0]), on("NVIDIA A100-SXM4-80GB", [8, 0]), \
        on("NVIDIA H100 80GB HBM3", [9, 0])
    cpu = selection_key("mm", [TensorSpec.contiguous((64, 64), "float16")] * 2)
    assert h100 == again and len({h100, a100, cpu}) == 3
    # A CPU selection's key has no GPU in it: the records of every earlier version still answer.
    assert cpu == fingerprint.selection_key("mm", {"args": [key_of(TensorSpec.contiguous((64, 64), "float16"))] * 2},
                                            gpu=None)


@pytest.mark.gpu
def test_the_gpu_fingerprint_reads_the_device() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tuneforge.tune.fingerprint import gpu_fingerprint

    facts = gpu_fingerprint(0)
    assert facts["name"] == torch.cuda.get_device_name(0) and facts["driver"] > 0 and len(facts["hash"]) > 20


@pytest.mark.parametrize("name", ["numpy", "jinja2", "pytest"])
def test_a_packages_version_is_read_without_importing_it_as_metadata_says(name: str) -> None:
    from importlib import metadata

    from tuneforge.tune.fingerprint import package_version

    assert package_version(name) == metadata.version(name)
    assert package_version("no_such_package_here") is None
