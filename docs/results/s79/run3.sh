#!/usr/bin/env bash
# Session 79, third call: the integer GEMV at groups of 32 with each lane on one group. The second group's planes
# move from B columns 3..5 to 4..6, so the lanes of tig 0, 1 hold the first group's sums and tig 2, 3 the second's,
# each with groups of 64's column constants: a lane streams and combines only its own group's scale/min entry and
# (d, Σx), and the loop is groups of 64's (141 instructions per two chunks against 176; groups of 64 and the lean
# groups of 128 are main's SASS).
# Setup as docs/results/s78/run3.sh's header, with old.tar.xz holding 1d156d2's nibble (the first form, run2.sh).
#  1. tests: the W4A16 sweeps and extreme activations, GemvFusion, the decode tests, the GPU forwards (Q4_0 GGUF);
#  2. the 8B shape's decode in int4_g32_asym and int4_g128_asym, 1d156d2's binary and this one, two rounds.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
tar -xJf old.tar.xz
t0=$(date +%s)
timeout 200 devrun/bin/nibble_tests --gtest_filter='Cuda.W4A16*:Cuda.GemvFusion*:Cuda.Decode*:Cuda.GpuForward*:Cuda.DenseFallbacks*' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|^\[gpu forward\] stories260K-Q4|^\[decode graph\] rtn32" "$OUT/tests.txt" | cut -c1-160
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
