#!/usr/bin/env bash
# Session 79, fourth call (asked for an H200, ran on an H100; what was left of the device time): the 8B shape's decode in int4_g32_asym and
# int4_g128_asym with 9beb9cf's nibble (the integer GEMV at groups of 32 with a lane per group). The bundle is a
# small one: devrun/bin/nibble, devrun/lib and qwen3-26M-linux's json files (for synth's tokenizer), packed as
# devrun.tar.xz from the full bundle's files. The most important rows first; each step has a timeout.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
t0=$(date +%s)
L=/tmp/nibble-l8b
$N -q synth --out $L --tokenizer-from devrun/models/qwen3-26M-linux --force 2>&1 | tail -1
for f in int4_g32_asym int4_g128_asym; do
  { time timeout 100 $N -q quantize --method rtn --format $f --model $L --out $L-$f --force; } 2>&1 | grep real | sed "s/^/$f quantize /"
  for r in 1 2; do
    echo "== $f" >>"$OUT/decode.txt"
    timeout 30 $N run --model $L-$f --prompt hello -n 256 --ignore-eos --device cuda 2>&1 >/dev/null |
      grep -E "decode|note" >>"$OUT/decode.txt"
    tail -2 "$OUT/decode.txt" | grep -o "measured.*" | sed "s/^/$f: /"
  done
  rm -rf $L-$f
  echo "$f done at $(( $(date +%s) - t0 )) s"
done
