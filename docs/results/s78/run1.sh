#!/usr/bin/env bash
# Session 78, first call: llama.cpp's Q4_0 GGUF on the W4A16 kernels (GgufSource::exact_format), session 77's run3
# (the GPU GPTQ and refine tests after cda8a18's mends), then the rest of the Cuda* suite, each under its own limit.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
G=devrun/models/stories260K/gguf
timeout 200 devrun/bin/nibble_tests \
  --gtest_filter='Cuda.GpuForwardRunsQ4_0*:Cuda.DenseFallbacks*:Cuda.Gptq*:Cuda.Refine*' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|^\[ refine|^\[q4_0|^\[gpu forward\] stories" "$OUT/tests.txt" | cut -c1-160
for f in Q4_0 F32; do
  timeout 60 $N run --model $G/stories260K-$f.gguf --device cuda --prompt "Once upon a time" -n 48 --ignore-eos \
    >"$OUT/run-$f.txt" 2>&1
  echo "== $f"; tail -4 "$OUT/run-$f.txt" | cut -c1-300
done
timeout 300 devrun/bin/nibble_tests \
  --gtest_filter='Cuda*:-Cuda.GpuForwardRunsQ4_0*:Cuda.DenseFallbacks*:Cuda.Gptq*:Cuda.Refine*:Cuda.CompilesForSm80*' \
  >"$OUT/tests-rest.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT/tests-rest.txt" | cut -c1-140
tail -3 "$OUT/tests-rest.txt"
