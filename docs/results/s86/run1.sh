#!/usr/bin/env bash
# Session 86, first call: session 85's run2.sh (the GPU forward's and the yardstick's tests, and greedy
# `nibble run --device cuda` against --device cpu on the Q4_1 and Q4_K_M GGUFs, whose Q8_0 matrices now come as
# int8_g32_sym and load dense on the GPU), then session 83's run2.sh (on an H200: CudaEval.*, issue 6's stack and
# 8B decode, none measured on an H200 since session 75; on any GPU: 8B prompts of 1000 and 10000 bytes).
# Eight files come back: gpu.txt, q8/tests.txt, q8/run.txt, tests.txt, stack_g128.txt, decode.txt, prompts.txt.
set -uo pipefail
OUT=$1
mkdir -p "$OUT/q8"
bash docs/results/s85/run2.sh "$OUT/q8" | tail -20
rm -f "$OUT/q8/gpu.txt"
bash docs/results/s83/run2.sh "$OUT"
