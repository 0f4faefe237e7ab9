#!/bin/bash
cd "$(dirname "$0")"
bin/tests_new --gtest_filter='Cuda.W4A16Resident*:Cuda.W4A16FewTokens*:Cuda.W4A16SmallMSumsFollowEachCall:Cuda.W4A16WithProgrammaticDependentLaunch' > $OUT/tests.txt 2>&1; tail -2 $OUT/tests.txt; grep -E '^\[  FAILED' $OUT/tests.txt | head
O=$OUT/ab.txt
S=28672x4096,128256x4096
for r in 1 2 3; do for b in main new; do
  echo "== stack $b run $r" >> $O; bin/bench_$b --ms 1,16 --skip-cublas 2>&1 | grep -E "^fused|read bandwidth" >> $O
done; done
for r in 1 2; do for b in main new; do echo "== shapes $b run $r" >> $O; bin/bench_$b --shapes $S --ms 9,16 --skip-cublas 2>&1 | grep shape >> $O; done; done
cat $O
