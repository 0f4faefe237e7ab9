#!/usr/bin/env bash
# Session 85, second call (not run: no machine came, and then the device time ran out): GGUF Q8_0 matrices now come with an exact format (int8_g32_sym), which the GPU forward has
# no kernel for, so they must still load dense there. The GPU forward's GGUF tests (the Q4_1 file's head is Q8_0),
# the yardstick's, and `nibble run --device cuda` against `--device cpu` (greedy) on the Q4_1 and Q4_K_M files (one and three Q8_0 matrices; the bundle has no Q8_0 file).
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
timeout 300 devrun/bin/nibble_tests --gtest_filter='Cuda.GpuForward*:CudaEval*' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$OUT/tests.txt" | cut -c1-220 | head -20
for f in Q4_1 Q4_K_M; do
  m=devrun/models/stories260K/gguf/stories260K-$f.gguf
  for d in cpu cuda; do
    echo "$f $d: $($N run --model $m --prompt "Once upon a time" -n 40 --device $d 2>/dev/null | tr '\n' ' ' | cut -c1-300)"
  done
done | tee "$OUT/run.txt"
