#!/usr/bin/env bash
# Session 67's CPU check on the device host (16 cores), as run in its third call (cpu-eval-3/). The bundle
# cpueval.tar.xz (carried untracked, with docs/results/ slim) held two CPU builds of `nibble`: nibble-old (2fad4ab,
# the session's start) and nibble-new (775070a), the shared libraries they need besides glibc/libstdc++/CUDA,
# qwen3-26M-linux's config, tokenizer and weights, the first 250 KB of linux-eval.txt and the first 2 MB of
# linux-calib.txt. The first two calls (cpu-eval/, cpu-eval-2/) ran the eval loop and, in the second, GPTQ once each,
# with nibble-new at 4a19002+cd1b316 (cpu-eval/) and 2ced881 (cpu-eval-2/).
set -eu
tar -xJf cpueval.tar.xz -C /tmp && cd /tmp/cpueval
export LD_LIBRARY_PATH=$PWD/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
nproc
M=models/qwen3-26M-linux
bin/nibble-new -q quantize --method rtn --model $M --out /tmp/rtn --force >/dev/null
for b in old new old new; do
  echo "== eval $b"
  /usr/bin/time -f "%e s wall %U s user" bin/nibble-$b eval -q --device cpu --reference $M --candidate /tmp/rtn \
    --corpus linux=linux-eval.txt --ctx 512 --chunks 40 --json $OUT/eval-$b.json 2>&1 | tail -2
done 2>&1 | tee $OUT/cpu-eval.txt
for b in old new old new; do
  echo "== gptq $b"
  /usr/bin/time -f "%e s wall %U s user" bin/nibble-$b -q quantize --method gptq --mse --model $M \
    --calib linux-calib.txt --calib-samples 32 --calib-len 512 --out /tmp/g-$b --force 2>&1 | tail -1
done 2>&1 | tee $OUT/cpu-gptq.txt
for t in 1 4; do
  echo "== eval new, $t threads"
  OMP_NUM_THREADS=$t /usr/bin/time -f "%e s wall %U s user" bin/nibble-new eval -q --device cpu --reference $M \
    --candidate /tmp/rtn --corpus linux=linux-eval.txt --ctx 512 --chunks 40 2>&1 | tail -1
done 2>&1 | tee -a $OUT/cpu-eval.txt
