#!/usr/bin/env bash
# Session 75, fifth call: main at its last code change (flash_attention_tc's scratch offsets written from one
# q_bytes): the attention, GPU forward, decode-graph, calibration, GPU GPTQ, gsm8k and CudaEval tests.
set -uo pipefail
OUT=$1
rm -rf devrun && tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
devrun/bin/nibble_tests --gtest_brief=1 \
  --gtest_filter='Cuda.FlashAttention*:Cuda.AttentionOnABf16*:Cuda.GpuForward*:Cuda.DecodeGraph*:Cuda.Calibration*:Cuda.GptqOnGpu*:Cuda.Gsm8k*:CudaEval.*' \
  >"$OUT/tests.txt" 2>&1
tail -3 "$OUT/tests.txt"; grep -E "\[flash prefill\]" "$OUT/tests.txt"
