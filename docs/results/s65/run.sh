#!/usr/bin/env bash
# session 65: split probe, then the gpu check (Cuda* tests + full bench_w4a16)
set -uo pipefail
OUT=$1
tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
mkdir -p "$OUT/split"
for r in 1 2; do
  for d in 0 1 2 3 4; do
    echo "== NIBBLE_X_SPLIT=$d round $r"
    NIBBLE_X_SPLIT=$d devrun/bin/bench_w4a16_split --ms 1 --skip-cublas --no-torch 2>&1
  done
done >"$OUT/split/stack.txt" 2>&1
grep -E "^==|^fused|M=1 prepared|prepared  |read bandwidth" "$OUT/split/stack.txt" | head -60
date
bash scripts/device-check.sh --run "$OUT" gpu 2>&1 | tail -60
date
