#!/usr/bin/env bash
# session 71, last device time (under 300 s): the select kernel with the check on its first radix pass and the
# filtered draw inside it (8c69d8f, nibble-v2) against main (c75472b, nibble-base): the sampling tests, then
# nibble run alternated, three settings.
set -uo pipefail
OUT=$1
t0=$(date +%s)
[ -d devrun ] || tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble-v2
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
( devrun/bin/nibble-v2 -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force &&
  devrun/bin/nibble-v2 -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force && rm -rf /tmp/l8b
  echo "synth+quantize done at $(( $(date +%s) - t0 )) s" ) >"$OUT/synth.txt" 2>&1 &
synth=$!
devrun/bin/nibble_tests --gtest_brief=1 --gtest_filter='Cuda.DeviceSample*:Cuda.DecodeSample*:Cuda.GemvArgmax*' \
  >"$OUT/tests-sample.txt" 2>&1
tail -3 "$OUT/tests-sample.txt"; grep "device sample" "$OUT/tests-sample.txt"
wait $synth; cat "$OUT/synth.txt"
M=/tmp/l8b-rtn
run() {  # label binary args...
  local label=$1 b=$2; shift 2
  echo "== $label" >>"$OUT/decode.txt"
  $b run --model $M --prompt hello --ignore-eos --device cuda -n 256 "$@" 2>>"$OUT/decode.txt" | md5sum >>"$OUT/decode.txt"
}
for r in 1 2; do
  for b in nibble-v2 nibble-base; do
    run "$b greedy" devrun/bin/$b
    run "$b T0.8 top-p 0.95" devrun/bin/$b --temp 0.8 --top-p 0.95 --seed 1
    run "$b T0.8 top-k 40 top-p 0.95" devrun/bin/$b --temp 0.8 --top-k 40 --top-p 0.95 --seed 1
  done
done
grep -E "==|decode:|-$" "$OUT/decode.txt"
echo "all done at $(( $(date +%s) - t0 )) s"
