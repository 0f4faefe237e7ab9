#!/usr/bin/env bash
# Session 80, first call (main at 19924f2, the full bundle of scripts/device-check.sh --bundle --models):
#  1. Cuda.DecodeWithGroupsOf32And128InOneModel (written in session 79, never run on a GPU);
#  2. the 8B shape's decode in int4_g32_asym and int4_g128_asym, two runs each;
#  3. bench_w4a16 at groups of 32 for one token (never run), then the stack at groups of 128, M = 1 and 16;
#  4. every Cuda* test.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
t0=$(date +%s)
timeout 60 devrun/bin/nibble_tests --gtest_filter='Cuda.DecodeWithGroupsOf32And128InOneModel' >"$OUT/mixed.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|mixed|groups" "$OUT/mixed.txt" | cut -c1-200
echo "mixed test done at $(( $(date +%s) - t0 )) s"
L=/tmp/nibble-l8b
$N -q synth --out $L --tokenizer-from devrun/models/qwen3-26M-linux --force 2>&1 | tail -1
for f in int4_g32_asym int4_g128_asym; do
  { time timeout 120 $N -q quantize --method rtn --format $f --model $L --out $L-$f --force; } 2>&1 | grep real | sed "s/^/$f quantize /"
done
rm -rf $L
for r in 1 2; do
  for f in int4_g32_asym int4_g128_asym; do
    echo "== $f" >>"$OUT/decode.txt"
    timeout 40 $N run --model $L-$f --prompt hello -n 256 --ignore-eos --device cuda 2>&1 >/dev/null |
      grep -E "decode|note" >>"$OUT/decode.txt"
    tail -2 "$OUT/decode.txt" | grep -o "measured.*" | sed "s/^/$f: /"
  done
done
rm -rf $L-*
echo "decode done at $(( $(date +%s) - t0 )) s"
timeout 120 devrun/bin/bench_w4a16 --group 32 --ms 1 --skip-cublas --no-torch >"$OUT/bench_g32.txt" 2>&1
tail -30 "$OUT/bench_g32.txt"
timeout 150 devrun/bin/bench_w4a16 --ms 1,16 --skip-cublas --no-torch >"$OUT/bench_g128.txt" 2>&1
tail -30 "$OUT/bench_g128.txt"
echo "bench done at $(( $(date +%s) - t0 )) s"
timeout 250 devrun/bin/nibble_tests --gtest_filter='Cuda*' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT/tests.txt" | cut -c1-160
echo "all done at $(( $(date +%s) - t0 )) s"
