#!/usr/bin/env bash
# Session 80, sixth call: the final binary (general kernel removed, groups of 32 at 9..16 tokens without the early
# dependent launch): the W4A16 tests and the Q4 GGUF forwards.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
timeout 120 devrun/bin/nibble_tests --gtest_filter='Cuda.W4A16*:Cuda.GpuForwardRunsQ4*' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$OUT/tests.txt" | cut -c1-200 | head -20
