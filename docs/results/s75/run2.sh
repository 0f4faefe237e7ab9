#!/usr/bin/env bash
# Session 75, second call: every W4A16 and forward launch through w4a16::launch_with / launch_pdl (the review's
# helper moved to w4a16_common.cuh; seven more launch sites on it). The whole Cuda* suite, bench_w4a16's stack,
# GPTQ+MSE of the 8B shape on the GPU, and greedy decode of it twice with the SM clock sampled meanwhile.
set -uo pipefail
OUT=$1
t0=$(date +%s)
rm -rf devrun && tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,power.limit,memory.total --format=csv | tee "$OUT/gpu.txt"
( devrun/bin/nibble -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force &&
  python3 -c "import numpy as np; np.save('/tmp/ids.npy', np.random.default_rng(0).integers(0, 128256, 1 << 20).astype(np.int32))"
  echo "synth done at $(( $(date +%s) - t0 )) s" ) >"$OUT/synth.txt" 2>&1 &
synth=$!
devrun/bin/nibble_tests --gtest_filter='Cuda*' >"$OUT/cuda_tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |tests ran" "$OUT/cuda_tests.txt"; grep "FAILED  \]" "$OUT/cuda_tests.txt" | head -20
echo "tests done at $(( $(date +%s) - t0 )) s"
wait $synth; cat "$OUT/synth.txt"
devrun/bin/bench_w4a16 >"$OUT/bench_w4a16.txt" 2>&1
grep -E "^(fused|unfused|M=1 prepared|read bandwidth)" "$OUT/bench_w4a16.txt"
echo "bench done at $(( $(date +%s) - t0 )) s"
{ time devrun/bin/nibble -q quantize --method gptq --mse --device cuda --model /tmp/l8b --calib /tmp/ids.npy \
    --calib-samples 128 --calib-len 2048 --out /tmp/l8b-gptq --force; } >"$OUT/gptq-8b.txt" 2>&1
tail -4 "$OUT/gptq-8b.txt"
echo "gptq done at $(( $(date +%s) - t0 )) s"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 100 >"$OUT/clocks.csv" &
smi=$!
for r in 1 2; do
  echo "== run $r greedy" >>"$OUT/decode.txt"
  devrun/bin/nibble run --model /tmp/l8b-gptq --prompt hello -n 512 --ignore-eos --device cuda 2>>"$OUT/decode.txt" |
    md5sum >>"$OUT/decode.txt"
done
kill $smi
grep -E "==|decode:|roofline" "$OUT/decode.txt" | sed 's/prefill.*decode: //'
echo "all done at $(( $(date +%s) - t0 )) s"
