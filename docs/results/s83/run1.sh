#!/usr/bin/env bash
# Session 83, first call:
# - CudaEval.* (session 82's last mend, F32Matrix deriving f32_params from the scales' dtype, compiled but not run on a
#   GPU) and this session's Cuda.PrefillAfterAWarmUpAndResetIsAFreshModels;
# - `nibble run --device cuda` on the 8B shape (RTN g128) with its new warm-up and with --no-warmup, alternated twice,
#   prompts of the first 1000 and 10000 bytes of linux-eval.txt: the first prefill's one-time setup, and the same text;
# - on an H200 only: issue 6's stack at groups of 128 (torch and cuBLAS beside) and 8B greedy decode (none measured on
#   an H200 since session 75; no W4A16 kernel has changed since).
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
t0=$(date +%s)
timeout 200 devrun/bin/nibble_tests --gtest_filter='CudaEval*:Cuda.PrefillAfterAWarmUp*' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure|\[gpu eval\]|\[warm-up\]" "$OUT/tests.txt" | cut -c1-220 | head -40
echo "tests done at $(( $(date +%s) - t0 )) s"
$N -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force
$N -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force
rm -rf /tmp/l8b
echo "8B model ready at $(( $(date +%s) - t0 )) s"
for bytes in 1000 10000; do
  p=$(head -c $bytes devrun/data/corpora/linux-eval.txt)
  for r in 1 2; do
    for w in "" "--no-warmup"; do
      tag=p${bytes}${w:+-cold}-r$r
      timeout 60 $N run --model /tmp/l8b-rtn --prompt "$p" -n 32 --ignore-eos --device cuda $w \
        >"$OUT/$tag.out" 2>"$OUT/$tag.err"
      echo "$tag: $(grep -E '^warm-up|^prefill' "$OUT/$tag.err" | cut -c1-160 | tr '\n' ' ')"
    done
  done
  cmp -s "$OUT/p${bytes}-r1.out" "$OUT/p${bytes}-cold-r1.out" && echo "p$bytes: same text warm and cold" ||
    echo "p$bytes: TEXT DIFFERS"
done
echo "runs done at $(( $(date +%s) - t0 )) s"
if grep -q H200 "$OUT/gpu.txt"; then
  timeout 120 devrun/bin/bench_w4a16 >"$OUT/stack_g128.txt" 2>&1
  grep -E "^fused|^unfused|^M=1 prepared|read bandwidth|torch|cuBLAS" "$OUT/stack_g128.txt" | head -30
  echo "stack done at $(( $(date +%s) - t0 )) s"
  for r in 1 2 3; do
    timeout 60 $N run --model /tmp/l8b-rtn --prompt hello -n 256 --ignore-eos --device cuda 2>&1 >/dev/null |
      grep -E "decode|prefill" | tee -a "$OUT/decode.txt"
  done
fi
echo "all done at $(( $(date +%s) - t0 )) s"
