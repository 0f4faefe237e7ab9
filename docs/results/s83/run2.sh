#!/usr/bin/env bash
# Session 83, second call (on an H200 if one is lent):
# - on an H200: CudaEval.* and Cuda.PrefillAfterAWarmUpAndResetIsAFreshModels, issue 6's stack at groups of 128
#   (torch and cuBLAS beside) and 8B greedy decode, three runs (none measured on an H200 since session 75; no W4A16
#   kernel has changed since);
# - on any GPU: `nibble run --device cuda` on the 8B shape (RTN g128), prompts of the first 1000 and 10000 bytes of
#   linux-eval.txt, with the warm-up and with --no-warmup, and the roofline line that now also counts the KV cache.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
t0=$(date +%s)
h200=0; grep -q H200 "$OUT/gpu.txt" && h200=1
if [ $h200 = 1 ]; then
  timeout 200 devrun/bin/nibble_tests --gtest_filter='CudaEval*:Cuda.PrefillAfterAWarmUp*' >"$OUT/tests.txt" 2>&1
  grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|\[warm-up\]" "$OUT/tests.txt" | cut -c1-220 | head -20
  timeout 120 devrun/bin/bench_w4a16 >"$OUT/stack_g128.txt" 2>&1
  grep -E "^fused|^unfused|^M=1 prepared|read bandwidth|torch|cuBLAS" "$OUT/stack_g128.txt" | head -30
  echo "tests and stack done at $(( $(date +%s) - t0 )) s"
fi
$N -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force
$N -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force
rm -rf /tmp/l8b
echo "8B model ready at $(( $(date +%s) - t0 )) s"
if [ $h200 = 1 ]; then
  for r in 1 2 3; do
    timeout 60 $N run --model /tmp/l8b-rtn --prompt hello -n 256 --ignore-eos --device cuda 2>&1 >/dev/null |
      grep -E "^cuda decode|^prefill" >>"$OUT/decode.txt"
  done
  cat "$OUT/decode.txt"
fi
for bytes in 1000 10000; do
  p=$(head -c $bytes devrun/data/corpora/linux-eval.txt)
  for w in "" "--no-warmup"; do
    timeout 60 $N run --model /tmp/l8b-rtn --prompt "$p" -n 64 --ignore-eos --device cuda $w 2>&1 >/dev/null |
      grep -E "^warm-up|^prefill|^cuda decode" | tee -a "$OUT/prompts.txt"
  done
done
echo "all done at $(( $(date +%s) - t0 )) s"
