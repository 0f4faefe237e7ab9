#!/usr/bin/env bash
# Compiles the device code of every CUDA source for one more GPU architecture (cubin only, nothing is
# linked or kept), so that a build for that architecture cannot regress unnoticed on machines that
# build sm_90a alone. The CudaCompilesForSm80 test runs it (tests/CMakeLists.txt).
# Usage: scripts/check-cuda-arch.sh NVCC ARCH SOURCE_DIR
set -euo pipefail
nvcc=$1 arch=$2 src=$3
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
fail=0
n=0
for f in "$src"/src/backend/cuda/*.cu; do
  n=$((n + 1))
  if ! "$nvcc" -std=c++17 -O3 -arch="$arch" -cubin -DNIBBLE_HAVE_CUDA=1 -I "$src/include" -I "$src/src" \
       -o "$out/$(basename "$f").cubin" "$f" >"$out/log" 2>&1; then
    echo "FAILED for $arch: $f"
    cat "$out/log"
    fail=1
  fi
done
[ "$n" -gt 0 ] || { echo "no CUDA sources under $src/src/backend/cuda"; exit 1; }
[ "$fail" -eq 0 ] && echo "$n CUDA sources compile for $arch"
exit "$fail"
