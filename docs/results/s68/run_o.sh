#!/usr/bin/env bash
# session 68: NIBBLE_X_O (probe-o.patch) in decode on the 8B-shaped model: 0 main; 1 o with 4 stages at 64
# registers; 2 the same at most 8 warps per tile; 3 o at 2 stages, at most 8 warps; 4 gate|up with 4 stages at
# 64 registers. The fused-output tests under 1, 2 and 4; each setting twice, alternated; traces of 0, 1, 2.
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
for x in ${TESTS:-1 2 4}; do
  echo "== NIBBLE_X_O=$x"
  NIBBLE_X_O=$x devrun/bin/nibble_tests --gtest_brief=1 --gtest_filter='Cuda.GemvFusion*:Cuda.DecodeGraph*:Cuda.GpuForward*' 2>&1 | tail -3
done >"$OUT/tests.txt" 2>&1
cat "$OUT/tests.txt"
wait $synth; cat "$OUT/synth.txt"
for r in 1 2; do for x in ${SETTINGS:-0 1 2 3 4}; do
  echo "== NIBBLE_X_O=$x round $r" >>"$OUT/decode.txt"
  NIBBLE_X_O=$x devrun/bin/nibble run --model /tmp/l8b-rtn --prompt hello -n 256 --ignore-eos --device cuda \
    2>>"$OUT/decode.txt" | md5sum >>"$OUT/decode.txt"
done; done
grep -E "==|measured|-$|x_o=.*(deep 1|lean 1)" "$OUT/decode.txt"
echo "decode done at $(( $(date +%s) - t0 )) s"
for x in ${TRACES:-0 1 2}; do
  [ $(( $(date +%s) - t0 )) -lt 500 ] || break
  NIBBLE_X_O=$x devrun/bin/bench_decode_trace --model /tmp/l8b-rtn --warmup 64 >"$OUT/trace-$x.txt" 2>&1
  grep -A8 "^layer 1" "$OUT/trace-$x.txt"; grep "step span" "$OUT/trace-$x.txt"
done
echo "trace done at $(( $(date +%s) - t0 )) s"
