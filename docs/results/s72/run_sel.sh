#!/usr/bin/env bash
# session 72, second call: where a filtered sampled step's time goes. NIBBLE_X_SEL (a probe build of main): the select
# kernel 1 returns at once, 2 after its first phase, 3 after the check (all as if the check held); 4 launches
# neither the select nor the filtered keys kernel; 6 no filtered keys kernel after the select. Outputs differ from
# main's where the check would not hold; tok/s is what is measured. 8B shape and qwen3-26M-linux (8192 logits).
set -uo pipefail
OUT=$1
t0=$(date +%s)
[ -d devrun ] || tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
( devrun/bin/nibble -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force &&
  devrun/bin/nibble -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force && rm -rf /tmp/l8b
  echo "synth+quantize done at $(( $(date +%s) - t0 )) s" ) >"$OUT/synth.txt" 2>&1 &
synth=$!
Q=devrun/models/qwen3-26M-linux
devrun/bin/nibble -q quantize --method rtn --model $Q --out /tmp/q-rtn --force
run() {  # file label model n args...
  local f=$1 label=$2 m=$3 n=$4; shift 4
  echo "== $label" >>"$OUT/$f"
  devrun/bin/nibble run --model $m --prompt hello --ignore-eos --device cuda -n $n "$@" 2>>"$OUT/$f" | md5sum >>"$OUT/$f"
}
for r in 1 2; do
  run qwen3.txt "greedy" /tmp/q-rtn 512
  for p in 0 1 2 3 4 6; do NIBBLE_X_SEL=$p run qwen3.txt "sel $p top-p 0.95" /tmp/q-rtn 512 --temp 0.8 --top-p 0.95 --seed 1; done
done
grep -E "==|decode:" "$OUT/qwen3.txt" | sed 's/prefill.*decode: //'
wait $synth; cat "$OUT/synth.txt"
M=/tmp/l8b-rtn
for r in 1 2; do
  run decode.txt "greedy" $M 256
  for p in 0 1 2 3 4 6; do NIBBLE_X_SEL=$p run decode.txt "sel $p top-p 0.95" $M 256 --temp 0.8 --top-p 0.95 --seed 1; done
  for p in 0 3 4; do NIBBLE_X_SEL=$p run decode.txt "sel $p top-k 40" $M 256 --temp 0.8 --top-k 40 --seed 1; done
done
grep -E "==|decode:" "$OUT/decode.txt" | sed 's/prefill.*decode: //'
echo "all done at $(( $(date +%s) - t0 )) s"
