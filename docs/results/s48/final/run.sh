#!/bin/bash
cd "$(dirname "$0")"
O=$OUT/ab3.txt
for r in 1 2; do for b in new all; do
  echo "== g128 $b run $r" >> $O; bin/bench_$b --ms 17,20,24,32 --skip-cublas 2>&1 | grep -E "^fused|read bandwidth" >> $O
done; done
for b in new all; do echo "== g64 $b" >> $O; bin/bench_$b --group 64 --ms 17,24,32 --skip-cublas 2>&1 | grep -E "^fused" >> $O; done
bin/bench_new --ms 1,2,4,8,16,17,20,24,32,48,64,128,256 > $OUT/bench_final.txt 2>&1
bin/bench_new --group 64 --act fp16 --ms 1,16,17,25,32,64 --skip-cublas > $OUT/bench_g64_fp16.txt 2>&1
cat $O; grep -E "^(fused|unfused|read)" $OUT/bench_final.txt $OUT/bench_g64_fp16.txt
