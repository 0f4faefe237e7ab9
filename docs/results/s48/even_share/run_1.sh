#!/bin/bash
cd "$(dirname "$0")"
bin/tests_new --gtest_filter='Cuda*W4A16*' > $OUT/tests.txt 2>&1; tail -2 $OUT/tests.txt; grep -E '^\[  FAILED' $OUT/tests.txt | head
O=$OUT/ab.txt
for r in 1 2; do for b in main even; do
  echo "== stack g64 fp16 $b run $r" >> $O; bin/bench_$b --group 64 --act fp16 --ms 1,17,25,32,48 --skip-cublas 2>&1 | grep -E "^fused|^unfused|read bandwidth" >> $O
done; done
for r in 1 2; do for b in main even; do
  echo "== stack g64 bf16 $b run $r" >> $O; bin/bench_$b --group 64 --ms 1,16,25,32,64 --skip-cublas 2>&1 | grep -E "^fused|read bandwidth" >> $O
done; done
for b in main even; do echo "== pairs fp16 g64 $b" >> $O; bin/bench_$b --group 64 --act fp16 --shapes 4096x4096,28672x4096 --interleave --ms 25 --skip-cublas 2>&1 | grep -E "shape|interleaved" >> $O; done
for b in main even; do echo "== stack g128 $b" >> $O; bin/bench_$b --ms 1,16,17,25,32,64 --skip-cublas 2>&1 | grep -E "^fused" >> $O; done
for b in main even; do echo "== stack g128 fp16 $b" >> $O; bin/bench_$b --act fp16 --ms 1,17,25,32,64 --skip-cublas 2>&1 | grep -E "^fused" >> $O; done
P=$OUT/probe_small.txt
for r in 1 2; do for b in main even_small; do
  echo "== g64 M=4 staged $b run $r" >> $P; bin/bench_$b --group 64 --ms 2,4,8 --skip-cublas 2>&1 | grep -E "^fused" >> $P
  echo "== portable 17..24 $b run $r" >> $P; NIBBLE_W4A16_WGMMA=0 bin/bench_$b --ms 17,24 --skip-cublas 2>&1 | grep -E "^fused" >> $P
done; done
cat $O $P
