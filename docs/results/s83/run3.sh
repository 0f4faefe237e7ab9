#!/usr/bin/env bash
# Session 83, third call (any GPU, little device time left): the roofline line that now also counts the KV cache,
# on qwen3-26M-linux RTN (no 8B synthesis: the budget left was too small for it).
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
t0=$(date +%s)
$N -q quantize --method rtn --model devrun/models/qwen3-26M-linux --out /tmp/q3-rtn --force
for bytes in 1000 3000; do  # qwen3-26M-linux has 1024 positions
  p=$(head -c $bytes devrun/data/corpora/linux-eval.txt)
  timeout 60 $N run --model /tmp/q3-rtn --prompt "$p" -n 64 --ignore-eos --device cuda 2>&1 >/dev/null |
    grep -E "^warm-up|^prefill|^cuda decode" | tee -a "$OUT/qwen3.txt"
done
echo "all done at $(( $(date +%s) - t0 )) s"
