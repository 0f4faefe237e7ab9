#!/usr/bin/env bash
# Session 85, first call (ran on an H100: h100-1/). Bundled with docs/results/s84/rule.patch applied plus the probe line of
# rule-with-probe.patch (NIBBLE_X_KVR_ONE=1: main's one block per SM for the kv-shared attention kernel).
# - on an H200: issue 6's stack (bench_w4a16, torch and cuBLAS beside) and 8B greedy decode, three runs (none
#   measured on an H200 since session 75);
# - the kv-shared kernel's tests and CudaEval.*;
# - 8B decode after prompts of about 3600 and 7800 tokens: the rule against one block per SM, alternated.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
t0=$(date +%s)
h200=0; grep -q H200 "$OUT/gpu.txt" && h200=1
if [ $h200 = 1 ]; then
  timeout 120 devrun/bin/bench_w4a16 >"$OUT/stack_g128.txt" 2>&1
  grep -E "^fused|^unfused|^M=1 prepared|read bandwidth|torch|cuBLAS" "$OUT/stack_g128.txt" | head -30
  echo "stack done at $(( $(date +%s) - t0 )) s"
fi
timeout 240 devrun/bin/nibble_tests --gtest_filter='Cuda.FlashAttentionMatchesReference:Cuda.SplitDecodeAttentionMatchesReference:Cuda.AttentionOnABf16CacheMatchesReference:Cuda.DecodeAttentionRopeMatchesRowwise:Cuda.DecodeGraphMatchesEager*:Cuda.DecodeOnABf16KvCache:CudaEval*' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$OUT/tests.txt" | cut -c1-220 | head -20
echo "tests done at $(( $(date +%s) - t0 )) s"
l8b_rtn
echo "8B model ready at $(( $(date +%s) - t0 )) s"
if [ $h200 = 1 ]; then
  for r in 1 2 3; do
    timeout 60 $N run --model /tmp/l8b-rtn --prompt hello -n 256 --ignore-eos --device cuda 2>&1 >/dev/null |
      grep -E "^cuda decode|^prefill" >>"$OUT/decode.txt"
  done
  cat "$OUT/decode.txt"
fi
one() {  # bytes kv label env...
  local bytes=$1 kv=$2 label=$3; shift 3
  p=$(head -c $bytes devrun/data/corpora/linux-eval.txt)
  echo "== bytes $bytes kv $kv $label" >>"$OUT/long.txt"
  env "$@" timeout 60 $N run --model /tmp/l8b-rtn --prompt "$p" -n 128 --ignore-eos --device cuda --kv $kv \
    2>&1 >/dev/null | grep -E "^prefill|^cuda decode|error" >>"$OUT/long.txt"
  echo "bytes $bytes kv $kv $label: $(tail -2 "$OUT/long.txt" | grep -o 'decode: 128 tokens.*')"
}
one 26000 none rule X=0
one 26000 none one NIBBLE_X_KVR_ONE=1
one 12000 none rule X=0
one 12000 none one NIBBLE_X_KVR_ONE=1
one 26000 none rule X=0
one 26000 none one NIBBLE_X_KVR_ONE=1
one 26000 bf16 rule X=0
one 26000 bf16 one NIBBLE_X_KVR_ONE=1
echo "all done at $(( $(date +%s) - t0 )) s"
