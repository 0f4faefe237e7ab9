#!/usr/bin/env bash
# Session 86, second call: GGUF Q5_0 matrices now come as int8_g32_sym and Q5_1 / Q5_K / Q6_K as
# int8_g{32,32,16}_asym_f32, formats no GPU kernel takes, so the GPU forward must load them dense as before. The GPU
# forward's and yardstick's tests, and `nibble run --device cuda` against --device cpu (greedy, with the dense note)
# on the Q4_K_M (Q5_0 + Q8_0) and Q5_K_M (Q5_1 + Q8_0) files; `nibble eval --device cuda` against --device cpu on the
# Q5_K_M file.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
timeout 300 devrun/bin/nibble_tests --gtest_filter='Cuda.GpuForward*:CudaEval*:Cuda.DenseFallbacks*' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|Failure" "$OUT/tests.txt" | cut -c1-220 | head -20
g=devrun/models/stories260K/gguf
# (the bundle has no Q5_K_M file: the call carried a copy of it as xfer/q5km.gguf, untracked)
cp xfer/q5km.gguf devrun/models/stories260K/gguf/stories260K-Q5_K_M.gguf 2>/dev/null || true
for f in Q4_K_M Q5_K_M; do
  for d in cpu cuda; do
    $N run --model $g/stories260K-$f.gguf --prompt "Once upon a time" -n 40 --device $d >/tmp/run.out 2>/tmp/run.err
    echo "$f $d: $(tr '\n' ' ' </tmp/run.out | cut -c1-300)"
    grep -E "^note" /tmp/run.err | cut -c1-300
  done
done | tee "$OUT/run.txt"
head -c 20000 devrun/data/corpora/tinystories-valid-sample.txt >/tmp/ts.txt
for d in cpu cuda; do
  $N eval -q --reference devrun/models/stories260K --candidate $g/stories260K-Q5_K_M.gguf --corpus ts=/tmp/ts.txt \
    --ctx 128 --chunks 8 --device $d 2>&1 | grep -E "Q5_K_M|noise" | cut -c1-250
done | tee "$OUT/eval.txt"
