#!/usr/bin/env bash
# Session 80, second call: int4_asym_f32 (AWQ, asymmetric GPTQ, GGUF Q4_1/Q4_K on the W4A16 kernels), the full
# bundle of scripts/device-check.sh --bundle --models at the working tree.
#  1. the new and changed GPU tests, then every Cuda* test;
#  2. bench_w4a16 at groups of 32 for one token (the chains rows left out at groups of 32 now);
#  3. the 8B shape's decode in int4_g128_asym_f32 against int4_g128_asym, two runs each;
#  4. nibble run --device cuda on llama.cpp's Q4_1 file of stories260K (its note: which matrices stay dense).
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
t0=$(date +%s)
timeout 120 devrun/bin/nibble_tests --gtest_filter='Cuda.W4A16RegistryRows:Cuda.Int4*:Cuda.W4A16Int4AsymF32Row:Cuda.W4A16Int4SymRow:Cuda.GpuForwardRunsGptqOnTheW4A16Kernels:Cuda.GpuForwardRunsQ4GgufOnTheW4A16Kernels:Cuda.DenseFallbacks*' >"$OUT/new_tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|on the gpu\]|worst|Failure" "$OUT/new_tests.txt" | cut -c1-200 | head -40
echo "new tests done at $(( $(date +%s) - t0 )) s"
timeout 250 devrun/bin/nibble_tests --gtest_filter='Cuda*' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED" "$OUT/tests.txt" | cut -c1-160
echo "all tests done at $(( $(date +%s) - t0 )) s"
timeout 60 devrun/bin/bench_w4a16 --group 32 --ms 1 --skip-cublas --no-torch >"$OUT/bench_g32.txt" 2>&1
grep -E "^fused|^unfused|^M=1|read bandwidth" "$OUT/bench_g32.txt"
echo "bench done at $(( $(date +%s) - t0 )) s"
L=/tmp/nibble-l8b
$N -q synth --out $L --tokenizer-from devrun/models/qwen3-26M-linux --force 2>&1 | tail -1
for f in int4_g128_asym_f32 int4_g128_asym; do
  { time timeout 100 $N -q quantize --method rtn --format $f --model $L --out $L-$f --force; } 2>&1 | grep real | sed "s/^/$f quantize /"
done
rm -rf $L
for r in 1 2; do
  for f in int4_g128_asym_f32 int4_g128_asym; do
    echo "== $f" >>"$OUT/decode.txt"
    timeout 40 $N run --model $L-$f --prompt hello -n 256 --ignore-eos --device cuda 2>&1 >/dev/null |
      grep -E "decode|note" >>"$OUT/decode.txt"
    tail -2 "$OUT/decode.txt" | grep -o "measured.*" | sed "s/^/$f: /"
  done
done
rm -rf $L-*
timeout 30 $N run --model devrun/models/stories260K/gguf/stories260K-Q4_1.gguf --prompt "Once upon a time" -n 40 \
  --device cuda >"$OUT/q4_1_run.txt" 2>&1
cat "$OUT/q4_1_run.txt" | cut -c1-300
echo "all done at $(( $(date +%s) - t0 )) s"
