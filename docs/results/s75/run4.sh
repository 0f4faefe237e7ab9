#!/usr/bin/env bash
# Session 75, fourth call: prefill attention on tensor cores (GpuOptions::tensor_core_prefill, flash_attention_tc).
# The whole Cuda* suite; bench_attention (fp32 flash against the tensor-core path, its roundings included); then
# `nibble run -n 1` on the 8B shape (RTN g128) with prompts of about 274, 1049, 2500 and 5002 tokens, main before
# the change (build-old/nibble-old.xz, b9a5d1c) and after it, alternated, twice each.
set -uo pipefail
OUT=$1
t0=$(date +%s)
rm -rf devrun && tar -xJf devrun.tar.xz
xz -dc build-old/nibble-old.xz > devrun/bin/nibble-old && chmod +x devrun/bin/nibble-old
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
( devrun/bin/nibble -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force &&
  devrun/bin/nibble -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force &&
  echo "model ready at $(( $(date +%s) - t0 )) s" ) >"$OUT/model.txt" 2>&1 &
model=$!
devrun/bin/nibble_tests --gtest_filter='Cuda*' >"$OUT/cuda_tests.txt" 2>&1
grep -E "^\[  (PASSED|FAILED) |tests ran" "$OUT/cuda_tests.txt"; grep "FAILED  \]" "$OUT/cuda_tests.txt" | head -20
grep -E "\[flash prefill\]|\[attention\] tc" "$OUT/cuda_tests.txt" | sort -t' ' -k1,1 | tail -25
echo "tests done at $(( $(date +%s) - t0 )) s"
devrun/bin/bench_attention --skip-rowwise >"$OUT/bench_attention.txt" 2>&1
cat "$OUT/bench_attention.txt"
wait $model; tail -1 "$OUT/model.txt"
corp=devrun/data/corpora/linux-eval.txt
for r in 1 2; do
  for b in 1000 3500 9000 18000; do
    for bin in nibble-old nibble; do
      echo "== $bin $b bytes, run $r" >>"$OUT/prefill.txt"
      devrun/bin/$bin run --model /tmp/l8b-rtn --prompt "$(head -c $b $corp)" -n 8 --device cuda \
        2>>"$OUT/prefill.txt" | md5sum >>"$OUT/prefill.txt"
    done
  done
done
grep -E "==|prefill|-$" "$OUT/prefill.txt" | sed 's/; decode.*//'
# The same text on both devices (README's docs/results/run-cuda-vs-cpu.txt), a short and a 600-token prompt.
devrun/bin/nibble -q quantize --method rtn --model devrun/models/qwen3-26M-linux --out /tmp/q3-rtn --force
for p in "static int" "$(head -c 2000 $corp)"; do
  for run in "nibble cuda" "nibble-old cuda" "nibble cpu"; do
    set -- $run
    devrun/bin/$1 run --model /tmp/q3-rtn --prompt "$p" -n 64 --device $2 2>/dev/null | md5sum |
      sed "s/-\$/qwen3 $1 $2 ${#p}-byte prompt/" | tee -a "$OUT/same-text.txt"
  done
done
echo "all done at $(( $(date +%s) - t0 )) s"
