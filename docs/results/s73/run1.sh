#!/usr/bin/env bash
# session 73, first call: session 72's kept filter kernel (127b577) on whatever card comes.
# 1. the sampling tests and the whole Cuda* suite (the bundle has no data/ and no GGUF files: those tests fail for that);
# 2. qwen3-26M-linux nibble run, this build against main d813c60 (nibble-base) alternated, greedy / top-p / both;
# 3. bench_w4a16 (main's GEMVs are unchanged since session 66: the card's figures);
# 4. the 8B shape, nibble run greedy / temp / top-p / top-k / both, this build against d813c60, two rounds.
set -uo pipefail
OUT=$1
t0=$(date +%s)
rm -rf devrun && tar -xJf devrun.tar.xz
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
devrun/bin/nibble -q quantize --method rtn --model devrun/models/qwen3-26M-linux --out /tmp/q-rtn --force
for r in 1 2; do
  for b in new base; do
    bin=devrun/bin/nibble; [ $b = base ] && bin=devrun/bin/nibble-base
    for s in "" "--temp 0.8 --top-p 0.95 --seed 1" "--temp 0.8 --top-k 40 --top-p 0.95 --seed 1"; do
      echo "== $b $s" >>"$OUT/qwen3.txt"
      $bin run --model /tmp/q-rtn --prompt hello --ignore-eos --device cuda -n 512 $s 2>>"$OUT/qwen3.txt" | md5sum >>"$OUT/qwen3.txt"
    done
  done
done
grep -E "==|decode:|-$" "$OUT/qwen3.txt" | sed 's/prefill.*decode: //'
echo "qwen3 done at $(( $(date +%s) - t0 )) s"
devrun/bin/nibble_tests --gtest_brief=1 --gtest_filter='Cuda*' >"$OUT/tests-cuda.txt" 2>&1
tail -12 "$OUT/tests-cuda.txt" | grep -E "FAILED|PASSED|tests ran"
echo "tests done at $(( $(date +%s) - t0 )) s"
wait $synth; cat "$OUT/synth.txt"
devrun/bin/bench_w4a16 >"$OUT/bench_w4a16.txt" 2>&1
grep -E "read BW|fused|prepared|M= *1 |M=16" "$OUT/bench_w4a16.txt" | head -30
echo "bench done at $(( $(date +%s) - t0 )) s"
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
    run "$b T0.8" $bin --temp 0.8 --seed 1
    run "$b T0.8 top-p 0.95" $bin --temp 0.8 --top-p 0.95 --seed 1
    run "$b T0.8 top-k 40" $bin --temp 0.8 --top-k 40 --seed 1
    run "$b T0.8 top-k 40 top-p 0.95" $bin --temp 0.8 --top-k 40 --top-p 0.95 --seed 1
  done
done
grep -E "==|decode:|-$" "$OUT/decode.txt" | sed 's/prefill.*decode: //'
echo "all done at $(( $(date +%s) - t0 )) s"
