"""Declarations of every tuneforge setting: name, type, default, documentation, cache-key role.

Kept apart from `config.py` (the machinery that reads, validates, patches and saves values) so
that adding a setting is a one-line change in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuneforge import parsing
from tuneforge.dataclass_lite import dataclass

Parser = Callable[[str], Any]
Validator = Callable[[Any], Any]


@dataclass(frozen=True)
class Setting:
    """One setting. `name` is dotted (``cpp.flags``); its environment variable is derived from it."""

    name: str
    parse: Parser  # text (environment, CLI) -> value
    coerce: Validator  # Python value -> validated value (raises ValueError/TypeError)
    default: Any  # a value, or a zero-argument callable evaluated on first use
    doc: str
    # Settings that cannot change a compiled artifact or a tuning result (paths, logging,
    # verbosity) are excluded from `cache_key_hash()`; the exclusion is declared here, per setting.
    in_cache_key: bool = True
    secret: bool = False  # never displayed (config show prints *** instead)
    # What `config show` prints instead of a value that holds a secret in part (a URL's password).
    redact: Callable[[Any], Any] | None = None

    @property
    def env_var(self) -> str:
        return "TUNEFORGE_" + self.name.replace(".", "_").upper()

    def default_value(self) -> Any:
        return self.default() if callable(self.default) else self.default


def _usable_cores() -> int:
    from tuneforge.cpuinfo import usable_cores  # when the setting is read, not when settings are declared

    return usable_cores()


def _user_cache_dir() -> Path:
    import platformdirs  # lazily: only needed when no TUNEFORGE_CACHE_DIR is set

    return Path(platformdirs.user_cache_dir("tuneforge", appauthor=False))


GiB = 2**30

SETTINGS: tuple[Setting, ...] = (
    Setting("cache_dir", parsing.parse_path, parsing.coerce_path, _user_cache_dir,
            "Root directory of the artifact store, record database and logs.", in_cache_key=False),
    Setting("cache_max_bytes", parsing.parse_size, parsing.coerce_positive_int, 5 * GiB,
            "Size bound of the artifact store; least recently used entries are evicted beyond it "
            "(accepts 500M, 5G, ...).", in_cache_key=False),
    Setting("compile_threads", parsing.parse_int, parsing.coerce_positive_int, _usable_cores,
            "Parallel compiler processes (default: the cores this process may use).", in_cache_key=False),
    Setting("compile.start_method", parsing.parse_optional_str, parsing.one_of("default", "fork", "spawn",
                                                                                 "forkserver"), "default",
            "How the build pool starts its workers: fork, spawn or forkserver (default: the platform's, fork on "
            "Linux before Python 3.14). Forked workers share what the process has loaded; a process with a CUDA "
            "context is a large one to fork.", in_cache_key=False),
    Setting("compile_timeout_s", parsing.parse_float, parsing.coerce_positive_float, 600.0,
            "Seconds after which a compiler run is killed.", in_cache_key=False),
    Setting("lock_timeout_s", parsing.parse_float, parsing.coerce_positive_float, 900.0,
            "Seconds to wait for another process building the same artifact, or measuring the same selection.",
            in_cache_key=False),
    Setting("debug", parsing.parse_bool, parsing.coerce_bool, False,
            "Keep build directories and print compiler commands.", in_cache_key=False),
    Setting("log_level", parsing.parse_log_level, parsing.coerce_log_level, "WARNING",
            "Level of the tuneforge loggers (DEBUG, INFO, WARNING, ERROR).", in_cache_key=False),
    Setting("cpp.cxx", parsing.parse_optional_str, parsing.coerce_optional_str, None,
            "C++ compiler to use; default: $CXX, then g++, then clang++."),
    Setting("cpp.flags", parsing.parse_flags, parsing.coerce_str_tuple, (),
            "Extra compiler flags appended to every C++ build (shell syntax in the environment)."),
    Setting("cpp.openmp", parsing.parse_bool, parsing.coerce_bool, False,
            "Build C++ kernels with OpenMP by default."),
    Setting("cpp.march", parsing.parse_optional_str, parsing.coerce_march, parsing.DETECT_MARCH,
            "Target CPU for -march: 'detect' (the default) builds for the CPU the compiler detects, named "
            "explicitly in every key; never the literal 'native'."),
    Setting("cpp.opt_level", parsing.parse_opt_level, parsing.coerce_opt_level, "3",
            "Optimisation level: 0, 1, 2, 3, s or fast."),
    Setting("cpp.precompiled_header", parsing.parse_bool, parsing.coerce_bool, True,
            "Compile extension modules with a precompiled CPython header (g++; under <cache_dir>/pch): the same "
            "code, a third of a small module's compile time.", in_cache_key=False),
    Setting("cpp.split_bindings", parsing.parse_bool, parsing.coerce_bool, True,
            "Compile a module's generated bindings once, apart from its kernel, and link them in (Linux, g++ or "
            "clang++): the same module, the kernel compiled without Python.h.", in_cache_key=False),
    Setting("cpp.include_dirs", parsing.parse_path_list, parsing.coerce_path_tuple, (),
            "Extra include directories for every C++ build (os.pathsep separated in the environment)."),
    Setting("cuda.compiler", parsing.parse_optional_str, parsing.coerce_optional_str, None,
            "CUDA C++ compiler for tuneforge.cuda: 'nvcc', 'nvrtc' or a path to either; default: nvcc from "
            "$CUDA_HOME, PATH or the nvidia-cuda-nvcc wheel, else NVRTC."),
    Setting("cuda.arch", parsing.parse_optional_str, parsing.coerce_optional_str, None,
            "GPU architecture tuneforge.cuda builds for ('sm_90', '90', 'sm_90a'); default: the current GPU's."),
    Setting("cuda.flags", parsing.parse_flags, parsing.coerce_str_tuple, (),
            "Extra nvcc/NVRTC options for every tuneforge.cuda build (shell syntax in the environment)."),
    Setting("cuda.include_dirs", parsing.parse_path_list, parsing.coerce_path_tuple, (),
            "Extra include directories for every tuneforge.cuda build (os.pathsep separated in the environment)."),
    Setting("cuda.fp32_precision", parsing.parse_optional_str, parsing.one_of("torch", "ieee", "tf32", "tf32x3"),
            "torch", "How tuneforge.gemm multiplies float32 CUDA tensors: ieee, tf32 (tensor cores, ~1e-3 relative "
            "error), tf32x3 (three TF32 products, near-IEEE accuracy), or torch: tf32 where torch allows it "
            "(torch.backends.cuda.matmul.allow_tf32), else ieee.", in_cache_key=False),
    Setting("cuda.flush_l2", parsing.parse_bool, parsing.coerce_bool, True,
            "Write a buffer twice the GPU's L2 size before every timed run on a GPU, so each run reads its "
            "operands from memory as in a real program and the host's launch work stays outside the timed "
            "region (off: cache-warm timings, launch overhead included).", in_cache_key=False),
    Setting("cuda.bench_time_s", parsing.parse_float, parsing.coerce_positive_float, 0.03,
            "Time budget in seconds for the timed runs of one choice on a GPU (CUDA events resolve microseconds: "
            "a shorter budget than autotune.bench_time_s, which the host's clock needs).", in_cache_key=False),
    Setting("cuda.spin_up_s", parsing.parse_float, parsing.coerce_non_negative_float, 0.15,
            "Seconds of matrix products a process runs on a GPU before its first timing, so the clocks have left "
            "their idle state (an idle H200 runs at 345 MHz): the first choice timed is not timed slow.",
            in_cache_key=False),
    Setting("kernel_threads", parsing.parse_int, parsing.coerce_non_negative_int, 0,
            "Most threads a shipped kernel (gemm) may use; 0: every core this process may use.",
            in_cache_key=False),
    Setting("kernel_isa", parsing.parse_optional_str, parsing.one_of("auto", "avx512", "avx2", "neon", "sse"),
            "auto", "Widest vector ISA shipped kernels may use: auto (the widest this CPU has), or a narrower one "
            "(e.g. avx2 where AVX-512 lowers the clock).", in_cache_key=False),
    # Autotuning: none of these changes a compiled artifact, so none is in the artifact cache key.
    Setting("autotune.verbose", parsing.parse_bool, parsing.coerce_bool, False,
            "Print the AUTOTUNE table on stderr after each benchmarked selection.", in_cache_key=False),
    Setting("autotune.show", parsing.parse_int, parsing.coerce_positive_int, 10,
            "Rows of the AUTOTUNE table (all rows when log_level is DEBUG).", in_cache_key=False),
    Setting("autotune.cache_only", parsing.parse_bool, parsing.coerce_bool, False,
            "Never benchmark: use a cached winner, else the fallback (first extern) choice.", in_cache_key=False),
    Setting("autotune.force", parsing.parse_bool, parsing.coerce_bool, False,
            "Re-benchmark every choice even when records exist.", in_cache_key=False),
    Setting("autotune.verify", parsing.parse_bool, parsing.coerce_bool, True,
            "Compare each choice's output with the reference before timing it.", in_cache_key=False),
    Setting("autotune.statistic", parsing.parse_optional_str, parsing.one_of("median", "min", "mean"), "median",
            "Timing statistic used to pick the winner: median, min or mean.", in_cache_key=False),
    Setting("autotune.warmup_s", parsing.parse_float, parsing.coerce_non_negative_float, 0.01,
            "Seconds of untimed warm-up runs per choice (at least one run).", in_cache_key=False),
    Setting("autotune.bench_time_s", parsing.parse_float, parsing.coerce_positive_float, 0.1,
            "Time budget in seconds for the timed runs of one choice.", in_cache_key=False),
    Setting("autotune.min_repeats", parsing.parse_int, parsing.coerce_positive_int, 5,
            "Timed runs per choice even when the budget is spent.", in_cache_key=False),
    Setting("autotune.max_repeats", parsing.parse_int, parsing.coerce_positive_int, 1000,
            "At most this many timed runs per choice.", in_cache_key=False),
    Setting("autotune.max_bench_s", parsing.parse_float, parsing.coerce_non_negative_float, 0.5,
            "Stop timing a choice once its timed runs have lasted this long and at least 3 were done, even "
            "below min_repeats: long kernels vary little between runs (0: never).", in_cache_key=False),
    Setting("autotune.confirm_margin", parsing.parse_float, parsing.coerce_non_negative_float, 0.1,
            "Re-time the two fastest choices side by side, in alternating rounds, when they are within this "
            "fraction of each other (0: never).", in_cache_key=False),
    Setting("autotune.confirm_reference_ratio", parsing.parse_float, parsing.coerce_non_negative_float, 1.5,
            "Re-time the fastest choice and the reference (the first extern choice, e.g. numpy) side by side, in "
            "alternating rounds, when the fastest beat the reference by less than this factor (0: never).",
            in_cache_key=False),
    Setting("autotune.library_margin", parsing.parse_float, parsing.coerce_non_negative_float, 0.02,
            "A generated kernel replaces the fastest library call (an extern choice: numpy, cuBLAS) only when it "
            "is faster by more than this fraction (0: whichever timed fastest).", in_cache_key=False),
    Setting("autotune.abandon_ratio", parsing.parse_float, parsing.coerce_non_negative_float, 1.5,
            "Stop timing a choice after two runs slower than this many times the best so far (0: never).",
            in_cache_key=False),
    Setting("autotune.screen_ratio", parsing.parse_float, parsing.coerce_non_negative_float, 1.3,
            "With more than 8 choices, time each briefly first (a fifth of bench_time_s, on a GPU of "
            "cuda.bench_time_s) and give the full budget only to those within this many times the fastest (0: time "
            "every choice fully).",
            in_cache_key=False),
    Setting("autotune.stream", parsing.parse_optional_str, parsing.one_of("auto", "on", "off"), "auto",
            "Check and time the choices already built while the others compile, in parts: auto (on a GPU, whose "
            "CUDA-event timings the compilers on the CPU hardly disturb), on, or off (on the CPU the kernels timed "
            "would share the cores with the compilers). Contenders are timed fully once the builds are done.",
            in_cache_key=False),
    Setting("autotune.settle_s", parsing.parse_float, parsing.coerce_non_negative_float, 0.2,
            "Longest pause after a library call is timed, so its thread pool is idle before kernels are timed "
            "(OpenBLAS's threads spin for about 0.1-0.15 s after a call); the pause ends once the process "
            "uses no CPU.",
            in_cache_key=False),
    Setting("autotune.flush_cache", parsing.parse_bool, parsing.coerce_bool, False,
            "Evict the last-level cache before every timed run (cold-cache timings).", in_cache_key=False),
    Setting("autotune.seed", parsing.parse_int, parsing.coerce_non_negative_int, 0,
            "Seed of the example inputs (the user's random state is never touched).", in_cache_key=False),
    Setting("autotune.log", parsing.parse_optional_path, parsing.coerce_optional_path, None,
            "JSON-lines file that receives one line per selection.", in_cache_key=False),
    Setting("autotune.isolate", parsing.parse_bool, parsing.coerce_bool, True,
            "Verify and time compiled choices in a separate worker process that survives crashes and hangs.",
            in_cache_key=False),
    Setting("autotune.bench_timeout_s", parsing.parse_float, parsing.coerce_positive_float, 60.0,
            "Seconds one choice may take to verify and time in the worker before it is killed (status timeout).",
            in_cache_key=False),
    Setting("autotune.worker_profile", parsing.parse_optional_path, parsing.coerce_optional_path, None,
            "Folder where the benchmark worker writes a cProfile of each job it runs (worker-<pid>-<n>.prof): "
            "where a selection's trials (inputs, reference, checks, timing) spend their time. For diagnosis only: "
            "the trials' timings then carry the profiler's overhead.", in_cache_key=False),
    Setting("autotune.worker_cpus", parsing.parse_int_list, parsing.coerce_int_tuple, (),
            "CPU ids the benchmark worker is pinned to (comma separated; empty: no pinning).", in_cache_key=False),
    Setting("compile.progress", parsing.parse_bool, parsing.coerce_bool, True,
            "Show a progress bar for parallel builds when stderr is a terminal.", in_cache_key=False),
    # Shared caches: a Redis tier and shipped bundles of tuning records.
    Setting("remote.url", parsing.parse_optional_str, parsing.coerce_remote_url, None,
            "URL of the shared Redis cache (redis://, rediss:// or unix://; redis://[user:password@]host:port/db); "
            "unset: local caches only.", in_cache_key=False, redact=parsing.mask_url_password),
    Setting("remote.namespace", parsing.parse_optional_str, parsing.coerce_namespace, "tuneforge",
            "Prefix of every Redis key, so teams or projects can share one server.", in_cache_key=False),
    Setting("remote.secret", parsing.parse_secret, parsing.coerce_secret, None,
            "Shared secret: every remote value is signed (HMAC-SHA256) and unsigned or mis-signed values are "
            "rejected. Unset: no signing; set but empty: an error.", in_cache_key=False, secret=True),
    Setting("remote.allow_unsigned", parsing.parse_bool, parsing.coerce_bool, False,
            "Accept a remote cache without remote.secret silently. Unsigned remote artifacts are native code that "
            "anyone who can write to the server can make every client load; without this setting a remote URL "
            "without a secret prints one warning per process.", in_cache_key=False),
    Setting("remote.ttl_s", parsing.parse_float, parsing.coerce_non_negative_float, 30 * 24 * 3600.0,
            "Seconds a remote entry lives (0: forever).", in_cache_key=False),
    Setting("remote.max_entry_bytes", parsing.parse_size, parsing.coerce_positive_int, 64 * 2**20,
            "Largest (compressed) artifact put into the remote cache.", in_cache_key=False),
    Setting("remote.timeout_s", parsing.parse_float, parsing.coerce_positive_float, 0.5,
            "Per-call time-out of the remote cache; a slow server counts as an outage.", in_cache_key=False),
    Setting("remote.retry_s", parsing.parse_float, parsing.coerce_positive_float, 30.0,
            "After a remote error, seconds before the remote cache is tried again.", in_cache_key=False),
    Setting("remote.agree", parsing.parse_bool, parsing.coerce_bool, True,
            "Processes sharing the remote cache take one pick per selection: the first to publish its pick wins, "
            "the others take it (the ranks of a distributed job never pick differently).", in_cache_key=False),
    Setting("remote.agree_wait_s", parsing.parse_float, parsing.coerce_non_negative_float, 600.0,
            "Seconds a process waits for the pick of another that is measuring the same selection, before "
            "measuring on its own (it still takes a pick published first).", in_cache_key=False),
    Setting("bundles", parsing.parse_path_list, parsing.coerce_path_tuple, (),
            "Bundles of tuning records consulted read-only after the local and remote tiers "
            "(os.pathsep separated in the environment).", in_cache_key=False),
    Setting("bundles_nearest", parsing.parse_bool, parsing.coerce_bool, True,
            "When a bundle has no record for a shape, answer with the nearest tuned shape of the same op.",
            in_cache_key=False),
)
