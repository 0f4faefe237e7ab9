#!/usr/bin/env bash
# Session 81, first call: groups of 32 at 17..256 tokens on the wgmma kernel (WeightStream<1, 1, 2>: a chunk of two
# groups is the unit, each lane decodes with its own group's scale/min), full bundle at the working tree.
#  1. the W4A16 tests (every dispatch path at groups of 32, the new g32 wgmma cases);
#  2. bench_w4a16 --group 32 at 17..128 tokens, bf16 and fp16: the wgmma kernel against NIBBLE_W4A16_WGMMA=0 (the
#     path before this change: the small-M kernel's rounded path; bf16 beyond 64 tokens dequantize + cuBLAS),
#     alternated twice;
#  3. on an H200 only: issue 6's stack (groups of 128, torch and cuBLAS beside) and the 8B decode;
#  4. every other Cuda* test.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
timeout 150 devrun/bin/nibble_tests --gtest_filter='Cuda.W4A16*' >"$OUT/w4a16_tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|worst" "$OUT/w4a16_tests.txt" | cut -c1-200 | head -30
echo "w4a16 tests done at $(( $(date +%s) - t0 )) s"
B=devrun/bin/bench_w4a16
for r in 1 2; do
  for v in wgmma small; do
    e=1; [ $v = small ] && e=0
    NIBBLE_W4A16_WGMMA=$e timeout 60 $B --group 32 --ms 17,24,32,64,128 --skip-cublas --no-torch \
      >"$OUT/g32_bf16_${v}_$r.txt" 2>&1
    grep -E "^fused|^unfused" "$OUT/g32_bf16_${v}_$r.txt" | sed "s/^/$v bf16 /"
  done
done
for v in wgmma small; do
  e=1; [ $v = small ] && e=0
  NIBBLE_W4A16_WGMMA=$e timeout 60 $B --group 32 --act fp16 --ms 24,64,128 --skip-cublas --no-torch \
    >"$OUT/g32_f16_${v}.txt" 2>&1
  grep -E "^fused" "$OUT/g32_f16_${v}.txt" | sed "s/^/$v f16 /"
done
echo "bench done at $(( $(date +%s) - t0 )) s"
if grep -q H200 "$OUT/gpu.txt"; then
  timeout 120 $B >"$OUT/stack_g128.txt" 2>&1
  grep -E "^fused|^unfused|^M=1 prepared|read bandwidth|torch|cuBLAS" "$OUT/stack_g128.txt" | head -30
  timeout 150 scripts/device-check.sh --run "$OUT" decode 2>&1 | tail -8
  echo "h200 done at $(( $(date +%s) - t0 )) s"
fi
left=$(( 560 - ($(date +%s) - t0) ))
timeout $left devrun/bin/nibble_tests --gtest_filter='Cuda*:-Cuda.W4A16*' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT/tests.txt" | cut -c1-160
echo "all done at $(( $(date +%s) - t0 )) s"
