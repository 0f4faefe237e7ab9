#!/usr/bin/env bash
# Session 62's GEMV ring probe (README.md beside this file), run on the device from the repository root after
#   git apply docs/results/s62/gemv-ring-probe.patch && bash docs/results/s62/bundle.sh     (on the CPU machine)
#   tar -xJf devrun.tar.xz && bash docs/results/s62/run_probe.sh "$OUT" tests shapes stack decode   (on the device)
# NIBBLE_X_DEEP: 0 main's kernels (bit for bit), 1 the 4-stage ring at 64 registers, 2 the input in the ring with
# 4 stages, 3 the input in the ring with 2 stages. Every variant computes the same sums in the same order, so
# every output must be bit-identical to variant 0's.
# The device tool brings back at most 8 files: each part writes into a scratch folder, packed into
# $OUT/probe-PARTS.tgz at the end, and prints its summary.
set -uo pipefail
DEST=$1
shift
OUT=/tmp/p62out
mkdir -p "$OUT"
trap 'tar -czf "$DEST/probe-$(IFS=-; echo "$*").tgz" -C "$OUT" .' EXIT
export LD_LIBRARY_PATH=$PWD/devrun/lib:${LD_LIBRARY_PATH:-}
B=devrun/bin/bench_w4a16
SHAPES=4096x4096,6144x4096,28672x4096,4096x14336,14336x4096
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
for what in "$@"; do
  case $what in
    tests)  # the single-token GEMV's tests (no model needed) under each variant
      for d in 0 1 2 3; do
        echo "== NIBBLE_X_DEEP=$d"
        NIBBLE_X_DEEP=$d devrun/bin/nibble_tests --gtest_brief=1 \
          --gtest_filter='Cuda.W4A16Sweep*:Cuda.W4A16SingleToken*:Cuda.W4A16GroupSizes*:Cuda.W4A16WithProgrammatic*:Cuda.GemvFusion*:Cuda.W4A16F32*' 2>&1 | tail -4
      done | tee "$OUT/tests.txt" ;;
    shapes)  # per shape, from HBM (distinct copies) and from the L2 (--same-weights), two rounds
      for r in 1 2; do
        for d in 0 1 2 3; do
          echo "== NIBBLE_X_DEEP=$d round $r distinct"
          NIBBLE_X_DEEP=$d $B --layers 64 --ms 1 --shapes $SHAPES 2>&1 | grep -v '^$'
          echo "== NIBBLE_X_DEEP=$d round $r same-weights"
          NIBBLE_X_DEEP=$d $B --layers 64 --ms 1 --shapes $SHAPES --same-weights 2>&1 | grep -v '^$'
        done
      done >"$OUT/shapes.txt" 2>&1
      grep -E "==|shape|prepared" "$OUT/shapes.txt" | head -200 ;;
    stack)  # the 8B stack at M = 1 (fused, prepared, per shape, read-only) and M = 16, two rounds
      for r in 1 2; do
        for d in 0 1 2 3; do
          echo "== NIBBLE_X_DEEP=$d round $r"
          NIBBLE_X_DEEP=$d $B --ms 1,16 --skip-cublas --no-torch 2>&1
        done
      done >"$OUT/stack.txt" 2>&1
      grep -E "==|M=1 |M=1 prepared|M=16|read bandwidth|read-only" "$OUT/stack.txt" | head -120 ;;
    decode)  # issue 6's decode target on the 8B-shaped model, and the greedy text of each variant (identical)
      devrun/bin/nibble -q synth --out /tmp/p62 --tokenizer-from devrun/models/qwen3-26M-linux --force
      devrun/bin/nibble -q quantize --method rtn --model /tmp/p62 --out /tmp/p62-rtn --force
      rm -rf /tmp/p62
      for r in 1 2; do
        for d in 0 1 2 3; do
          echo "== NIBBLE_X_DEEP=$d round $r"
          NIBBLE_X_DEEP=$d devrun/bin/nibble run --model /tmp/p62-rtn --prompt hello -n 256 --ignore-eos \
            --device cuda >"$OUT/decode-text-$d.txt" 2>"$OUT/decode-err-$d.txt"
          grep -E "decode|roofline" "$OUT/decode-err-$d.txt"
        done
      done | tee "$OUT/decode.txt"
      for d in 1 2 3; do cmp -s "$OUT/decode-text-0.txt" "$OUT/decode-text-$d.txt" && echo "text $d: same as 0" ||
        echo "text $d: DIFFERS from 0"; done | tee -a "$OUT/decode.txt" ;;
    *) echo "unknown part: $what (tests shapes stack decode)" >&2; exit 2 ;;
  esac
done
