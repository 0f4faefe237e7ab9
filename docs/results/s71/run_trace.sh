#!/usr/bin/env bash
# session 71, second call: where a sampled step's time goes (bench_decode_trace --temp, CUPTI), for the kept code
# (c2cdf58: clusters of 8 blocks at 128256 logits) and a variant whose select kernel takes 16 blocks (slices of 8192);
# nibble run with both and main (c75472b) alternated; the sampling tests with the variant.
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
devrun/bin/nibble_tests-v16 --gtest_brief=1 --gtest_filter='Cuda.DeviceSample*:Cuda.DecodeSample*' \
  >"$OUT/tests-v16.txt" 2>&1
tail -3 "$OUT/tests-v16.txt"; grep "device sample" "$OUT/tests-v16.txt"
wait $synth; cat "$OUT/synth.txt"
M=/tmp/l8b-rtn
for v in "" -v16; do
  for s in "" "--temp 0.8 --seed 1" "--temp 0.8 --top-p 0.95 --seed 1" "--temp 0.8 --top-k 40 --top-p 0.95 --seed 1"; do
    [ -z "$v" ] || [ -n "$s" ] || continue
    f="$OUT/trace$v-$(echo "$s" | tr -dc 'a-z0-9.')".txt
    devrun/bin/bench_decode_trace$v --model $M --warmup 64 --steps 8 --layer -1 $s >"$f" 2>&1
    head -14 "$f" | cut -c1-120
  done
done
run() {  # label binary args...
  local label=$1 b=$2; shift 2
  echo "== $label" >>"$OUT/decode.txt"
  $b run --model $M --prompt hello --ignore-eos --device cuda -n 256 "$@" 2>>"$OUT/decode.txt" | md5sum >>"$OUT/decode.txt"
}
for r in 1 2; do
  for b in nibble nibble-v16 nibble-base; do
    run "$b greedy" devrun/bin/$b
    run "$b T0.8 top-p 0.95" devrun/bin/$b --temp 0.8 --top-p 0.95 --seed 1
    run "$b T0.8 top-k 40 top-p 0.95" devrun/bin/$b --temp 0.8 --top-k 40 --top-p 0.95 --seed 1
  done
done
grep -E "==|decode:|-$" "$OUT/decode.txt"
echo "all done at $(( $(date +%s) - t0 )) s"
