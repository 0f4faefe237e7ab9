#!/usr/bin/env bash
# session 68, third call: decode attention's ranks fitted to the length (one round of a block's warps per rank,
# at most 4) against every rank on keys (NIBBLE_X_RA=0, the code before). The whole Cuda* suite with the change;
# the 8B-shaped model's decode, each setting twice, alternated; traces at 64 and 200 positions.
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
devrun/bin/nibble_tests --gtest_filter='Cuda*' >"$OUT/cuda_tests.txt" 2>&1
echo "suite rc $? at $(( $(date +%s) - t0 )) s"; grep -E "PASSED|FAILED|ran\." "$OUT/cuda_tests.txt" | tail -8
wait $synth; cat "$OUT/synth.txt"
for r in 1 2; do for x in 0 1; do
  echo "== NIBBLE_X_RA=$x round $r" >>"$OUT/decode.txt"
  NIBBLE_X_RA=$x devrun/bin/nibble run --model /tmp/l8b-rtn --prompt hello -n 256 --ignore-eos --device cuda \
    2>>"$OUT/decode.txt" | md5sum >>"$OUT/decode.txt"
done; done
grep -E "==|measured|-$" "$OUT/decode.txt"
echo "decode done at $(( $(date +%s) - t0 )) s"
for w in 64 200; do for x in 0 1; do
  [ $(( $(date +%s) - t0 )) -lt 540 ] || break
  NIBBLE_X_RA=$x devrun/bin/bench_decode_trace --model /tmp/l8b-rtn --warmup $w >"$OUT/trace-$x-$w.txt" 2>&1
  echo "NIBBLE_X_RA=$x warmup $w"; grep -E "decode_attention" "$OUT/trace-$x-$w.txt" | tail -1; grep "step span" "$OUT/trace-$x-$w.txt"
done; done
echo "trace done at $(( $(date +%s) - t0 )) s"
