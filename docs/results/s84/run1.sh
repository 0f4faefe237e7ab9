#!/usr/bin/env bash
# Session 84, first call (any GPU), with docs/results/s84/probe-kv-ranks.patch in the bundle:
# - long-context decode: `nibble run --device cuda` on the 8B shape (RTN g128) after prompts of about 2700 and
#   7600 tokens (the first 10000 / 28000 bytes of linux-eval.txt), f32 and bf16 caches, with the kv-shared
#   attention kernel's ranks at 1×, 2× and 4× the SMs' share (NIBBLE_X_KVR; 1 is main's);
# - session 83's warm-up and KV-cache roofline lines (the same runs print them; run2.sh's --no-warmup pair).
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
t0=$(date +%s)
$N -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force
$N -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force
rm -rf /tmp/l8b
echo "8B model ready at $(( $(date +%s) - t0 )) s"
for bytes in 10000 28000; do
  p=$(head -c $bytes devrun/data/corpora/linux-eval.txt)
  for kv in none bf16; do
    for r in 1 2 4 1 2 4; do
      echo "== bytes $bytes kv $kv kvr $r" | tee -a "$OUT/long.txt"
      NIBBLE_X_KVR=$r timeout 90 $N run --model /tmp/l8b-rtn --prompt "$p" -n 128 --ignore-eos --device cuda \
        --kv $kv 2>&1 >/dev/null | grep -E "^warm-up|^prefill|^cuda decode" | tee -a "$OUT/long.txt"
    done
    echo "done $bytes $kv at $(( $(date +%s) - t0 )) s"
  done
done
p=$(head -c 1000 devrun/data/corpora/linux-eval.txt)
timeout 60 $N run --model /tmp/l8b-rtn --prompt "$p" -n 64 --ignore-eos --device cuda --no-warmup 2>&1 >/dev/null |
  grep -E "^warm-up|^prefill|^cuda decode" | tee -a "$OUT/long.txt"
echo "all done at $(( $(date +%s) - t0 )) s"
