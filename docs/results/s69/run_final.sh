#!/usr/bin/env bash
# session 69, third call: the kept version (64 key slots, argmax_keys_kernel after the head) against main (c6d6b1e,
# devrun/bin/*-base): the new tests and every Cuda* test while the 8B-shaped model is made; nibble run, alternated twice; traces.
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
devrun/bin/nibble_tests --gtest_brief=1 --gtest_filter='Cuda.GemvArgmax*:Cuda.DecodeGreedy*:Cuda.DeviceArgmax*' \
  >"$OUT/tests-argmax.txt" 2>&1
tail -5 "$OUT/tests-argmax.txt"
devrun/bin/nibble_tests --gtest_brief=1 --gtest_filter='Cuda*' >"$OUT/tests-cuda.txt" 2>&1
tail -5 "$OUT/tests-cuda.txt"
echo "tests done at $(( $(date +%s) - t0 )) s"
wait $synth; cat "$OUT/synth.txt"
for r in 1 2; do for v in base new; do
  b=devrun/bin/nibble; [ $v = base ] && b=devrun/bin/nibble-base
  echo "== $v round $r" >>"$OUT/decode.txt"
  $b run --model /tmp/l8b-rtn --prompt hello -n 256 --ignore-eos --device cuda 2>>"$OUT/decode.txt" | md5sum >>"$OUT/decode.txt"
done; done
grep -E "==|decode|-$" "$OUT/decode.txt"
echo "decode done at $(( $(date +%s) - t0 )) s"
for v in base new; do
  [ $(( $(date +%s) - t0 )) -lt 480 ] || break
  b=devrun/bin/bench_decode_trace; [ $v = base ] && b=devrun/bin/bench_decode_trace-base
  $b --model /tmp/l8b-rtn --warmup 64 >"$OUT/trace-$v.txt" 2>&1
  grep "step span" "$OUT/trace-$v.txt"; sed -n 3,12p "$OUT/trace-$v.txt"
done
echo "trace done at $(( $(date +%s) - t0 )) s"
