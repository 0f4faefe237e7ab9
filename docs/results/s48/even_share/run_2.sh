#!/bin/bash
cd "$(dirname "$0")"
bin/tests_new --gtest_filter='Cuda*W4A16*' > $OUT/tests.txt 2>&1; tail -2 $OUT/tests.txt; grep -E '^\[  FAILED' $OUT/tests.txt | head
O=$OUT/ab2.txt
for r in 1 2; do for b in main new gemv all; do
  echo "== g128 $b run $r" >> $O; bin/bench_$b --ms 1,2,4,8,16 --skip-cublas 2>&1 | grep -E "^fused|read bandwidth" >> $O
  echo "== g64 $b run $r" >> $O; bin/bench_$b --group 64 --ms 1,2,4,8,16 --skip-cublas 2>&1 | grep -E "^fused" >> $O
done; done
for r in 1 2; do for b in main new; do
  echo "== g128 fp16 $b run $r" >> $O; bin/bench_$b --act fp16 --ms 1,2,4,8,16 --skip-cublas 2>&1 | grep -E "^fused" >> $O
done; done
for r in 1 2; do for b in main r3; do
  echo "== portable nores $b run $r" >> $O; NIBBLE_W4A16_WGMMA=0 NIBBLE_W4A16_RESIDENT=0 bin/bench_$b --ms 17,24 --skip-cublas 2>&1 | grep -E "^fused" >> $O
  echo "== portable nores g64 $b run $r" >> $O; NIBBLE_W4A16_WGMMA=0 NIBBLE_W4A16_RESIDENT=0 bin/bench_$b --group 64 --ms 17,24 --skip-cublas 2>&1 | grep -E "^fused" >> $O
done; done
cat $O
