#!/usr/bin/env bash
# Session 82, second call: the CudaEval tests again (worst_row now fails on a non-finite or all-zero row: the first
# call's Q4_K case read 0 / 0 from a model whose activations overflowed; now gguf_q4k.h's runnable variant), then
# groups of 32 at 17..32 tokens on the narrow matrices: the stack's per-shape rows with w4a16_small_m_first's rule
# (default) against every call on the wgmma kernel (NIBBLE_W4A16_WGMMA=1), twice alternated; groups of 64 once each
# for reference (the rule was drawn there). On an H200 the stack at groups of 128 and decode as well.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
t0=$(date +%s)
timeout 150 devrun/bin/nibble_tests --gtest_filter='CudaEval.*' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|q4k" "$OUT/tests.txt" | cut -c1-220 | head -30
echo "tests done at $(( $(date +%s) - t0 )) s"
B=devrun/bin/bench_w4a16
for round in 1 2; do
  for w in rule 1; do
    if [ $w = rule ]; then e=""; else e="NIBBLE_W4A16_WGMMA=1"; fi
    env $e timeout 60 $B --group 32 --ms 17,24,32 --skip-cublas --no-torch >"$OUT/g32_${w}_$round.txt" 2>&1
    echo "== g32 $w round $round"; grep -E "^fused" "$OUT/g32_${w}_$round.txt" | head -6
  done
done
for w in rule 1; do
  if [ $w = rule ]; then e=""; else e="NIBBLE_W4A16_WGMMA=1"; fi
  env $e timeout 60 $B --group 64 --ms 17,24,32 --skip-cublas --no-torch >"$OUT/g64_${w}.txt" 2>&1
  echo "== g64 $w"; grep -E "^fused" "$OUT/g64_${w}.txt" | head -6
done
echo "bench done at $(( $(date +%s) - t0 )) s"
if grep -q H200 "$OUT/gpu.txt"; then
  timeout 100 $B >"$OUT/stack_g128.txt" 2>&1
  grep -E "^fused|^unfused|^M=1 prepared|read bandwidth|torch|cuBLAS" "$OUT/stack_g128.txt" | head -30
  timeout 140 scripts/device-check.sh --run "$OUT" decode 2>&1 | tail -8
fi
echo "all done at $(( $(date +%s) - t0 )) s"
