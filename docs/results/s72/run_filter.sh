#!/usr/bin/env bash
# session 72: top-k / top-p by sample_filter_kernel (grid barriers in device memory, no clusters) instead of
# sample_select_kernel + sample_keys_kernel. The sampling tests, then nibble run, this build (nibble) against main
# (d813c60, nibble-base) alternated: the 8B shape (256 tokens) and qwen3-26M-linux RTN (8192 logits, 512 tokens);
# a trace of a top-p step; the whole Cuda* suite while time is left.
set -uo pipefail
OUT=$1
t0=$(date +%s)
[ -d devrun ] || tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
( devrun/bin/nibble -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force &&
  devrun/bin/nibble -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force && rm -rf /tmp/l8b
  echo "synth+quantize done at $(( $(date +%s) - t0 )) s" ) >"$OUT/synth.txt" 2>&1 &
synth=$!
devrun/bin/nibble_tests --gtest_brief=1 \
  --gtest_filter='Cuda.DeviceSample*:Cuda.DecodeSample*:Cuda.DecodeGreedy*:Cuda.DeviceArgmax*:Cuda.GemvArgmax*' \
  >"$OUT/tests-sample.txt" 2>&1
tail -4 "$OUT/tests-sample.txt"; grep "device sample" "$OUT/tests-sample.txt"
Q=devrun/models/qwen3-26M-linux
devrun/bin/nibble -q quantize --method rtn --model $Q --out /tmp/q-rtn --force
run() {  # file label binary model n args...
  local f=$1 label=$2 b=$3 m=$4 n=$5; shift 5
  echo "== $label" >>"$OUT/$f"
  $b run --model $m --prompt hello --ignore-eos --device cuda -n $n "$@" 2>>"$OUT/$f" | md5sum >>"$OUT/$f"
}
for r in 1 2; do
  for b in new base; do
    bin=devrun/bin/nibble; [ $b = base ] && bin=devrun/bin/nibble-base
    run qwen3.txt "$b greedy" $bin /tmp/q-rtn 512
    run qwen3.txt "$b T0.8 top-p 0.95" $bin /tmp/q-rtn 512 --temp 0.8 --top-p 0.95 --seed 1
    run qwen3.txt "$b T0.8 top-k 40 top-p 0.95" $bin /tmp/q-rtn 512 --temp 0.8 --top-k 40 --top-p 0.95 --seed 1
  done
done
grep -E "==|decode:|-$" "$OUT/qwen3.txt" | sed 's/prefill.*decode: //'
wait $synth; cat "$OUT/synth.txt"
M=/tmp/l8b-rtn
for r in 1 2; do
  for b in new base; do
    bin=devrun/bin/nibble; [ $b = base ] && bin=devrun/bin/nibble-base
    run decode.txt "$b greedy" $bin $M 256
    run decode.txt "$b T0.8 top-p 0.95" $bin $M 256 --temp 0.8 --top-p 0.95 --seed 1
    run decode.txt "$b T0.8 top-k 40" $bin $M 256 --temp 0.8 --top-k 40 --seed 1
    run decode.txt "$b T0.8 top-k 40 top-p 0.95" $bin $M 256 --temp 0.8 --top-k 40 --top-p 0.95 --seed 1
  done
done
grep -E "==|decode:|-$" "$OUT/decode.txt" | sed 's/prefill.*decode: //'
echo "decode done at $(( $(date +%s) - t0 )) s"
for s in "--temp 0.8 --top-p 0.95 --seed 1" "--temp 0.8 --top-k 40 --top-p 0.95 --seed 1"; do
  f="$OUT/trace-$(echo "$s" | tr -dc 'a-z0-9.')".txt
  devrun/bin/bench_decode_trace --model $M --warmup 64 --steps 8 --layer -1 $s >"$f" 2>&1
  head -14 "$f" | cut -c1-120
done
if [ $(( $(date +%s) - t0 )) -lt 330 ]; then
  devrun/bin/nibble_tests --gtest_brief=1 --gtest_filter='Cuda*' >"$OUT/tests-cuda.txt" 2>&1
  tail -4 "$OUT/tests-cuda.txt"
fi
echo "all done at $(( $(date +%s) - t0 )) s"
