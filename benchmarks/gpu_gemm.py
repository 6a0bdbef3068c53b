"""GPU GEMM benchmark: cuBLAS (torch.mm), Inductor max-autotune and tuneforge.gemm on CUDA tensors.

    python benchmarks/gpu_gemm.py [--shapes MxNxK ...] [--dtypes bfloat16 float16] [--quick]

For each shape and dtype, in processes of their own:
1. Inductor, torch.compile(a @ b, mode="max-autotune-no-cudagraphs"): the first call with empty
   TORCHINDUCTOR_CACHE_DIR and TRITON_CACHE_DIR (cold), then in another process with the same ones (warm);
2. tuneforge.gemm: the first call with empty TUNEFORGE_CACHE_DIR and TRITON_CACHE_DIR (cold tuning), the
   winner read from the records it wrote; then fresh processes with the same directories (warm: from
   before `import tuneforge` to the first tuned result); with redis-server on PATH, the cold process also
   writes to a Redis and processes with empty local directories read from it (fresh machine); each warm
   figure is the median of --warm-processes (3) processes, since one process carries the host's load of
   its moment (run 9: one case's every step 1.5x slower); beside them, as many fresh processes time their first
   full-size torch.mm ("cuB 1st ms"): cuBLAS's own first call at the shape, which a warm figure includes when
   cuBLAS is the pick (run 10: 16x4096x4096's call took 44-46 ms against 15-24 on the other shapes);
3. steady state, in the warm tuneforge process after its first call: every result checked against a
   float32 product on fresh random inputs (relative Frobenius error), then cuBLAS, Inductor's compiled
   function and tuneforge timed in interleaved rounds, one run of each system a round (CUDA events, the L2
   flushed before each run, the order rotated from round to round); a ratio is the median of the per-round
   ratios, a time the median of the system's runs.

Each "fresh process" is a fork of this driver taken right after `import torch` (no CUDA, Triton,
Inductor or tuneforge loaded yet): what a new process has after `import torch`, without paying the
~3 s import 4-5 times per case (--launch spawn starts real interpreters instead). First calls are timed
from when the inputs are on the GPU and cuBLAS's handle exists to torch.cuda.synchronize() after the call.

Progress goes to stderr, the children's own output (Inductor's autotuning tables...) to
gpu_gemm-children.log; the table, geometric means and targets to stdout; the figures to
benchmarks/results/gpu_gemm.json (gpu_gemm-subset.json for another set of cases), and all of it to $OUT/
where that is set (the device tool's output folder). A case takes 55-70 s on an H100 (run 9: Inductor's
cold and warm processes 17-27 s of it; --prepared adds one more cold process, --unstreamed another), so the
default 16 cases need about 16 minutes: give one call of at most 10 minutes a subset (--dtypes float16, --shapes). No
measurement starts after --budget-s (540 s), so such a call always ends with the table. Exit status 2 when
there is no CUDA GPU (or no torch/triton).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # run as a script, as the other benchmarks are
from gpu_common import (
    DEFAULT_DTYPES,
    DTYPES,
    MAX_ROUNDS,
    MIN_ROUNDS,
    MODE,
    QUICK_SHAPES,
    SHAPES,
    Row,
    Shape,
    accurate,
    child_main,
    evaluate_targets,
    finish_child,
    fmt,
    format_geomeans,
    format_phases,
    format_table,
    format_targets,
    geomeans,
    isolation_ratios,
    log,
    parse_shape,
    shape_text,
    summarize_steady,
    write_results,
)

EST_CASE_S = 60.0  # per case on an H100 (run 9: 55-70 s; Inductor's cold and warm processes 17-27 s of it)
TIMEOUTS = {"cold": 150.0, "warm": 90.0, "steady": 150.0}
REPO = Path(__file__).resolve().parent.parent


# ------------------------------------------------------------------------------------------ the driver

def kill_group(pid: int) -> None:
    """The child and whatever it started (Inductor's compile workers, tuneforge's worker) are one group."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def launch_fork(task: Row, log_path: Path) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setpgid(0, 0)
            atexit._clear()  # the driver's exit handlers (its temporary directory's clean-up) are not ours
            with open(log_path, "ab") as log_file:  # Inductor's autotuning tables and the like
                os.dup2(log_file.fileno(), 1)
                os.dup2(log_file.fileno(), 2)
            code = finish_child(task, lambda: child_main(task))
            atexit._run_exitfuncs()  # the child's own, as at a normal exit (e.g. tuneforge's remote flush)
        finally:
            os._exit(code)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)
    return pid


