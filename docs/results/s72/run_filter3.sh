#!/usr/bin/env bash
# session 72, last call: sample_filter_kernel with the grid state in its own buffer (allocated where top-k / top-p
# first run). The sampling tests; nibble run on the 8B shape, greedy and top-p, this build against main (d813c60)
# alternated, two rounds: does greedy read main's rate again?
set -uo pipefail
OUT=$1
t0=$(date +%s)
[ -d devrun ] || tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
( devrun/bin/nibble -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force &&
  devrun/bin/nibble -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force && rm -rf /tmp/l8b
  echo "synth+quantize done at $(( $(date +%s) - t0 )) s" ) >"$OUT/synth.txt" 2>&1 &
synth=$!
devrun/bin/nibble_tests --gtest_brief=1 \
  --gtest_filter='Cuda.DeviceSample*:Cuda.DecodeSample*:Cuda.DecodeGreedy*:Cuda.DeviceArgmax*:Cuda.GemvArgmax*' \
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
  for b in new base; do
    bin=devrun/bin/nibble; [ $b = base ] && bin=devrun/bin/nibble-base
    run "$b greedy" $bin
    run "$b T0.8 top-p 0.95" $bin --temp 0.8 --top-p 0.95 --seed 1
  done
done
grep -E "==|decode:|-$" "$OUT/decode.txt" | sed 's/prefill.*decode: //'
echo "all done at $(( $(date +%s) - t0 )) s"
