#!/usr/bin/env bash
# Session 76, second call: GPTQ's GPU sweep for int4_sym (the GPTQ community's layout) beside int4_asym. The GPTQ,
# refine and calibration tests on the GPU; GPTQ+MSE of the 8B shape on the GPU in int4_g128_sym
# (whole command timed); and on qwen3-26M-linux GPTQ --mse int4_g128_sym on the CPU (16 cores) and on the GPU, both
# scored by the KL yardstick (40 windows of 512), as docs/results/gptq-gpu-vs-cpu-kl-qwen3-26M-linux-s8.txt did
# for int4_asym.
set -uo pipefail
OUT=$1
t0=$(date +%s)
rm -rf devrun && tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
N=devrun/bin/nibble
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
( $N -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force &&
  python3 -c "import numpy as np; np.save('/tmp/ids.npy', np.random.default_rng(0).integers(0, 128256, 1 << 20).astype(np.int32))"
  echo "synth done at $(( $(date +%s) - t0 )) s" ) >"$OUT/synth.txt" 2>&1 &
synth=$!
devrun/bin/nibble_tests --gtest_filter='Cuda.Gptq*:Cuda.Refine*:Cuda.Calibration*:CudaEval.GgufAndGptq*' \
  >"$OUT/tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |tests ran" "$OUT/tests.txt"; grep "FAILED  \]" "$OUT/tests.txt" | head -20
grep -E "^\[ (ppl|int4_sym)" "$OUT/tests.txt" | head -40
echo "tests done at $(( $(date +%s) - t0 )) s"
wait $synth; cat "$OUT/synth.txt"
for f in int4_g128_sym; do
  { time $N -q quantize --method gptq --mse --format $f --device cuda --model /tmp/l8b --calib /tmp/ids.npy \
      --calib-samples 128 --calib-len 2048 --out /tmp/l8b-$f --force; } >"$OUT/gptq-8b-$f.txt" 2>&1
  echo "$f: $(grep real "$OUT/gptq-8b-$f.txt")"
  rm -rf /tmp/l8b-$f
done
echo "8b done at $(( $(date +%s) - t0 )) s"
M=devrun/models/qwen3-26M-linux
C=devrun/data/corpora
for d in cpu cuda; do
  { time $N -q quantize --method gptq --mse --format int4_g128_sym --device $d --model $M --out /tmp/q-sym-$d \
      --calib $C/linux-calib.txt --force; } >"$OUT/qwen3-sym-$d.txt" 2>&1
  echo "qwen3 sym $d: $(grep real "$OUT/qwen3-sym-$d.txt")"
done
$N eval --reference $M --candidate /tmp/q-sym-cpu --candidate /tmp/q-sym-cuda --corpus linux=$C/linux-eval.txt \
  --ctx 512 --chunks 40 --device cuda >"$OUT/kl-sym-gpu-vs-cpu.txt" 2>"$OUT/kl-sym-gpu-vs-cpu.err"
cat "$OUT/kl-sym-gpu-vs-cpu.txt"
echo "all done at $(( $(date +%s) - t0 )) s"
