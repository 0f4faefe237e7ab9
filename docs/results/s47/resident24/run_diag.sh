#!/bin/bash
cd "$(dirname "$0")"
O=$OUT/diag.txt
S=6144x4096,4096x4096,28672x4096,4096x14336
for M in 17 24; do for b in main new; do
  echo "== interleave M=$M $b" >> $O; bin/bench_$b --shapes $S --ms $M --skip-cublas --interleave 2>&1 | grep -E "shape|interleaved" >> $O
  for P in 4096x4096,28672x4096 28672x4096,4096x14336; do echo "== pair $P M=$M $b" >> $O; bin/bench_$b --shapes $P --ms $M --skip-cublas --interleave 2>&1 | grep -E "interleaved" >> $O; echo "== pair nopdl $P M=$M $b" >> $O; bin/bench_$b --shapes $P --ms $M --skip-cublas --interleave --no-pdl 2>&1 | grep -E "interleaved" >> $O; done
done; done
for r in 1 2; do for b in main new; do echo "== stack $b run $r" >> $O; bin/bench_$b --ms 1,16,17,18,20,22,24 --skip-cublas 2>&1 | grep -E "^fused|read bandwidth" >> $O; done; done
cat $O
