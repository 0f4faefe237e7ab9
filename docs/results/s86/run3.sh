#!/usr/bin/env bash
# Session 86, third call: main after the session's CPU work (the shared DenseFallback, cuda_model.h now including
# model.h; IQ4_NL / IQ4_XS / Q2_K / Q3_K exact formats, which the GPU loads dense). The GPU forward's, yardstick's
# and fallback tests, and greedy `nibble run --device cuda` against --device cpu on the IQ4_NL file with the note.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
timeout 300 devrun/bin/nibble_tests --gtest_filter='Cuda.GpuForward*:CudaEval*:Cuda.DenseFallbacks*:Cuda.Prefill*' \
  >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$OUT/tests.txt" | cut -c1-220 | head -20
g=devrun/models/stories260K/gguf
for f in IQ4_NL Q4_K_M; do
  for d in cpu cuda; do
    $N run --model $g/stories260K-$f.gguf --prompt "Once upon a time" -n 40 --device $d >/tmp/run.out 2>/tmp/run.err
    echo "$f $d: $(tr '\n' ' ' </tmp/run.out | cut -c1-300)"
    grep -E "^note" /tmp/run.err | cut -c1-200
  done
done | tee "$OUT/run.txt"
