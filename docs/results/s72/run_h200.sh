#!/usr/bin/env bash
# session 72: main (d813c60, sessions 69-71's decode changes) on whatever card comes, meant for an H200 (none since
# session 68): every Cuda* test (session 71's review mend of Cuda.GemvArgmaxMatchesScalarScan had not run on a GPU),
# bench_w4a16, nibble run on the 8B shape greedy and sampled, and a decode trace.
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
devrun/bin/nibble_tests --gtest_brief=1 --gtest_filter='Cuda*' >"$OUT/cuda_tests.txt" 2>&1
tail -4 "$OUT/cuda_tests.txt"; echo "tests done at $(( $(date +%s) - t0 )) s"
wait $synth; cat "$OUT/synth.txt"
devrun/bin/bench_w4a16 >"$OUT/bench_w4a16.txt" 2>&1
grep -E "read BW|fused|stack|M= *1 |M=16" "$OUT/bench_w4a16.txt" | head -40
echo "bench done at $(( $(date +%s) - t0 )) s"
M=/tmp/l8b-rtn
run() {  # label args...
  local label=$1; shift
  echo "== $label" >>"$OUT/decode.txt"
  devrun/bin/nibble run --model $M --prompt hello --ignore-eos --device cuda -n 256 "$@" 2>>"$OUT/decode.txt" | md5sum >>"$OUT/decode.txt"
}
for r in 1 2; do
  run "greedy" 
  run "T0.8" --temp 0.8 --seed 1
  run "T0.8 top-p 0.95" --temp 0.8 --top-p 0.95 --seed 1
  run "T0.8 top-k 40 top-p 0.95" --temp 0.8 --top-k 40 --top-p 0.95 --seed 1
  run "T0.8 top-k 40" --temp 0.8 --top-k 40 --seed 1
done
grep -E "==|decode:|-$" "$OUT/decode.txt"
echo "decode done at $(( $(date +%s) - t0 )) s"
devrun/bin/bench_decode_trace --model $M --warmup 64 --steps 8 --layer 1 >"$OUT/trace.txt" 2>&1
head -24 "$OUT/trace.txt" | cut -c1-130
echo "all done at $(( $(date +%s) - t0 )) s"
