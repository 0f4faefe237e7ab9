#!/usr/bin/env bash
# session 68, second call: NIBBLE_X_RANKS (probe-ranks.patch): decode attention (head_dim 128, f32 cache) on
# clusters of 1 or 2 blocks per head instead of 4. Attention tests under 1 and 2; the 8B-shaped model's decode,
# each setting twice, alternated; traces of each.
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
for x in 1 2; do
  echo "== NIBBLE_X_RANKS=$x"
  NIBBLE_X_RANKS=$x devrun/bin/nibble_tests --gtest_brief=1 --gtest_filter='Cuda.DecodeMatchesCpuAtHeadDim128:Cuda.FlashAttentionMatchesReference:Cuda.SplitDecodeAttentionMatchesReference:Cuda.DecodeAttentionRopeMatchesRowwise:Cuda.DecodeGreedy*' 2>&1 | tail -4
done >"$OUT/tests.txt" 2>&1
cat "$OUT/tests.txt"
wait $synth; cat "$OUT/synth.txt"
for r in 1 2; do for x in 0 1 2; do
  echo "== NIBBLE_X_RANKS=$x round $r" >>"$OUT/decode.txt"
  NIBBLE_X_RANKS=$x devrun/bin/nibble run --model /tmp/l8b-rtn --prompt hello -n 256 --ignore-eos --device cuda \
    2>>"$OUT/decode.txt" | md5sum >>"$OUT/decode.txt"
done; done
grep -E "==|measured|-$" "$OUT/decode.txt"
echo "decode done at $(( $(date +%s) - t0 )) s"
for x in 0 1 2; do
  [ $(( $(date +%s) - t0 )) -lt 500 ] || break
  NIBBLE_X_RANKS=$x devrun/bin/bench_decode_trace --model /tmp/l8b-rtn --warmup 64 >"$OUT/trace-$x.txt" 2>&1
  grep -A8 "^layer 1" "$OUT/trace-$x.txt"; grep "step span" "$OUT/trace-$x.txt"
done
echo "trace done at $(( $(date +%s) - t0 )) s"
