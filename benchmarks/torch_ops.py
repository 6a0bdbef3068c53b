"""tuneforge.torch against torch's own: the operators' per-call overhead, and a small MLP under torch.compile.

1. Overhead: ``tuneforge.torch.mm(a, b)`` eager, and tuneforge::mm inside an Inductor-compiled graph, against
   calling the tuned layout's kernel directly (``gemm_into`` into a new matrix), timed side by side. In the graph,
   per product: (a chain of L products compiled - a trivial compiled graph - L direct calls) / L.
2. MLP (3 linear layers, ReLU between, inference steps) in fresh processes: torch.compile(mode="max-autotune")
   against tuneforge's ops, under Inductor (MatmulRouter), under tuneforge's light backend, and under the light
   backend with the weights packed once (tuneforge.torch.pack_linears; beside it, max-autotune with Inductor's
   freezing, which also takes the weights as constants): steady step time, and time from process
   start to the first compiled step, cold (empty Inductor and tuneforge caches) and warm.

    python benchmarks/torch_ops.py [--batches 32,128,512] [--width 1024] [--quick]

Children run without OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE (blas_env), so numpy's OpenBLAS runs its own kernels.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from blas_env import blas_report, child_env
from common import side_by_side, write_results

VARIANTS = ("max-autotune", "max-autotune-frozen", "tuneforge-inductor", "tuneforge-light", "tuneforge-packed")
CHAIN = 20


def overhead(size: int, rounds: int) -> dict[str, float]:
    """Microseconds per call of each way to run one size^3 float32 product (side by side)."""
    import torch

    import tuneforge
    import tuneforge.torch as tft
    from tuneforge.kernels.gemm import gemm_into
    from tuneforge.kernels.gemm.torch_cpu import new_matrix

    a, w = torch.randn(size, size), torch.randn(size, size) / size**0.5

    def direct_chain(x: Any) -> Any:
        for _ in range(CHAIN):
            out = new_matrix(size, size, torch.float32)
            gemm_into(x, w, out)
            x = out
        return x

    def op_chain(x: Any) -> Any:
        for _ in range(CHAIN):
            x = tft.mm(x, w)
        return x

    with torch.no_grad():
        compiled = torch.compile(op_chain, fullgraph=True)
        trivial = torch.compile(lambda x: x + 0, fullgraph=True)
        for _ in range(2):  # tune and compile before timing
            compiled(a), trivial(a), tft.mm(a, w), tuneforge.gemm(a, w), direct_chain(a)
        calls = {
            "direct": lambda: gemm_into(a, w, new_matrix(size, size, torch.float32)),
            "tuneforge.torch.mm": lambda: tft.mm(a, w),
            "torch.ops.tuneforge.mm": lambda: torch.ops.tuneforge.mm(a, w),
            "tuneforge.gemm": lambda: tuneforge.gemm(a, w),
            "direct chain": lambda: direct_chain(a),
            "compiled chain": lambda: compiled(a),
            "trivial graph": lambda: trivial(a),
        }
        ms = side_by_side(calls, rounds, burst_s=0.05)
    us = {name: value * 1e3 for name, value in ms.items()}
    us["compiled, per product"] = (us["compiled chain"] - us["trivial graph"]) / CHAIN
    us["direct, per product in the chain"] = us["direct chain"] / CHAIN
    return us


MLP_CHILD = r"""
import json, os, sys, time
start = float(os.environ["BENCH_START"])
variant, batch, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                            torch.nn.ReLU(), torch.nn.Linear(width, width)).eval()
x = torch.randn(batch, width)
if variant.startswith("max-autotune"):
    if variant == "max-autotune-frozen":  # weights as constants, as pack_linears takes them: Inductor's freezing
        import torch._inductor.config
        torch._inductor.config.freezing = True
    compiled = torch.compile(model, mode="max-autotune")
    context = None
else:
    import tuneforge.torch as tft
    if variant == "tuneforge-inductor":
        from torch._inductor import config
        config.post_grad_custom_pre_pass = tft.MatmulRouter()
        compiled = torch.compile(model)
    else:
        reference = model
        if variant == "tuneforge-packed":  # the weights copied and packed once (inference): a model of its own
            import copy
            model = copy.deepcopy(reference)
            tft.pack_linears(model)
        compiled = torch.compile(model, backend=tft.backend())
        model = reference
with torch.no_grad():
    y = compiled(x)
    first = time.time() - start
    torch.testing.assert_close(y, model(x), rtol=1e-3, atol=1e-3)
    for _ in range(5):
        compiled(x)
    steps = []
    for _ in range(30):
        t = time.perf_counter(); compiled(x); steps.append(time.perf_counter() - t)