_spawned: list[subprocess.Popen[bytes]] = []  # kept, so that Popen never reaps what run_task waits for


def launch_spawn(task: Row, log_path: Path) -> int:
    task_file = Path(task["result"]).with_suffix(".task.json")
    task_file.write_text(json.dumps(task))
    with open(log_path, "ab") as log_file:
        _spawned.append(subprocess.Popen([sys.executable, __file__, "--child", str(task_file)],
                                         stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True))
    return _spawned[-1].pid


def run_task(task: Row, launch: str, tmp: Path, timeout_s: float) -> Row:
    """Run one measurement in a fresh process; {"failed": why} if it crashed or ran past timeout_s."""
    task = {**task, "result": str(tmp / f"result-{time.monotonic_ns()}.json")}
    pid = (launch_fork if launch == "fork" else launch_spawn)(task, child_log())
    deadline = time.monotonic() + timeout_s
    timed_out = False
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        if time.monotonic() > deadline:
            timed_out = True
            kill_group(pid)
            os.waitpid(pid, 0)
            break
        time.sleep(0.02)
    kill_group(pid)  # stragglers
    path = Path(task["result"])
    if not path.exists():  # a child that hung only at exit, after writing its result, still counts
        why = f"timed out after {timeout_s:.0f} s" if timed_out else "the process died without a result"
        return {"failed": f"{why} (see {child_log()})"}
    result: Row = json.loads(path.read_text())
    return result


def child_log() -> Path:
    """Where the children's own output goes: $OUT (the device tool brings it back) or benchmarks/results."""
    folder = Path(os.environ["OUT"]) if os.environ.get("OUT") else Path(__file__).resolve().parent / "results"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / "gpu_gemm-children.log"


def log_worker_profiles(folder: Path, what: str, top: int = 40) -> None:
    """The benchmark worker's profiles of a selection's jobs (autotune.worker_profile), merged, into the children's
    log: where the trials' time went (inputs, reference, checks, timing)."""
    import pstats

    files = sorted(folder.glob("worker-*.prof"))
    with child_log().open("a") as out:
        if not files:
            out.write(f"=== no worker profile for {what} (no job reached the worker?)\n")
            return
        out.write(f"=== profile of the benchmark worker's {len(files)} job(s), {what}\n")
        stats = pstats.Stats(*map(str, files), stream=out)
        stats.sort_stats("cumulative").print_stats(top)


def gpu_problem() -> str | None:
    """Why this machine cannot run the benchmark, or None. Leaves CUDA uninitialised: children fork after."""
    if importlib.util.find_spec("torch") is None:
        return "gpu_gemm: needs PyTorch with CUDA, and torch is not installed; run this on a GPU machine"
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")  # asks NVML: forked children can still use CUDA
    import torch

    if not torch.cuda.is_available():
        return (f"gpu_gemm: no CUDA GPU here (torch {torch.__version__}, CUDA build {torch.version.cuda}); "
                "this benchmark needs one: run it on a GPU machine")
    if importlib.util.find_spec("triton") is None:
        return "gpu_gemm: needs triton (Inductor's GPU backend and triton.testing.do_bench)"
    return None


def use_source_tree() -> None:
    """Without an installed tuneforge, the checkout's src/ (in this process and every child); its .pyc files
    are written now so that no first call pays for compiling tuneforge's modules."""
    import compileall

    if importlib.util.find_spec("tuneforge") is None and (REPO / "src" / "tuneforge").is_dir():
        sys.path.insert(0, str(REPO / "src"))
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), os.environ.get("PYTHONPATH")) if p)
    spec = importlib.util.find_spec("tuneforge")
    if spec is not None and spec.submodule_search_locations:
        compileall.compile_dir(next(iter(spec.submodule_search_locations)), quiet=1)


