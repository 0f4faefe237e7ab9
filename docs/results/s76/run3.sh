#!/usr/bin/env bash
# Session 76, third call: GPTQ --refine on the GPU for int4_sym (the refinement's kernels take the format's
# arithmetic as a template parameter, as the sweep's do). The refine and GPTQ quantizer tests; then on
# qwen3-26M-linux GPTQ --mse int4_g128_sym on the GPU with and without --refine 30, scored by the KL yardstick
# (40 windows of 512). (The CPU's runs were left out: the session's device time was nearly spent.)
set -uo pipefail
OUT=$1
t0=$(date +%s)
rm -rf devrun && tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
N=devrun/bin/nibble
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
devrun/bin/nibble_tests --gtest_filter='Cuda.Refine*:Cuda.GptqQuantizerDeviceCuda:Cuda.GptqSweepMatchesCpu' \
  >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |tests ran" "$OUT/tests.txt"; grep "FAILED  \]" "$OUT/tests.txt" | head -20
grep -E "^\[ refine" "$OUT/tests.txt"
echo "tests done at $(( $(date +%s) - t0 )) s"
M=devrun/models/qwen3-26M-linux
C=devrun/data/corpora
for r in 0 30; do
  { time $N -q quantize --method gptq --mse --refine $r --format int4_g128_sym --device cuda --model $M \
      --out /tmp/q-sym-r$r --calib $C/linux-calib.txt --force; } >"$OUT/qwen3-sym-refine$r.txt" 2>&1
  echo "qwen3 sym refine $r: $(grep real "$OUT/qwen3-sym-refine$r.txt")"
done
$N eval --reference $M --candidate /tmp/q-sym-r0 --candidate /tmp/q-sym-r30 --corpus linux=$C/linux-eval.txt \
  --ctx 512 --chunks 40 --device cuda >"$OUT/kl-sym-refine.txt" 2>"$OUT/kl-sym-refine.err"
tail -4 "$OUT/kl-sym-refine.txt"
echo "all done at $(( $(date +%s) - t0 )) s"
