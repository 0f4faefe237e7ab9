#!/usr/bin/env bash
# Session 64's split probe (split.patch beside this file): where the single-token GEMV's own 1.25-1.45 µs a kernel
# around its dependency wait goes, on bench_w4a16's prepared rows (each input prepared once, before the timing).
#   NIBBLE_X_SPLIT=1: the first group's input loaded before the wait (valid only there: x is static);
#   NIBBLE_X_SPLIT=2: plain outputs without the warps' meeting (each warp stores its own partial sums: wrong);
#   NIBBLE_X_SPLIT=3: both.
#   on the CPU machine: git apply docs/results/s64/split.patch && bash docs/results/s62/bundle.sh && git checkout src/
#   on the device:      tar -xJf devrun.tar.xz && bash docs/results/s64/run_split.sh "$OUT"
set -uo pipefail
DEST=$1
export LD_LIBRARY_PATH=$PWD/devrun/lib:${LD_LIBRARY_PATH:-}
B=devrun/bin/bench_w4a16
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$DEST/gpu.txt"
devrun/bin/nibble_tests --gtest_brief=1 \
  --gtest_filter='Cuda.W4A16Sweep*:Cuda.W4A16SingleToken*:Cuda.W4A16GroupSizes*:Cuda.W4A16WithProgrammatic*:Cuda.GemvFusion*:Cuda.W4A16F32*' \
  2>&1 | tail -2 | tee "$DEST/tests.txt"
for r in 1 2; do
  for d in 0 1 2 3; do
    echo "== NIBBLE_X_SPLIT=$d round $r"
    NIBBLE_X_SPLIT=$d $B --ms 1 --skip-cublas --no-torch 2>&1
  done
done >"$DEST/stack.txt" 2>&1
grep -E "^==|^fused|M=1 prepared|prepared  |read bandwidth" "$DEST/stack.txt"
