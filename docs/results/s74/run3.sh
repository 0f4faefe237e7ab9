#!/usr/bin/env bash
# Session 74, third call: main after the review's mend (df65607: every forward kernel launch through one
# cudaLaunchKernelEx helper): the sampling / greedy / argmax tests and the GPU forward and decode-graph tests.
set -uo pipefail
OUT=$1
rm -rf devrun && tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
devrun/bin/nibble_tests --gtest_brief=1 --gtest_filter='Cuda.DeviceSample*:Cuda.DecodeSample*:Cuda.DecodeGreedy*:Cuda.DeviceArgmax*:Cuda.GemvArgmax*:Cuda.GpuForward*:Cuda.DecodeGraph*:CudaEval.*' \
  >"$OUT/tests.txt" 2>&1
tail -3 "$OUT/tests.txt"; grep "device sample" "$OUT/tests.txt"
