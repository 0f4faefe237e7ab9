#!/usr/bin/env bash
# Session 75, third call: where a long prefill's time goes on the 8B shape (RTN g128): `nibble run -n 1` with
# prompts of about 300, 1000, 2500 and 5000 tokens (the first bytes of linux-eval.txt), the same under Nsight
# Systems where the machine has it (a kernel summary of the 2500-token run), and bench_w4a16's stack at 256..2048
# tokens beside cuBLAS on bf16 weights.
set -uo pipefail
OUT=$1
t0=$(date +%s)
rm -rf devrun && tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
export PATH=$PATH:/usr/local/cuda/bin
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
{ which nsys ncu; ls -d /opt/nvidia/nsight-systems* /usr/local/cuda/nsight-systems* 2>/dev/null; } | tee "$OUT/tools.txt"
devrun/bin/nibble -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force
devrun/bin/nibble -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force
echo "model ready at $(( $(date +%s) - t0 )) s"
corp=devrun/data/corpora/linux-eval.txt
for b in 1000 3500 9000 18000; do
  for r in 1 2; do
    echo "== $b bytes, run $r" >>"$OUT/prefill.txt"
    devrun/bin/nibble run --model /tmp/l8b-rtn --prompt "$(head -c $b $corp)" -n 1 --ignore-eos --device cuda \
      2>>"$OUT/prefill.txt" >/dev/null
  done
done
grep -E "==|prefill" "$OUT/prefill.txt"
echo "runs done at $(( $(date +%s) - t0 )) s"
NSYS=$(which nsys 2>/dev/null || ls /opt/nvidia/nsight-systems*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | head -1)
if [ -n "$NSYS" ]; then
  "$NSYS" profile -o /tmp/pf --force-overwrite true -t cuda devrun/bin/nibble run --model /tmp/l8b-rtn \
    --prompt "$(head -c 9000 $corp)" -n 1 --ignore-eos --device cuda >/dev/null 2>"$OUT/nsys-run.txt"
  "$NSYS" stats --report cuda_gpu_kern_sum --format csv /tmp/pf.nsys-rep >"$OUT/nsys-kern.csv" 2>&1
  "$NSYS" stats --report cuda_api_sum --format csv /tmp/pf.nsys-rep >"$OUT/nsys-api.csv" 2>&1
  head -25 "$OUT/nsys-kern.csv" | cut -c1-200
fi
echo "nsys done at $(( $(date +%s) - t0 )) s"
devrun/bin/bench_w4a16 --ms 256,512,1024,2048 --no-torch >"$OUT/bench_big_m.txt" 2>&1
grep -E "^(fused|unfused)|read bandwidth" "$OUT/bench_big_m.txt"
echo "all done at $(( $(date +%s) - t0 )) s"
