#!/usr/bin/env bash
# session 72, last call (little device time left): the kept filter kernel (grid state in its own buffer, barrier
# words on lines of their own): the sampling tests, and qwen3-26M-linux's nibble run against main alternated.
set -uo pipefail
OUT=$1
[ -d devrun ] || tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
devrun/bin/nibble_tests --gtest_brief=1 \
  --gtest_filter='Cuda.DeviceSample*:Cuda.DecodeSample*:Cuda.DecodeGreedy*:Cuda.DeviceArgmax*:Cuda.GemvArgmax*' \
  >"$OUT/tests-sample.txt" 2>&1
tail -3 "$OUT/tests-sample.txt"; grep "device sample" "$OUT/tests-sample.txt"
devrun/bin/nibble -q quantize --method rtn --model devrun/models/qwen3-26M-linux --out /tmp/q-rtn --force
for r in 1 2; do
  for b in new base; do
    bin=devrun/bin/nibble; [ $b = base ] && bin=devrun/bin/nibble-base
    for s in "" "--temp 0.8 --top-p 0.95 --seed 1" "--temp 0.8 --top-k 40 --top-p 0.95 --seed 1"; do
      echo "== $b $s" >>"$OUT/qwen3.txt"
      $bin run --model /tmp/q-rtn --prompt hello --ignore-eos --device cuda -n 512 $s 2>>"$OUT/qwen3.txt" | md5sum >>"$OUT/qwen3.txt"
    done
  done
done
grep -E "==|decode:|-$" "$OUT/qwen3.txt" | sed 's/prefill.*decode: //'
