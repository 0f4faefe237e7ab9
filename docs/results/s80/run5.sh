#!/usr/bin/env bash
# Session 80, fifth call: groups of 32 at 9..16 tokens without the early dependent launch (launch_small_r, GPC = 2,
# NT = 2) against run4.sh's binary (old.tar.xz), bench_w4a16 --group 32 --ms 1,4,16,64, alternated twice. The
# bundle holds bench_w4a16 and devrun/lib only.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
tar -xJf old.tar.xz
for r in 1 2; do
  for b in old new; do
    bin=devrun/bin/bench_w4a16; [ $b = old ] && bin=devrun-old/bin/bench_w4a16
    timeout 40 $bin --group 32 --ms 1,4,16,64 --skip-cublas --no-torch >"$OUT/bench_g32_${b}_$r.txt" 2>&1
    grep -E "^fused" "$OUT/bench_g32_${b}_$r.txt" | sed "s/^/$b g32 /"
  done
done
