#!/usr/bin/env bash
# session 70: sampled decode on the device. The new tests and every Cuda* test while the 8B-shaped model is made;
# nibble run on the 8B shape greedy and sampled, against main before the session (7f5d076, devrun/bin/nibble-base,
# whose sampled decode copies the logits to the host and sorts them); the same seed on the CPU and the GPU.
set -uo pipefail
OUT=$1
t0=$(date +%s)
[ -d devrun ] || tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
( devrun/bin/nibble -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force &&
  devrun/bin/nibble -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force && rm -rf /tmp/l8b
  echo "synth+quantize done at $(( $(date +%s) - t0 )) s" ) >"$OUT/synth.txt" 2>&1 &
synth=$!
devrun/bin/nibble_tests --gtest_brief=1 --gtest_filter='Cuda.DeviceSample*:Cuda.DecodeSample*:Cuda.DecodeGreedy*:Cuda.DeviceArgmax*' \
  >"$OUT/tests-sample.txt" 2>&1
tail -5 "$OUT/tests-sample.txt"; grep "device sample" "$OUT/tests-sample.txt"
# The same seed on the CPU and the GPU (qwen3-26M-linux as stored, bf16).
Q=devrun/models/qwen3-26M-linux
for d in cpu cuda; do
  devrun/bin/nibble run --model $Q --prompt "static int" -n 64 --temp 0.8 --top-p 0.95 --seed 1 --device $d \
    >"$OUT/qwen3-$d.txt" 2>"$OUT/qwen3-$d.err"
done
cmp "$OUT/qwen3-cpu.txt" "$OUT/qwen3-cuda.txt" && echo "qwen3: the same 64 sampled tokens on cpu and cuda"
wait $synth; cat "$OUT/synth.txt"
M=/tmp/l8b-rtn
run() {  # label binary args...
  local label=$1 b=$2; shift 2
  echo "== $label" >>"$OUT/decode.txt"
  $b run --model $M --prompt hello --ignore-eos --device cuda "$@" 2>>"$OUT/decode.txt" | md5sum >>"$OUT/decode.txt"
}
for r in 1 2; do
  run "new greedy" devrun/bin/nibble -n 256
  run "new T0.8" devrun/bin/nibble -n 256 --temp 0.8 --seed 1
  run "new T0.8 top-p 0.95" devrun/bin/nibble -n 256 --temp 0.8 --top-p 0.95 --seed 1
  run "new T0.8 top-k 40 top-p 0.95" devrun/bin/nibble -n 256 --temp 0.8 --top-k 40 --top-p 0.95 --seed 1
  if [ $r = 1 ]; then
    run "base greedy" devrun/bin/nibble-base -n 256
    run "base T0.8 (n 64)" devrun/bin/nibble-base -n 64 --temp 0.8 --seed 1
    run "base T0.8 top-k 40 (n 64)" devrun/bin/nibble-base -n 64 --temp 0.8 --top-k 40 --seed 1
  fi
done
grep -E "==|decode:|-$" "$OUT/decode.txt"
echo "decode done at $(( $(date +%s) - t0 )) s"
if [ $(( $(date +%s) - t0 )) -lt 400 ]; then
  devrun/bin/nibble_tests --gtest_brief=1 --gtest_filter='Cuda*' >"$OUT/tests-cuda.txt" 2>&1
  tail -4 "$OUT/tests-cuda.txt"
fi
echo "all done at $(( $(date +%s) - t0 )) s"
