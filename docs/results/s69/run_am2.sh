#!/usr/bin/env bash
# session 69, second call: the head's argmax with a ticket (main of this session) against 64 key slots with no
# ticket and a one-warp kernel after the head (NIBBLE_X_AM=1, probe-am-slots.patch), and main (c6d6b1e, *-base).
set -uo pipefail
OUT=$1
t0=$(date +%s)
[ -d devrun ] || tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
( devrun/bin/nibble -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force &&
  devrun/bin/nibble -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force && rm -rf /tmp/l8b
  echo "synth+quantize done at $(( $(date +%s) - t0 )) s" ) >"$OUT/synth.txt" 2>&1 &
synth=$!
for v in ticket slots; do
  echo "== $v"
  if [ $v = slots ]; then export NIBBLE_X_AM=1; fi
  devrun/bin/nibble_tests --gtest_brief=1 --gtest_filter='Cuda.GemvArgmax*:Cuda.DecodeGreedy*:Cuda.Gsm8k*' 2>&1 | tail -3
  unset NIBBLE_X_AM
done >"$OUT/tests.txt" 2>&1
cat "$OUT/tests.txt"
wait $synth; cat "$OUT/synth.txt"
for r in 1 2; do for v in base ticket slots; do
  b=devrun/bin/nibble; [ $v = base ] && b=devrun/bin/nibble-base
  echo "== $v round $r" >>"$OUT/decode.txt"
  if [ $v = slots ]; then export NIBBLE_X_AM=1; fi
  $b run --model /tmp/l8b-rtn --prompt hello -n 256 --ignore-eos --device cuda 2>>"$OUT/decode.txt" | md5sum >>"$OUT/decode.txt"
  unset NIBBLE_X_AM
done; done
grep -E "==|decode:|-$" "$OUT/decode.txt"
echo "decode done at $(( $(date +%s) - t0 )) s"
for v in base ticket slots; do
  [ $(( $(date +%s) - t0 )) -lt 500 ] || break
  b=devrun/bin/bench_decode_trace; [ $v = base ] && b=devrun/bin/bench_decode_trace-base
  if [ $v = slots ]; then export NIBBLE_X_AM=1; fi
  $b --model /tmp/l8b-rtn --warmup 64 >"$OUT/trace-$v.txt" 2>&1
  unset NIBBLE_X_AM
  echo "== $v"; sed -n 1,12p "$OUT/trace-$v.txt"
done
echo "trace done at $(( $(date +%s) - t0 )) s"
