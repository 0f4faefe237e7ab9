#!/usr/bin/env bash
# session 73, second call: the filter kernel launched cooperatively (every block resident at once, or the launch
# fails) against 127b577 (nibble-base), alternated: the sampling tests, qwen3-26M-linux and the 8B shape with
# top-p / both filters / greedy, two rounds; on an H200 also bench_w4a16 (main's GEMVs, none since session 68).
# Then probe-filter.patch (nibble-probe, NIBBLE_X_FILTER) at top-p on the 8B shape: 0 the cooperative kernel, 1 return
# right after the dependency wait, 2 after the first grid barrier, 3 eight more grid barriers after the check; and
# filter-r64.patch (nibble-r64: the filter kernel at 64 registers, __launch_bounds__(512, 2)).
# NEVER RAN (session 73: no machine started after the first call). The bundle: devrun/bin/nibble = 127b577 +
# filter-coop.patch, nibble-base = 127b577, nibble-probe = 127b577 + probe-filter.patch (which includes the
# cooperative launch), nibble-r64 = 127b577 + filter-coop.patch + filter-r64.patch.
set -uo pipefail
OUT=$1
t0=$(date +%s)
rm -rf devrun && tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
( devrun/bin/nibble -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force &&
  devrun/bin/nibble -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force && rm -rf /tmp/l8b
  echo "synth+quantize done at $(( $(date +%s) - t0 )) s" ) >"$OUT/synth.txt" 2>&1 &
synth=$!
devrun/bin/nibble_tests --gtest_brief=1 \
  --gtest_filter='Cuda.DeviceSample*:Cuda.DecodeSample*:Cuda.DecodeGreedy*:Cuda.DeviceArgmax*:Cuda.GemvArgmax*' \
  >"$OUT/tests-sample.txt" 2>&1
tail -3 "$OUT/tests-sample.txt"; grep "device sample" "$OUT/tests-sample.txt"
devrun/bin/nibble -q quantize --method rtn --model devrun/models/qwen3-26M-linux --out /tmp/q-rtn --force
for r in 1 2; do
  for b in new base; do
    bin=devrun/bin/nibble; [ $b = base ] && bin=devrun/bin/nibble-base
    for s in "--temp 0.8 --top-p 0.95 --seed 1" "--temp 0.8 --top-k 40 --top-p 0.95 --seed 1"; do
      echo "== $b $s" >>"$OUT/qwen3.txt"
      $bin run --model /tmp/q-rtn --prompt hello --ignore-eos --device cuda -n 512 $s 2>>"$OUT/qwen3.txt" | md5sum >>"$OUT/qwen3.txt"
    done
  done
done
grep -E "==|decode:|-$" "$OUT/qwen3.txt" | sed 's/prefill.*decode: //'
echo "qwen3 done at $(( $(date +%s) - t0 )) s"
wait $synth; cat "$OUT/synth.txt"
if grep -q H200 "$OUT/gpu.txt"; then
  devrun/bin/bench_w4a16 >"$OUT/bench_w4a16.txt" 2>&1
  grep -E "read bandwidth|^fused|^unfused" "$OUT/bench_w4a16.txt"; grep -A6 "torch's int4" "$OUT/bench_w4a16.txt"
  echo "bench done at $(( $(date +%s) - t0 )) s"
fi
M=/tmp/l8b-rtn
run() {  # label binary args...
  local label=$1 b=$2; shift 2
  echo "== $label" >>"$OUT/decode.txt"
  $b run --model $M --prompt hello --ignore-eos --device cuda -n 256 "$@" 2>>"$OUT/decode.txt" | md5sum >>"$OUT/decode.txt"
}
for r in 1 2; do
  for b in new base; do
    bin=devrun/bin/nibble; [ $b = base ] && bin=devrun/bin/nibble-base
    run "$b greedy" $bin
    run "$b T0.8 top-p 0.95" $bin --temp 0.8 --top-p 0.95 --seed 1
    run "$b T0.8 top-k 40 top-p 0.95" $bin --temp 0.8 --top-k 40 --top-p 0.95 --seed 1
  done
done
for r in 1 2; do
  run "r64 T0.8 top-p 0.95" devrun/bin/nibble-r64 --temp 0.8 --top-p 0.95 --seed 1
  run "r64 T0.8 top-k 40 top-p 0.95" devrun/bin/nibble-r64 --temp 0.8 --top-k 40 --top-p 0.95 --seed 1
  for x in 0 1 2 3; do
    export NIBBLE_X_FILTER=$x; run "probe $x T0.8 top-p 0.95" devrun/bin/nibble-probe --temp 0.8 --top-p 0.95 --seed 1
  done
done
unset NIBBLE_X_FILTER
grep -E "==|decode:|-$" "$OUT/decode.txt" | sed 's/prefill.*decode: //'
echo "all done at $(( $(date +%s) - t0 )) s"
