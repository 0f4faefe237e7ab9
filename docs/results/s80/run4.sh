#!/usr/bin/env bash
# Session 80, fourth call: groups of 32 at 2..64 tokens on the small-M kernel's rounded path (two groups per
# 64-input chunk, a lane per group: WeightStream<R, 1, 2>) instead of the general mma kernel.
#  1. the W4A16 sweeps (groups of 32 among them), the Q4_0/Q4_1 GGUF forwards and the decode tests (their prefills);
#  2. bench_w4a16 --group 32 --ms 1,4,16,64: adc091d's binary (old.tar.xz: devrun-old/bin/bench_w4a16) against
#     this one, alternated twice, and --group 128 once with this one (unchanged kernels, for scale).
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
tar -xJf old.tar.xz
t0=$(date +%s)
timeout 200 devrun/bin/nibble_tests --gtest_filter='Cuda.W4A16*:Cuda.GpuForwardRunsQ4*:Cuda.Decode*' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$OUT/tests.txt" | cut -c1-200 | head -30
echo "tests done at $(( $(date +%s) - t0 )) s"
for r in 1 2; do
  for b in old new; do
    bin=devrun/bin/bench_w4a16; [ $b = old ] && bin=devrun-old/bin/bench_w4a16
    timeout 60 $bin --group 32 --ms 1,4,16,64 --skip-cublas --no-torch >"$OUT/bench_g32_${b}_$r.txt" 2>&1
    grep -E "^fused|^unfused" "$OUT/bench_g32_${b}_$r.txt" | sed "s/^/$b g32 /"
  done
done
timeout 60 devrun/bin/bench_w4a16 --group 128 --ms 1,4,16,64 --skip-cublas --no-torch >"$OUT/bench_g128.txt" 2>&1
grep -E "^fused|^unfused|read bandwidth" "$OUT/bench_g128.txt" | sed "s/^/g128 /"
echo "all done at $(( $(date +%s) - t0 )) s"
