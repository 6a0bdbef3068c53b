#!/usr/bin/env bash
# Prepare .gpucarry/ (git-ignored through .git/info/exclude) for a call of the device tool, run from the
# repository root on the machine that makes the call:
#
#     bash benchmarks/gpu_carry.sh [PYTHON_VERSION]      # default 3.12, the GPU machines' Python
#
# - .gpucarry/whl/: wheels of tuneforge's dependencies that the GPU machines' image lacks (platformdirs, and
#   redis + zstandard for the remote tier), for that Python; gpu_device_run.sh installs them there;
# - .gpucarry/redis/: this machine's redis-server and, in lib/, the shared libraries ldd lists for it other than
#   libc's, libstdc++'s and libgcc's (the image had neither redis-server nor liblzf/libjemalloc in run 10), for
#   the fresh-machine-with-Redis figure.
# Then name .gpucarry in the call's carry list.
set -euo pipefail
cd "$(dirname "$0")/.."
python_version=${1:-3.12}
grep -qx "/.gpucarry/" .git/info/exclude 2>/dev/null || echo "/.gpucarry/" >>.git/info/exclude
rm -rf .gpucarry
mkdir -p .gpucarry/whl .gpucarry/redis/lib
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$python_version" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .gpucarry/whl platformdirs redis zstandard
if redis=$(command -v redis-server); then
    cp "$redis" .gpucarry/redis/
    ldd "$redis" | awk '/=> \// {print $3}' | grep -v -E '/(libc|libm|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so' \
        | while read -r lib; do cp -L "$lib" .gpucarry/redis/lib/; done
else
    echo "no redis-server here: the device run will skip the Redis figure" >&2
fi
du -sh .gpucarry
ls .gpucarry/whl