steps.sort()
print(json.dumps({"first_step_s": first, "step_ms": steps[len(steps) // 2] * 1e3}))
"""


def mlp_child(variant: str, batch: int, width: int, caches: dict[str, str]) -> dict[str, Any]:
    env = child_env(None, "auto", {"TUNEFORGE_CACHE_DIR": caches["tuneforge"],
                                   "TORCHINDUCTOR_CACHE_DIR": caches["inductor"], "BENCH_START": repr(time.time())})
    proc = subprocess.run([sys.executable, "-c", MLP_CHILD, variant, str(batch), str(width)], env=env,
                          capture_output=True, text=True, cwd=caches["tuneforge"])
    if proc.returncode != 0:
        raise SystemExit(f"child {variant} batch {batch} failed:\n{proc.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


def mlp(batches: list[int], width: int) -> list[dict[str, Any]]:
    rows = []
    for batch in batches:
        row: dict[str, Any] = {"batch": batch}
        for variant in VARIANTS:
            root = Path(tempfile.mkdtemp(prefix="tuneforge-bench-mlp-"))
            caches = {"tuneforge": str(root / "tuneforge"), "inductor": str(root / "inductor")}
            os.makedirs(caches["tuneforge"])
            try:
                cold = mlp_child(variant, batch, width, caches)
                warm = mlp_child(variant, batch, width, caches)
            finally:
                shutil.rmtree(root, ignore_errors=True)
            row[variant] = {"cold_s": cold["first_step_s"], "warm_s": warm["first_step_s"],
                            "step_ms": statistics.median([cold["step_ms"], warm["step_ms"]])}
            print(f"  batch {batch:4d} {variant:20s} first step cold {cold['first_step_s']:6.2f} s, warm "
                  f"{warm['first_step_s']:6.2f} s; step {row[variant]['step_ms']:.3f} ms", flush=True)
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", default="32,128,512")
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--size", type=int, default=64, help="the overhead's square product")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="overhead only, fewer rounds")
    parser.add_argument("--child-overhead", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_overhead:
        print(json.dumps({"blas": blas_report(with_torch=True), "us": overhead(args.size, args.rounds)}))
        return
    cache = tempfile.mkdtemp(prefix="tuneforge-bench-")
    try:
        env = child_env(None, "auto", {"TUNEFORGE_CACHE_DIR": cache, "TORCHINDUCTOR_CACHE_DIR": cache + "/inductor"})
        rounds = 5 if args.quick else args.rounds
        proc = subprocess.run([sys.executable, __file__, "--child-overhead", "--size", str(args.size), "--rounds",
                               str(rounds)], env=env, capture_output=True, text=True, cwd=cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    if proc.returncode != 0:
        raise SystemExit(f"overhead child failed:\n{proc.stderr[-3000:]}")
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    us = found["us"]
    print(f"BLAS in the child: {found['blas']}")
    print(f"Per-call overhead, {args.size}^3 float32 (side by side, median of {rounds} rounds), us:")
    for name, value in us.items():
        print(f"  {name:34s} {value:9.2f}")
    eager = us["tuneforge.torch.mm"] - us["direct"]
    graph = us["compiled, per product"] - us["direct, per product in the chain"]
    print(f"  eager op over direct: {eager:+.2f} us (target <= 3); in a compiled graph: {graph:+.2f} us (target <= 1)")
    results: dict[str, Any] = {"overhead_us": us, "eager_overhead_us": eager, "graph_overhead_us": graph,
                               "blas": found["blas"]}
    if not args.quick:
        batches = [int(b) for b in args.batches.split(",")]
        print(f"MLP, 3 x Linear({args.width}, {args.width}) with ReLU, inference, fresh processes:")
        rows = mlp(batches, args.width)
        results["mlp"] = rows
        print(f"{'batch':>5} {'variant':20s} {'step x':>8} {'cold x':>8} {'warm x':>8} {'frozen x':>8}   (ratios "
              "against max-autotune: step = its step time / ours, first step = ours / its; frozen x: the step "
              "against max-autotune with freezing)")
        for row in rows:
            ref, frozen = row["max-autotune"], row["max-autotune-frozen"]
            for variant in VARIANTS[1:]:
                ours = row[variant]
                print(f"{row['batch']:5d} {variant:20s} {ref['step_ms'] / ours['step_ms']:8.2f} "
                      f"{ours['cold_s'] / ref['cold_s']:8.2f} {ours['warm_s'] / ref['warm_s']:8.2f} "
                      f"{frozen['step_ms'] / ours['step_ms']:8.2f}")
        print("targets: step >= 1.0x, first compiled step <= 0.5x of max-autotune's, cold and warm")
    write_results("torch_ops", results)


if __name__ == "__main__":
    main()