@contextlib.contextmanager
def redis_server(tmp: Path, wanted: bool) -> Iterator[str | None]:
    """A throw-away redis-server on a free loopback port; yields its URL, or None without one."""
    binary = shutil.which("redis-server")
    if not wanted or binary is None:
        yield None
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.1):
                break
            time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


class Runner:
    def __init__(self, args: argparse.Namespace, tmp: Path, redis_url: str | None, deadline: float) -> None:
        self.args, self.tmp, self.redis_url, self.deadline = args, tmp, redis_url, deadline

    def run(self, task: Row, what: str) -> Row:
        left = self.deadline - time.monotonic()
        if left < 5:
            return {"failed": "skipped: the run's time budget (--budget-s) is spent"}
        result = run_task(task, self.args.launch, self.tmp, min(TIMEOUTS[what], left))
        if "failed" in result and left < TIMEOUTS[what] and "timed out" in result["failed"]:
            result["failed"] += f": the run's time budget (--budget-s) left it {left:.0f} of its {TIMEOUTS[what]:.0f} s"
        return result

    def case(self, shape: Shape, dtype: str, label: str) -> Row:
        row: Row = {"shape": shape_text(shape), "dtype": dtype, "notes": []}
        notes: list[str] = row["notes"]
        base = self.tmp / f"{row['shape']}-{dtype}"
        inductor_env = {"TORCHINDUCTOR_CACHE_DIR": str(base / "inductor"), "TRITON_CACHE_DIR": str(base / "ind-triton")}
        # verbose: the cold selection's table (every candidate's tuning times, the pick's confidence) goes to the
        # children's log, so that a pick slower than cuBLAS in steady state can be told from its tuning figures
        tf_env = {"TUNEFORGE_CACHE_DIR": str(base / "tuneforge"), "TRITON_CACHE_DIR": str(base / "tf-triton"),
                  "TORCHINDUCTOR_CACHE_DIR": str(base / "tf-inductor"), "TUNEFORGE_AUTOTUNE_VERBOSE": "1",
                  "TUNEFORGE_AUTOTUNE_LOG": str(base / "autotune.jsonl")}
        if self.args.pool_start_method:  # how tuneforge's build pool starts its workers (compile.start_method)
            tf_env["TUNEFORGE_COMPILE_START_METHOD"] = self.args.pool_start_method
        remote = ({"TUNEFORGE_REMOTE_URL": self.redis_url, "TUNEFORGE_REMOTE_ALLOW_UNSIGNED": "1"}
                  if self.redis_url else {})
        common: Row = {"shape": list(shape), "dtype": dtype, "seed": self.args.seed, "profile": self.args.profile}

        def own_caches(name: str) -> dict[str, str]:
            """tuneforge's environment with empty caches and an autotune log of its own, for a variant's run."""
            return {**tf_env, "TUNEFORGE_CACHE_DIR": str(base / name), "TRITON_CACHE_DIR": str(base / f"{name}-triton"),
                    "TUNEFORGE_AUTOTUNE_LOG": str(base / f"{name}.jsonl")}

        def first(result: Row, what: str, field: str, scale: float) -> None:
            failed = result.get("failed") or result.get("tuneforge_failed")
            if failed:
                notes.append(f"{what}: {failed.strip().splitlines()[-1]}")
            else:
                row[field] = result["first_s"] * scale
                if not accurate(result.get("error"), dtype):
                    notes.append(f"{what}: wrong result (relative error {result.get('error')})")
            unit = "s" if scale == 1 else "ms"
            steps = result.get("steps")
            if steps and scale != 1:  # a first call's steps (import, resolve, call, sync), for the warm ones
                row[field.replace("_ms", "_steps")] = steps
            log(f"{label} {what}: " + (f"{row[field]:.3g} {unit}" if field in row else "failed") +
                (f" ({', '.join(f'{k} {v}' for k, v in steps.items())})" if steps and scale != 1 else ""))

        gathered: dict[str, list[float]] = {}

        def gather(field: str) -> None:
            """Keep a repeated first call's figure (the row holds the latest until the median replaces it)."""
            if field in row:
                gathered.setdefault(field, []).append(row.pop(field))

        if not self.args.skip_inductor:
            first(self.run({**common, "kind": "inductor", "env": inductor_env}, "cold"), "Inductor cold",
                  "inductor_cold_s", 1.0)
        cold_env = {**tf_env, **remote}
        if self.args.profile:  # the worker's side of the cold selection too: a cProfile per job it ran
            cold_env["TUNEFORGE_AUTOTUNE_WORKER_PROFILE"] = str(base / "worker-profiles")
        cold = self.run({**common, "kind": "tuneforge", "env": cold_env, "flush_remote": bool(remote),
                         "what": "cold"}, "cold")
        if self.args.profile:
            log_worker_profiles(base / "worker-profiles", f"{label} cold")
        first(cold, "tuneforge cold", "tuneforge_cold_s", 1.0)
        row["cold_phases"], row["cold_times"], row["cold_streamed"] = (cold.get(k) for k in ("phases", "times",
                                                                                           "streamed"))
        # the same cold selection in a program that called tuneforge.prepare("cuda") early; unstreamed: the same
        # with autotune.stream off (the choices checked and timed only once all are built)
        for run, stream in (("prepared", "auto"), ("unstreamed", "off")):
            if self.args.prepared and (run == "prepared" or self.args.unstreamed):
                env = {**own_caches(run), "TUNEFORGE_AUTOTUNE_STREAM": stream}
                result = self.run({**common, "kind": "tuneforge", "env": env, "what": f"cold {run}",
                                   "prepare_s": self.args.prepared}, "cold")
                first(result, f"tuneforge cold, {run}", f"{run}_cold_s", 1.0)
                row[f"{run}_phases"], row[f"{run}_streamed"] = result.get("phases"), result.get("streamed")
        if self.args.in_process:  # the same cold selection with its trials in the tuning process: isolation's cost
            inproc_env = {**own_caches("inproc"), "TUNEFORGE_AUTOTUNE_ISOLATE": "0"}
            inproc = self.run({**common, "kind": "tuneforge", "env": inproc_env, "what": "cold in-process"}, "cold")
            first(inproc, "tuneforge cold in-process", "inprocess_cold_s", 1.0)
            row["inprocess_phases"], row["inprocess_times"] = inproc.get("phases"), inproc.get("times")
            row.update(isolation_ratios(row))
        if not self.args.skip_inductor:
            first(self.run({**common, "kind": "inductor", "env": inductor_env}, "warm"), "Inductor warm",
                  "inductor_warm_ms", 1e3)
        if remote:
            for i in range(self.args.warm_processes):  # empty local caches each time: only Redis is warm
                fresh = {**own_caches(f"fresh{i}"), **remote}
                first(self.run({**common, "kind": "tuneforge", "env": fresh, "what": "fresh machine + Redis"}, "warm"),
                      "tuneforge fresh machine + Redis", "redis_warm_ms", 1e3)
                gather("redis_warm_ms")
        for _ in range(self.args.warm_processes):  # a fresh process's first full-size torch.mm: what cuBLAS's own
            # first call at this shape costs (its heuristics, lazily loaded kernels), which a warm figure includes
            # whenever cuBLAS is the pick
            first(self.run({**common, "kind": "cublas", "env": tf_env}, "warm"), "cuBLAS first call", "cublas_first_ms",
                  1e3)
            gather("cublas_first_ms")
        for _ in range(self.args.warm_processes - 1):  # first calls only; the steady process gives the last one
            first(self.run({**common, "kind": "tuneforge", "env": tf_env, "what": "warm"}, "warm"), "tuneforge warm",
                  "tuneforge_warm_ms", 1e3)
            gather("tuneforge_warm_ms")
        steady_task = {**common, "kind": "tuneforge", "env": tf_env, "steady": True, "inductor_env": inductor_env,
                       "skip_inductor": self.args.skip_inductor,
                       "what": "warm",
                       "rounds": self.args.rounds, "rep_ms": self.args.rep_ms}
        warm = self.run(steady_task, "steady")
        first(warm, "tuneforge warm", "tuneforge_warm_ms", 1e3)
        gather("tuneforge_warm_ms")
        for field in ("redis_warm_ms", "tuneforge_warm_ms", "cublas_first_ms"):
            if gathered.get(field):  # one process's figure carries the host's load of the moment: the median
                row[field], row[field.replace("_ms", "_all_ms")] = statistics.median(gathered[field]), gathered[field]
        if "rounds" not in warm:  # the process died (a sticky CUDA error?): cuBLAS and Inductor without tuneforge
            retry = self.run({**steady_task, "without_tuneforge": True}, "steady")
            warm = {**warm, **{key: retry[key] for key in ("rounds", "errors", "failures") if key in retry}}
            if "rounds" in retry:
                warm["failures"] = {**warm["failures"], "tuneforge": "not timed: its process failed"}
        row["winner"] = cold.get("pick") or cold.get("winner") or warm.get("winner")
        row["entry"] = warm.get("entry") or cold.get("entry")
        if row["winner"] is None and "tuneforge_cold_s" in row:
            notes.append("TODO(lead): tuneforge left no record of its decision in its cache; expose the winner "
                         "(records, or an attribute of the op) so that the benchmark can show it")
        if "rounds" in warm:
            row.update(summarize_steady(warm["rounds"], shape))
            row["errors"] = warm["errors"]
            notes.extend(f"steady {name}: {why}" for name, why in warm["failures"].items())
        log(f"{label} steady: cuBLAS {fmt(row.get('cublas_tflops'), '.1f')} TFLOP/s, tuneforge/cuBLAS "
            f"{fmt(row.get('tuneforge_vs_cublas'), '.3f')}x, tuneforge/Inductor "
            f"{fmt(row.get('tuneforge_vs_inductor'), '.3f')}x")
        return row


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--shapes", nargs="+", type=parse_shape, help="MxNxK shapes instead of the default 8")
    parser.add_argument("--dtypes", nargs="+", choices=DTYPES, default=DEFAULT_DTYPES)
    parser.add_argument("--quick", action="store_true", help="2 shapes (4096^3, 3000x1000x700), the first dtype")
    parser.add_argument("--rounds", type=int, default=5, help="steady-state timing: --rounds x --rep-ms of runs "
                        f"per system, in interleaved rounds of one run each ({MIN_ROUNDS}-{MAX_ROUNDS} rounds)")
    parser.add_argument("--rep-ms", type=float, default=40.0, help="see --rounds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--budget-s", type=float, default=540.0, help="stop starting measurements after this")
    parser.add_argument("--launch", choices=["fork", "spawn"], default="fork")
    parser.add_argument("--no-redis", action="store_true", help="skip the fresh-machine-with-Redis figure")
    parser.add_argument("--warm-processes", type=int, default=3, metavar="N",
                        help="fresh processes per warm figure (first call, fresh machine + Redis): the median of N")
    parser.add_argument("--prepared", type=float, default=0.0, metavar="S",
                        help="also tune each case cold in a program that called tuneforge.prepare('cuda') S seconds "
                             "before (its other work)")
    parser.add_argument("--unstreamed", action="store_true",
                        help="with --prepared: also tune each case so with autotune.stream off (what checking and "
                             "timing the choices while others compile saves)")
    parser.add_argument("--skip-inductor", action="store_true",
                        help="no Inductor (a quicker run: its cold and warm first calls take 15-20 s a case)")
    parser.add_argument("--in-process", action="store_true",
                        help="also tune each case cold with autotune.isolate off (isolation's overhead)")
    parser.add_argument("--pool-start-method", choices=["fork", "spawn", "forkserver"],
                        help="tuneforge's build pool starts its workers so (compile.start_method; default: fork)")
    parser.add_argument("--profile", action="store_true",
                        help="profile tuneforge's first calls, and the worker's jobs of the cold one (cProfile, "
                             "into the children's log)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.warm_processes < 1:
        parser.error(f"--warm-processes must be 1 or more, not {args.warm_processes}")
    return args


def cases(args: argparse.Namespace) -> list[tuple[Shape, str]]:
    shapes = args.shapes or (QUICK_SHAPES if args.quick else SHAPES)
    dtypes = args.dtypes[:1] if args.quick else args.dtypes
    return [(shape, dtype) for shape in shapes for dtype in dtypes]


def report(meta: Row, rows: list[Row]) -> Row:
    means, targets = geomeans(rows), evaluate_targets(rows)
    print(f"\n{meta['gpu']} (sm_{meta['capability'].replace('.', '')}, {meta['sms']} SMs, "
          f"{meta['l2_mib']:.0f} MiB L2), driver {meta['driver']}, torch {meta['torch']} (CUDA {meta['cuda']}), "
          f"triton {meta['triton']}")
    print("ratios are speed-ups (> 1: faster); Ind = Inductor " + MODE + ", TF = tuneforge; '-': not measured")
    print(format_table(rows))
    for row in rows:
        for note in row["notes"]:
            print(f"  {row['shape']} {row['dtype']}: {note}")
    print(format_phases(rows))
    print(format_geomeans(means))
    print("targets (issue 12):")
    print(format_targets(targets))
    return {"geomeans": means, "targets": targets}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:  # --launch spawn: a real fresh interpreter
        task = json.loads(Path(args.child).read_text())
        return finish_child(task, lambda: child_main(task))
    problem = gpu_problem()
    if problem:
        print(problem, file=sys.stderr)
        return 2
    use_source_tree()
    todo = cases(args)
    name = "gpu_gemm" if todo == cases(parse_args([])) else "gpu_gemm-subset"
    started = time.monotonic()
    child_log().write_text("")
    with tempfile.TemporaryDirectory(prefix="gpu-gemm-bench-") as scratch:
        tmp = Path(scratch)
        meta = run_task({"kind": "probe", "env": {}}, args.launch, tmp, 120)
        if "failed" in meta and args.launch == "fork":
            log(f"a forked child could not use the GPU ({meta['failed'].strip().splitlines()[-1]}): spawning instead")
            args.launch = "spawn"
            meta = run_task({"kind": "probe", "env": {}}, args.launch, tmp, 120)
        if "failed" in meta:
            log(f"gpu_gemm: the GPU probe failed:\n{meta['failed']}")
            return 1
        log(f"{meta['gpu']}, driver {meta['driver']}, torch {meta['torch']}, triton {meta['triton']}; "
            f"{len(todo)} cases, about {EST_CASE_S * len(todo):.0f} s (budget {args.budget_s:.0f} s)")
        with redis_server(tmp, not args.no_redis) as url:
            if url is None:
                log("no redis-server on PATH (or --no-redis): the fresh-machine-with-Redis figure is skipped")
            runner = Runner(args, tmp, url, started + args.budget_s)
            rows: list[Row] = []
            for i, (shape, dtype) in enumerate(todo, 1):
                label = f"[{time.monotonic() - started:5.0f} s] {i}/{len(todo)} {shape_text(shape)} {dtype}"
                if runner.deadline - time.monotonic() < 20:  # too little left for a case's first step
                    rows.append({"shape": shape_text(shape), "dtype": dtype, "notes": ["skipped: time budget spent"]})
                else:
                    rows.append(runner.case(shape, dtype, label))
                payload: Row = {"meta": {**meta, "launch": args.launch, "redis": url is not None}, "cases": rows}
                write_results(payload, name)  # after every case: a run cut short keeps what it measured
    payload.update(report(meta, rows))
    for path in write_results(payload, name):
        print(f"wrote {path}")
    print(f"total {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
