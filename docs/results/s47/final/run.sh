#!/bin/bash
cd "$(dirname "$0")"
tar -xJf shared.tar.xz && tar -xJf tiny.tar.xz
export NIBBLE_SHARED=$PWD/shared NIBBLE_TEST_BIN=$PWD/bin/nibble
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt
bin/nibble_tests --gtest_filter='Cuda*' > $OUT/cuda_tests.txt 2>&1; tail -3 $OUT/cuda_tests.txt; grep -E '^\[  FAILED' $OUT/cuda_tests.txt | head
grep -E 'Failure' -A2 $OUT/cuda_tests.txt | head -10
bin/bench_w4a16 --ms 1,2,4,8,16,17,20,24,32,48,64,128,256 > $OUT/bench_w4a16_final.txt 2>&1
grep -E "^(fused|unfused|read)" $OUT/bench_w4a16_final.txt
(cd .. && python3 bench/torch_int4_stack.py --ms 1,4,16,64) > $OUT/torch_int4_stack.txt 2>&1
tail -8 $OUT/torch_int4_stack.txt
