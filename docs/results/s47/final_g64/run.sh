#!/bin/bash
cd "$(dirname "$0")"
tar -xJf shared.tar.xz && tar -xJf tiny.tar.xz
export NIBBLE_SHARED=$PWD/shared NIBBLE_TEST_BIN=$PWD/bin/nibble
bin/nibble_tests --gtest_filter='Cuda*' > $OUT/cuda_tests.txt 2>&1; tail -3 $OUT/cuda_tests.txt; grep -E '^\[  FAILED' $OUT/cuda_tests.txt | head
grep -E 'Failure' -A2 $OUT/cuda_tests.txt | head -10
bin/bench_w4a16 --ms 1,16,17,24 --skip-cublas > $OUT/bench_check.txt 2>&1
bin/bench_w4a16 --group 64 --ms 1,16,17,24 --skip-cublas >> $OUT/bench_check.txt 2>&1
grep -E "^(fused|unfused|read)" $OUT/bench_check.txt
