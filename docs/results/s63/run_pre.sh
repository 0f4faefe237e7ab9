#!/usr/bin/env bash
# Session 63's pre-wait probe (pre-wait.patch beside this file): NIBBLE_X_PRE=1 gives the single-token GEMV's
# two-stage ring both stages before its dependency wait (and issues each later group right after it consumes
# one, instead of right before), so every warp has two groups (64 KB per SM) in flight before the wait instead
# of one; the loop and its 97.5 instructions per group are main's, at 64 registers (8 bytes of spill outside it).
# Sums in the same order, so outputs must be bit-identical.
#   on the CPU machine: git apply docs/results/s63/pre-wait.patch && bash docs/results/s62/bundle.sh && git checkout src/
#   on the device:      tar -xJf devrun.tar.xz && bash docs/results/s63/run_pre.sh "$OUT"
set -uo pipefail
DEST=$1
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
B=devrun/bin/bench_w4a16
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$DEST/gpu.txt"
for d in 0 1; do
  echo "== NIBBLE_X_PRE=$d"
  NIBBLE_X_PRE=$d devrun/bin/nibble_tests --gtest_brief=1 \
    --gtest_filter='Cuda.W4A16Sweep*:Cuda.W4A16SingleToken*:Cuda.W4A16GroupSizes*:Cuda.W4A16WithProgrammatic*:Cuda.GemvFusion*:Cuda.W4A16F32*' 2>&1 | tail -2
done | tee "$DEST/tests.txt"
for r in 1 2; do
  for d in 0 1; do
    echo "== NIBBLE_X_PRE=$d round $r"
    NIBBLE_X_PRE=$d $B --ms 1,16 --skip-cublas --no-torch 2>&1
  done
done >"$DEST/stack.txt" 2>&1
grep -E "^==|^fused|M=1 prepared|prepared  " "$DEST/stack.txt"
devrun/bin/nibble -q synth --out /tmp/p63 --tokenizer-from devrun/models/qwen3-26M-linux --force
devrun/bin/nibble -q quantize --method rtn --model /tmp/p63 --out /tmp/p63-rtn --force
rm -rf /tmp/p63
for r in 1 2; do
  for d in 0 1; do
    echo "== NIBBLE_X_PRE=$d round $r"
    NIBBLE_X_PRE=$d devrun/bin/nibble run --model /tmp/p63-rtn --prompt hello -n 256 --ignore-eos --device cuda \
      >"/tmp/text-$d.txt" 2>"/tmp/err-$d.txt"
    grep -E "roofline" "/tmp/err-$d.txt"
  done
done | tee "$DEST/decode.txt"
cmp -s /tmp/text-0.txt /tmp/text-1.txt && echo "text: same" || echo "text: DIFFERS"
# Per kernel of a decode step: how much each extends the step (one layer's kernels in launch order).
for d in 0 1; do
  echo "== NIBBLE_X_PRE=$d"
  NIBBLE_X_PRE=$d devrun/bin/bench_decode_trace --model /tmp/p63-rtn 2>&1
done >"$DEST/trace.txt"
grep -E "^==|span|w4a16_gemv" "$DEST/trace.txt" | head -40
