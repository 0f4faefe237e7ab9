#!/usr/bin/env bash
# session 66: NIBBLE_X_LB (probe.patch: every single-token GEMV grid at 64 registers), HEAD's decode, the GEMV
# tests, then main's whole Cuda* suite while time is left. Everything under $OUT.
set -uo pipefail
OUT=$1
t0=$(date +%s)
tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
# synth + quantize in the background while the stack is measured (CPU work; the bench uses the GPU)
( devrun/bin/nibble -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force &&
  devrun/bin/nibble -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force && rm -rf /tmp/l8b
  echo "synth+quantize done at $(( $(date +%s) - t0 )) s" ) >"$OUT/synth.txt" 2>&1 &
synth=$!
for r in 1 2; do for x in 0 1; do
  echo "== NIBBLE_X_LB=$x round $r"
  NIBBLE_X_LB=$x devrun/bin/bench_w4a16 --ms 1,16 --skip-cublas --no-torch 2>&1
done; done >"$OUT/stack.txt" 2>&1
grep -E "^==|^fused|M=1 prepared|x_lb=.*(4096 x 4096|4096 x 14336)|x32   prepared" "$OUT/stack.txt"
echo "stack done at $(( $(date +%s) - t0 )) s"
NIBBLE_X_LB=1 devrun/bin/nibble_tests --gtest_brief=1 --gtest_filter='Cuda.W4A16*:Cuda.GemvFusion*' 2>&1 | tail -4 | tee "$OUT/tests_lb1.txt"
wait $synth; cat "$OUT/synth.txt"
for r in 1 2; do for x in 0 1; do
  echo "== NIBBLE_X_LB=$x round $r" >>"$OUT/decode.txt"
  NIBBLE_X_LB=$x devrun/bin/nibble run --model /tmp/l8b-rtn --prompt hello -n 256 --ignore-eos --device cuda \
    2>>"$OUT/decode.txt" | md5sum >>"$OUT/decode.txt"
done; done
grep -E "==|decode|-$|x_lb" "$OUT/decode.txt"
echo "decode done at $(( $(date +%s) - t0 )) s"
# main's whole suite (NIBBLE_X_LB unset) while the call has time (about 170 s on an H100)
timeout $(( 560 - ($(date +%s) - t0) )) devrun/bin/nibble_tests --gtest_filter='Cuda*' >"$OUT/cuda_tests.txt" 2>&1
echo "suite rc $? at $(( $(date +%s) - t0 )) s"; grep -E "PASSED|FAILED|ran\." "$OUT/cuda_tests.txt" | tail -8
