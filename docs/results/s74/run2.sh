#!/usr/bin/env bash
# Session 74, second call: main (ce95696 and later: the cooperative filter launch) with the whole bundle
# (scripts/device-check.sh --bundle --models): the whole Cuda* suite, GPTQ+MSE of the 8B shape on the GPU (issue 6's
# target, without --refine), and greedy / top-p decode of the 8B shape, three runs each.
set -uo pipefail
OUT=$1
t0=$(date +%s)
rm -rf devrun && tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
( devrun/bin/nibble -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force &&
  python3 -c "import numpy as np; np.save('/tmp/ids.npy', np.random.default_rng(0).integers(0, 128256, 1 << 20).astype(np.int32))"
  echo "synth done at $(( $(date +%s) - t0 )) s" ) >"$OUT/synth.txt" 2>&1 &
synth=$!
devrun/bin/nibble_tests --gtest_filter='Cuda*' >"$OUT/cuda_tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |tests ran" "$OUT/cuda_tests.txt"; grep "FAILED  \]" "$OUT/cuda_tests.txt" | head -20
echo "tests done at $(( $(date +%s) - t0 )) s"
wait $synth; cat "$OUT/synth.txt"
{ time devrun/bin/nibble -q quantize --method gptq --mse --device cuda --model /tmp/l8b --calib /tmp/ids.npy \
    --calib-samples 128 --calib-len 2048 --out /tmp/l8b-gptq --force; } >"$OUT/gptq-8b.txt" 2>&1
tail -4 "$OUT/gptq-8b.txt"
echo "gptq done at $(( $(date +%s) - t0 )) s"
for r in 1 2 3; do
  for s in "" "--temp 0.8 --top-p 0.95 --seed 1"; do
    echo "== run $r ${s:-greedy}" >>"$OUT/decode.txt"
    devrun/bin/nibble run --model /tmp/l8b-gptq --prompt hello -n 256 --ignore-eos --device cuda $s 2>>"$OUT/decode.txt" |
      md5sum >>"$OUT/decode.txt"
  done
done
grep -E "==|decode:|roofline" "$OUT/decode.txt" | sed 's/prefill.*decode: //'
echo "all done at $(( $(date +%s) - t0 )) s"
