#!/usr/bin/env bash
# One call on a GPU machine that has torch, Triton and nvcc but not tuneforge installed: what the machine
# is, the gpu-marked tests, then benchmarks/gpu_gemm.py. Run from the repository root:
#
#     bash benchmarks/gpu_device_run.sh [TESTS_S [BENCH_S [gpu_gemm.py arguments...]]]
#
# TESTS_S (default 150) and BENCH_S (default 300) bound the two parts; 0 skips a part; GPU_TESTS (space
# separated) runs those test files' gpu tests instead of every file's; RECORD_GPU_SPACE=MxNxK first records
# that shape's GEMM space for the search replays (benchmarks/record_spaces.py --device cuda, into $OUT);
# BUILD_POOL_ARGS runs benchmarks/gpu_build_pool.py with those arguments before the benchmark. Logs and the
# benchmark's JSON go to $OUT (the device tool's output folder) or benchmarks/results.
# Optional, not tracked (.git/info/exclude; benchmarks/gpu_carry.sh makes them): .gpucarry/whl/*.whl (tuneforge's pure dependencies the machine
# lacks, e.g. platformdirs, redis, zstandard) and .gpucarry/redis/redis-server (for the fresh-machine-with-Redis
# figure; with .gpucarry/redis/lib/ holding the libraries ldd lists for it, other than libc's own).
set -u
tests_s=${1:-150}
bench_s=${2:-300}
shift $(($# < 2 ? $# : 2))
export PYTHONUNBUFFERED=1
OUT=${OUT:-$PWD/benchmarks/results}
export OUT
mkdir -p "$OUT"
py=${PYTHON:-python3}

if compgen -G ".gpucarry/whl/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/tf-site \
        .gpucarry/whl/*.whl && export PYTHONPATH=/tmp/tf-site
fi
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
if [ -x .gpucarry/redis/redis-server ]; then
    redis_dir=$PWD/.gpucarry/redis
    if [ -d .gpucarry/redis/lib ]; then  # shared libraries the machine lacks (ldd here), for redis-server alone
        redis_dir=/tmp/tf-redis
        mkdir -p "$redis_dir"
        printf '#!/bin/sh\nLD_LIBRARY_PATH=%s exec %s "$@"\n' "$PWD/.gpucarry/redis/lib" \
            "$PWD/.gpucarry/redis/redis-server" >"$redis_dir/redis-server"
        chmod +x "$redis_dir/redis-server"
    fi
    if "$redis_dir/redis-server" --version >/dev/null 2>&1; then export PATH=$redis_dir:$PATH
    else echo "the carried redis-server does not run here: no Redis figure"; fi
fi

{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
    "$py" -c "import sys, torch, triton, numpy; print(sys.version.split()[0], 'torch', torch.__version__, \
'cuda', torch.version.cuda, 'triton', triton.__version__, 'numpy', numpy.__version__, \
'dont_write_bytecode', sys.flags.dont_write_bytecode)"
    command -v nvcc && nvcc --version | tail -2
    command -v redis-server && redis-server --version
    nproc
} 2>&1 | tee "$OUT/env.txt"

status=0
if [ "$tests_s" -gt 0 ]; then
    if [ -n "${GPU_TESTS:-}" ]; then read -r -a files <<<"$GPU_TESTS"  # some test files (or node ids) only
    else mapfile -t files < <(grep -l "pytest.mark.gpu" tests/test_*.py); fi
    timeout -k 5 "$tests_s" "$py" -m pytest -m gpu -q -p no:cacheprovider --timeout 90 "${files[@]}" \
        >"$OUT/gpu_tests.log" 2>&1
    status=$?
    grep -E "passed|failed|error" "$OUT/gpu_tests.log" | tail -3
    grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -40
    echo "tests: exit $status"
fi
if [ -n "${RECORD_GPU_SPACE:-}" ]; then  # a GPU recording for the search replays (issue 14), into $OUT
    timeout -k 5 "${RECORD_GPU_SPACE_S:-300}" "$py" benchmarks/record_spaces.py --device cuda \
        --shapes "$RECORD_GPU_SPACE" --output "$OUT" 2>&1 | tail -5
fi
if [ -n "${BUILD_POOL_ARGS:-}" ]; then  # benchmarks/gpu_build_pool.py: a cold build pool by start method, e.g. "--cuda
    # --start-methods fork forkserver spawn" (its table; the JSON into $OUT)
    read -r -a pool_args <<<"$BUILD_POOL_ARGS"
    timeout -k 5 "${BUILD_POOL_S:-240}" "$py" benchmarks/gpu_build_pool.py "${pool_args[@]}" 2>&1 \
        | tee "$OUT/gpu_build_pool.log" | tail -8
fi
if [ "$bench_s" -gt 0 ]; then
    timeout -k 10 "$bench_s" "$py" benchmarks/gpu_gemm.py --budget-s $((bench_s - 40)) "$@" 2>&1 \
        | tee "$OUT/gpu_gemm.log" | tail -70
    bench=${PIPESTATUS[0]}
    echo "benchmark: exit $bench"
    [ "$bench" -eq 0 ] || status=$bench
fi
exit "$status"
