#!/usr/bin/env bash
# Session 80, third call: the W4A16 stack at groups of 32 against groups of 128 at M = 1, 4, 16, 64 (groups of 32
# at M >= 2 take the general mma kernel; 64/128 the small-M, staged, resident and wgmma kernels), same card, same
# call. Bundle: run2.sh's.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
t0=$(date +%s)
for g in 32 128; do
  timeout 150 devrun/bin/bench_w4a16 --group $g --ms 1,4,16,64 --skip-cublas --no-torch >"$OUT/bench_g$g.txt" 2>&1
  grep -E "^fused|^unfused|^M=1 prepared|read bandwidth" "$OUT/bench_g$g.txt" | sed "s/^/g$g /"
  echo "g$g done at $(( $(date +%s) - t0 )) s"
done
