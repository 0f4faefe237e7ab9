#!/usr/bin/env bash
# Session 82, first call: every Cuda* test (session 81's fixed GPTQ comparison and groups-of-32 tall-M cases, which
# have not run on a GPU; this session's int4_asym_f32 / int4_sym matrices held as codes with fp32 pairs on the GPU
# yardstick, CudaEval.GgufAndGptqCheckpointsScoreAsOnTheCpu with GGUF Q4_0 added), then on an H200 only issue 6's
# stack at groups of 128 (torch and cuBLAS beside) and the 8B decode, not measured on an H200 since session 75.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
timeout 330 devrun/bin/nibble_tests --gtest_filter='Cuda*' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|\[gpu eval\]|\[f32 forward\]" "$OUT/tests.txt" | cut -c1-220 | head -60
echo "tests done at $(( $(date +%s) - t0 )) s"
if grep -q H200 "$OUT/gpu.txt"; then
  B=devrun/bin/bench_w4a16
  timeout 100 $B >"$OUT/stack_g128.txt" 2>&1
  grep -E "^fused|^unfused|^M=1 prepared|read bandwidth|torch|cuBLAS" "$OUT/stack_g128.txt" | head -30
  timeout 140 scripts/device-check.sh --run "$OUT" decode 2>&1 | tail -8
fi
echo "all done at $(( $(date +%s) - t0 )) s"
