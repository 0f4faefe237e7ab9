#!/usr/bin/env bash
# session 65, second call: head-only variants of the single-token GEMV (docs/results/s65/head-probe.patch)
set -uo pipefail
OUT=$1
tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
for r in 1 2; do
  for h in 0 2 4 6 8; do
    echo "== NIBBLE_X_HEAD=$h round $r"
    NIBBLE_X_HEAD=$h devrun/bin/bench_w4a16 --ms 1 --skip-cublas --no-torch 2>&1
  done
done >"$OUT/head_stack.txt" 2>&1
grep -E "^==|^fused|M=1 prepared|128256 x  4096 x1   prepared" "$OUT/head_stack.txt"
NIBBLE_X_HEAD=6 devrun/bin/nibble_tests --gtest_brief=1 --gtest_filter='Cuda.W4A16*:Cuda.GemvFusion*' 2>&1 | tail -4 | tee "$OUT/tests6.txt"
devrun/bin/nibble -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force
devrun/bin/nibble -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force
rm -rf /tmp/l8b
for r in 1 2; do for h in 0 6; do
  echo "== NIBBLE_X_HEAD=$h round $r" >>"$OUT/decode.txt"
  NIBBLE_X_HEAD=$h devrun/bin/nibble run --model /tmp/l8b-rtn --prompt hello -n 256 --ignore-eos --device cuda \
    2>>"$OUT/decode.txt" | md5sum >>"$OUT/decode.txt"
done; done
grep -E "==|decode|-$" "$OUT/decode.txt"
