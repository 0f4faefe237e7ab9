#!/usr/bin/env bash
# Session 79, second call: the integer GEMV at groups of 32 (gemv-g32.patch of session 78) with its two mends:
# the second group's columns 4, 5 (lanes of tig 2) reach the row sums (an xor-2 shuffle before gemv_item_out, which
# adds tig 1 to tig 0 only), and the GEMV's fused prepared outputs keep session 6's runtime form for groups of 64/128
# (prep_warp_store<false>) so the groups-of-128 64-register instantiation has no spill (same SASS as main).
# Setup as docs/results/s78/run3.sh's header (old.tar.xz: main's nibble at 4683a36).
#  1. tests: every Cuda* test;
#  2. the 8B shape's decode in int4_g32_asym and int4_g128_asym, main's binary (devrun-old/) and this one, two rounds.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
tar -xJf old.tar.xz
t0=$(date +%s)
timeout 330 devrun/bin/nibble_tests --gtest_filter='Cuda*' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|^\[q4_0|^\[gpu forward\] stories|^\[decode graph\] rtn32" "$OUT/tests.txt" | cut -c1-160
echo "tests done at $(( $(date +%s) - t0 )) s"
L=/tmp/nibble-l8b
$N -q synth --out $L --tokenizer-from devrun/models/qwen3-26M-linux --force 2>&1 | tail -1
for f in int4_g32_asym int4_g128_asym; do
  { time timeout 120 $N -q quantize --method rtn --format $f --model $L --out $L-$f --force; } 2>&1 | grep real | sed "s/^/$f quantize /"
done
rm -rf $L
echo "8B models at $(( $(date +%s) - t0 )) s"
for r in 1 2; do
  for f in int4_g32_asym int4_g128_asym; do
    for b in old new; do
      bin=devrun/bin/nibble; [ $b = old ] && bin=devrun-old/bin/nibble
      echo "== $b $f" >>"$OUT/decode.txt"
      timeout 40 $bin run --model $L-$f --prompt hello -n 256 --ignore-eos --device cuda 2>&1 >/dev/null |
        grep -E "decode|note" >>"$OUT/decode.txt"
      tail -2 "$OUT/decode.txt" | grep -o "measured.*" | sed "s/^/$b $f: /"
    done
  done
done
echo "all done at $(( $(date +%s) - t0 )) s"
