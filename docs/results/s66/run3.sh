#!/usr/bin/env bash
# session 66, third call: main (56de2b3) on whatever card comes: the whole Cuda* suite, bench_w4a16 with torch, and
# decode with nibble_prev (df692bb: o and down at 70-72 registers) and nibble (56de2b3) alternated. Under $OUT.
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
for r in 1 2; do for b in nibble_prev nibble; do
  echo "== $b round $r" >>"$OUT/decode.txt"
  devrun/bin/$b run --model /tmp/l8b-rtn --prompt hello -n 256 --ignore-eos --device cuda 2>>"$OUT/decode.txt" |
    md5sum >>"$OUT/decode.txt"
done; done
grep -E "==|measured|-$" "$OUT/decode.txt"
echo "decode done at $(( $(date +%s) - t0 )) s"
timeout $(( 580 - ($(date +%s) - t0) )) devrun/bin/bench_w4a16 >"$OUT/bench_w4a16.txt" 2>&1
echo "bench rc $? at $(( $(date +%s) - t0 )) s"; grep -E "^(fused|unfused|read|M=1|torch)" "$OUT/bench_w4a16.txt"
