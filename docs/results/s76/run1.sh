#!/usr/bin/env bash
# Session 76, first call: main at 10c5c0e (flash_attention_tc's TcScratch) plus one f32 -> bf16 rounding kernel
# (convert.h's scaled_round_bf16) for the tensor-core prefill and the GPU calibration's weights. The whole Cuda*
# suite (attention, forward, calibration, GPU GPTQ, gsm8k, CudaEval among it); GPTQ+MSE of the 8B shape on the GPU
# (the calibration path end to end, timed); `nibble run` prefill of about 2500 and 5002 tokens on it; and the same
# text on the CPU and the GPU from qwen3-26M-linux (a short and a 600-token prompt).
set -uo pipefail
OUT=$1
t0=$(date +%s)
rm -rf devrun && tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
( devrun/bin/nibble -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force &&
  python3 -c "import numpy as np; np.save('/tmp/ids.npy', np.random.default_rng(0).integers(0, 128256, 1 << 20).astype(np.int32))"
  echo "synth done at $(( $(date +%s) - t0 )) s" ) >"$OUT/synth.txt" 2>&1 &
synth=$!
devrun/bin/nibble_tests --gtest_filter='Cuda*' >"$OUT/cuda_tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |tests ran" "$OUT/cuda_tests.txt"; grep "FAILED  \]" "$OUT/cuda_tests.txt" | head -20
grep -E "\[flash prefill\]" "$OUT/cuda_tests.txt" | tail -4
echo "tests done at $(( $(date +%s) - t0 )) s"
wait $synth; cat "$OUT/synth.txt"
{ time devrun/bin/nibble -q quantize --method gptq --mse --device cuda --model /tmp/l8b --calib /tmp/ids.npy \
    --calib-samples 128 --calib-len 2048 --out /tmp/l8b-gptq --force; } >"$OUT/gptq-8b.txt" 2>&1
tail -4 "$OUT/gptq-8b.txt"
echo "gptq done at $(( $(date +%s) - t0 )) s"
corp=devrun/data/corpora/linux-eval.txt
for b in 9000 18000 9000 18000; do
  echo "== $b bytes" >>"$OUT/prefill.txt"
  devrun/bin/nibble run --model /tmp/l8b-gptq --prompt "$(head -c $b $corp)" -n 8 --device cuda \
    2>>"$OUT/prefill.txt" | md5sum >>"$OUT/prefill.txt"
done
grep -E "==|prefill" "$OUT/prefill.txt" | sed 's/; decode.*//'
devrun/bin/nibble -q quantize --method rtn --model devrun/models/qwen3-26M-linux --out /tmp/q3-rtn --force
for p in "static int" "$(head -c 2000 $corp)"; do
  for d in cuda cpu; do
    devrun/bin/nibble run --model /tmp/q3-rtn --prompt "$p" -n 64 --device $d 2>/dev/null | md5sum |
      sed "s/-\$/qwen3 $d ${#p}-byte prompt/" | tee -a "$OUT/same-text.txt"
  done
done
echo "all done at $(( $(date +%s) - t0 )) s"
