#!/usr/bin/env bash
# Session 84's third call, which found no machine (session 85 ran it as docs/results/s85/run1.sh): the kv-shared attention kernel's ranks from its
# occupancy (two blocks per SM for the f32 cache). Bundle it with `git apply docs/results/s84/rule.patch` and
# then docs/results/s84/rule-with-probe.patch's one extra line (NIBBLE_X_KVR_ONE=1: main's one block per SM), in
# the order the device time left allows:
# - the kv-shared kernel's tests (2999, 4000 and 69999 cached positions; graphs from position 20);
# - f32-cache decode on the 8B shape after prompts of about 3600 and 7800 tokens, the rule against one
#   block per SM, alternated; the bf16 cache at 7800 (its rule keeps one block per SM).
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
t0=$(date +%s)
timeout 300 devrun/bin/nibble_tests --gtest_filter='Cuda.FlashAttentionMatchesReference:Cuda.SplitDecodeAttentionMatchesReference:Cuda.AttentionOnABf16CacheMatchesReference:Cuda.DecodeAttentionRopeMatchesRowwise:Cuda.DecodeGraphMatchesEager*:Cuda.DecodeOnABf16KvCache' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$OUT/tests.txt" | cut -c1-220 | head -20
echo "tests done at $(( $(date +%s) - t0 )) s"
l8b_rtn
echo "8B model ready at $(( $(date +%s) - t0 )) s"
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
