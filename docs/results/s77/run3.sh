#!/usr/bin/env bash
# Session 77, third call: the GPU GPTQ and refine tests after the review's mends (cda8a18: one per-format table
# lookup, int4_asym's device encode/decode moved into gptq_int4.cuh's Asym; the same expressions).
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
timeout 200 devrun/bin/nibble_tests --gtest_filter='Cuda.Gptq*:Cuda.Refine*' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[       OK|^\[  FAILED|^\[ refine" "$OUT/tests.txt" | cut -c1-140
