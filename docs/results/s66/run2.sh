#!/usr/bin/env bash
# session 66, second call: NIBBLE_X_LB 0-4 (probe.patch) in decode, the decode trace of 0 and 2, the fused-output
# tests under 2; main's whole Cuda* suite at the end on an H200. Everything under $OUT.
set -uo pipefail
OUT=$1
t0=$(date +%s)
tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
( devrun/bin/nibble -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force &&
  devrun/bin/nibble -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force && rm -rf /tmp/l8b
  echo "synth+quantize done at $(( $(date +%s) - t0 )) s" ) >"$OUT/synth.txt" 2>&1 &
synth=$!
for x in 0 2; do
  echo "== NIBBLE_X_LB=$x"
  NIBBLE_X_LB=$x devrun/bin/bench_w4a16 --ms 1 --skip-cublas --no-torch 2>&1
done >"$OUT/stack.txt" 2>&1
grep -E "^==|^fused|M=1 prepared" "$OUT/stack.txt"
NIBBLE_X_LB=2 devrun/bin/nibble_tests --gtest_brief=1 --gtest_filter='Cuda.GemvFusion*:Cuda.DecodeGraph*:Cuda.GpuForward*' 2>&1 |
  tail -3 | tee "$OUT/tests_lb2.txt"
wait $synth; cat "$OUT/synth.txt"
for r in 1 2; do for x in 0 1 2 3 4; do
  echo "== NIBBLE_X_LB=$x round $r" >>"$OUT/decode.txt"
  NIBBLE_X_LB=$x devrun/bin/nibble run --model /tmp/l8b-rtn --prompt hello -n 256 --ignore-eos --device cuda \
    2>>"$OUT/decode.txt" | md5sum >>"$OUT/decode.txt"
done; done
grep -E "==|measured|-$" "$OUT/decode.txt"
echo "decode done at $(( $(date +%s) - t0 )) s"
for x in 0 2; do
  NIBBLE_X_LB=$x devrun/bin/bench_decode_trace --model /tmp/l8b-rtn --warmup 64 >"$OUT/trace-$x.txt" 2>&1
  head -30 "$OUT/trace-$x.txt" | grep -Ev "^x_lb"
done
echo "trace done at $(( $(date +%s) - t0 )) s"
if grep -q H200 "$OUT/gpu.txt"; then
  timeout $(( 570 - ($(date +%s) - t0) )) devrun/bin/nibble_tests --gtest_filter='Cuda*' >"$OUT/cuda_tests.txt" 2>&1
  echo "suite rc $? at $(( $(date +%s) - t0 )) s"; grep -E "PASSED|FAILED|ran\." "$OUT/cuda_tests.txt" | tail -8
fi
