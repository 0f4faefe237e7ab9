#!/usr/bin/env bash
# Session 81, second call: the GPU GPTQ tests again (int4_asym_f32 in the sweep; expect_close_to_cpu given the
# group size; --refine on the GPU back to int4_asym / int4_sym), then on an H200 only issue 6's stack at groups of
# 128 (torch and cuBLAS beside), the 8B decode, and the stack at groups of 32.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
timeout 200 devrun/bin/nibble_tests --gtest_filter='Cuda.Gptq*:Cuda.Refine*:Cuda.W4A16GroupSizesWideMatricesAndTallM' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|int4_asym_f32" "$OUT/tests.txt" | cut -c1-220 | head -40
echo "tests done at $(( $(date +%s) - t0 )) s"
if grep -q H200 "$OUT/gpu.txt"; then
  B=devrun/bin/bench_w4a16
  timeout 120 $B >"$OUT/stack_g128.txt" 2>&1
  grep -E "^fused|^unfused|^M=1 prepared|read bandwidth|torch|cuBLAS" "$OUT/stack_g128.txt" | head -30
  timeout 150 scripts/device-check.sh --run "$OUT" decode 2>&1 | tail -8
  timeout 60 $B --group 32 --ms 1,16,64 --skip-cublas --no-torch >"$OUT/stack_g32.txt" 2>&1
  grep -E "^fused|read bandwidth" "$OUT/stack_g32.txt"
fi
echo "all done at $(( $(date +%s) - t0 )) s"
