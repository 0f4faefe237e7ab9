#!/usr/bin/env bash
# Session 77, first call:
#  1. tests: session 76's unrun refine-sym.patch (GPTQ --refine on the GPU for int4_sym), the attention and
#     forward tests at 692b7a7's TcScratch counts, and int4_sym's new W4A16 registry row (its scales rounded to
#     bf16 at upload: cuda::int4_sym_as_asym) with the GPU forward on int4_sym checkpoints and on a symmetric
#     GPTQ checkpoint (RivalSource's exact_format);
#  2. session 76's run3.sh: qwen3-26M-linux GPTQ --mse int4_g128_sym on the GPU, --refine 0 and 30, KL scored;
#  3. decode of the 8B shape (nibble synth, RTN) in int4_g128_asym, int4_g128_sym (now on the W4A16 kernels)
#     and bf16 (what int4_sym ran as before: dequantized, cuBLAS).
set -uo pipefail
OUT=$1
t0=$(date +%s)
source scripts/devrun-env.sh
F='Cuda.Refine*:Cuda.GptqQuantizerDeviceCuda:Cuda.GptqSweepMatchesCpu:Cuda.FlashAttention*:Cuda.GpuForward*'
F="$F:Cuda.W4A16Int4SymRow:Cuda.W4A16RegistryRows:Cuda.Int4Sym*:Cuda.DenseFallbacks*:Cuda.W4A16SweepBf16"
timeout 240 devrun/bin/nibble_tests --gtest_filter="$F" >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |tests ran|^\[       OK|^\[  FAILED" "$OUT/tests.txt" | cut -c1-110
grep -E "^\[ refine|^\[gpu forward\]|^\[gptq on the gpu\]" "$OUT/tests.txt" | head -30
echo "tests done at $(( $(date +%s) - t0 )) s"
M=devrun/models/qwen3-26M-linux
C=devrun/data/corpora
for r in 0 30; do
  { time timeout 60 $N -q quantize --method gptq --mse --refine $r --format int4_g128_sym --device cuda --model $M \
      --out /tmp/q-sym-r$r --calib $C/linux-calib.txt --force; } >"$OUT/qwen3-sym-refine$r.txt" 2>&1
  echo "qwen3 sym refine $r: $(grep real "$OUT/qwen3-sym-refine$r.txt") $(tail -1 "$OUT/qwen3-sym-refine$r.txt")"
done
timeout 90 $N eval --reference $M --candidate /tmp/q-sym-r0 --candidate /tmp/q-sym-r30 --corpus linux=$C/linux-eval.txt \
  --ctx 512 --chunks 40 --device cuda >"$OUT/kl-sym-refine.txt" 2>"$OUT/kl-sym-refine.err"
tail -4 "$OUT/kl-sym-refine.txt"
echo "qwen3 done at $(( $(date +%s) - t0 )) s"
L=/tmp/nibble-l8b
$N -q synth --out $L --tokenizer-from $M --force 2>&1 | tail -2
for f in int4_g128_asym int4_g128_sym; do
  { time $N -q quantize --method rtn --format $f --model $L --out $L-$f --force; } 2>&1 | grep real | sed "s/^/$f quantize /"
done
echo "8B models at $(( $(date +%s) - t0 )) s"
for f in int4_g128_asym int4_g128_sym int4_g128_asym int4_g128_sym bf16; do
  m=$L-$f; [ $f = bf16 ] && m=$L
  echo "== $f" >>"$OUT/decode.txt"
  timeout 60 $N run --model $m --prompt hello -n 256 --ignore-eos --device cuda 2>&1 >/dev/null |
    grep -E "decode|prefill|note" >>"$OUT/decode.txt"
done
cat "$OUT/decode.txt"
echo "all done at $(( $(date +%s) - t0 )) s"
