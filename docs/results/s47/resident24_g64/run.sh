#!/bin/bash
cd "$(dirname "$0")"
bin/tests_new --gtest_filter='Cuda*W4A16*' > $OUT/tests.txt 2>&1; tail -2 $OUT/tests.txt; grep -E '^\[  FAILED' $OUT/tests.txt | head
O=$OUT/ab.txt
for r in 1 2; do for b in main new; do
  echo "== stack g64 $b run $r" >> $O; bin/bench_$b --group 64 --ms 1,16,17,20,24 --skip-cublas 2>&1 | grep -E "^fused|^unfused|read bandwidth" >> $O
done; done
for b in main new; do echo "== shapes g64 $b" >> $O; bin/bench_$b --group 64 --shapes 28672x4096,128256x4096 --ms 16,17,24 --skip-cublas 2>&1 | grep shape >> $O; done
for b in main new; do echo "== stack g128 $b" >> $O; bin/bench_$b --ms 1,16,17,24 --skip-cublas 2>&1 | grep -E "^fused" >> $O; done
for b in main new; do echo "== fp16 g64 $b" >> $O; bin/bench_$b --group 64 --act fp16 --ms 1,17,24 --skip-cublas 2>&1 | grep -E "^fused" >> $O; done
cat $O
