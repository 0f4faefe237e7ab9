#!/usr/bin/env bash
# Session 78: the integer GEMV at groups of 32 (gemv-g32.patch; written, not run: no device time was left).
# Setup on this machine: build main's nibble and bench_w4a16 (without the patch), strip them into devrun-old/bin/
# and pack that as old.tar.xz in the repository root (about 4.8 MB: it travels as an untracked file; delete it
# after); apply the patch; scripts/device-check.sh --bundle --models, then drop devrun/bin/bench_gptq_cuda,
# bench_attention and bench_decode_trace and repack devrun.tar.xz (both archives then fit the 64 MiB with --slim).
#  1. tests: the W4A16 sweeps and extreme activations, GemvFusion, decode at head_dim 128 in groups of 32, the
#     Q4_0 GGUF (int4_g32_sym) against the CPU;
#  2. the 8B shape's decode in int4_g32_asym and int4_g128_asym, main's binary (aa1058d, devrun-old/) and this one.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
tar -xJf old.tar.xz
t0=$(date +%s)
timeout 200 devrun/bin/nibble_tests --gtest_filter='Cuda.Refine*:Cuda.W4A16*:Cuda.GemvFusion*:Cuda.DecodeMatchesCpuAtHeadDim128:Cuda.GpuForwardRunsQ4_0*:Cuda.GemvChain*' >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |^\[  FAILED|^\[q4_0|^\[gpu forward\] stories|^\[decode graph\]" "$OUT/tests.txt" | cut -c1-160
echo "tests done at $(( $(date +%s) - t0 )) s"
L=/tmp/nibble-l8b
$N -q synth --out $L --tokenizer-from devrun/models/qwen3-26M-linux --force 2>&1 | tail -1
for f in int4_g32_asym int4_g128_asym; do
  { time timeout 120 $N -q quantize --method rtn --format $f --model $L --out $L-$f --force; } 2>&1 | grep real | sed "s/^/$f quantize /"
done
rm -rf $L
echo "8B models at $(( $(date +%s) - t0 )) s"
for r in 1 2; do
  for f in int4_g32_asym int4_g128_asym; do
    for b in old new; do
      bin=devrun/bin/nibble; [ $b = old ] && bin=devrun-old/bin/nibble
      echo "== $b $f" >>"$OUT/decode.txt"
      timeout 40 $bin run --model $L-$f --prompt hello -n 256 --ignore-eos --device cuda 2>&1 >/dev/null |
        grep -E "decode|note" >>"$OUT/decode.txt"
      tail -2 "$OUT/decode.txt" | grep -o "measured.*" | sed "s/^/$b $f: /"
    done
  done
done
echo "all done at $(( $(date +%s) - t0 )) s"
