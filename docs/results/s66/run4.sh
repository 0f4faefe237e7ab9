#!/usr/bin/env bash
# session 66, fourth call: issue 6's GPTQ target at HEAD (GPTQ+MSE of the 8B-shaped model, 128 x 2048 tokens, on the
# GPU, whole command timed), then nibble eval on qwen3-26M-linux with --device cpu and cuda. Under $OUT.
set -uo pipefail
OUT=$1
tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
devrun/bin/nibble -q synth --out /tmp/l8b --force
python3 -c "import numpy as np; np.save('/tmp/ids.npy', np.random.default_rng(0).integers(0, 128256, 1 << 20).astype(np.int32))"
{ time devrun/bin/nibble -q quantize --method gptq --mse --device cuda --model /tmp/l8b --calib /tmp/ids.npy \
    --calib-samples 128 --calib-len 2048 --out /tmp/l8b-gptq --force; } >"$OUT/gptq-8b.txt" 2>&1
tail -4 "$OUT/gptq-8b.txt"
python3 -c "import json; j = json.load(open('/tmp/l8b-gptq/nibble.json')); print('seconds:', json.dumps(j.get('calibration', {}).get('seconds', {})))" | tee -a "$OUT/gptq-8b.txt"
m=devrun/models/qwen3-26M-linux
devrun/bin/nibble -q quantize --method rtn --model $m --out /tmp/q-rtn --force
for d in cpu cuda; do
  { time devrun/bin/nibble eval -q --device $d --reference $m --candidate /tmp/q-rtn \
      --corpus linux=devrun/data/corpora/linux-eval.txt --ctx 512 --chunks 40 --json "$OUT/eval-qwen3-$d.json"; } 2>&1 |
    tee "$OUT/eval-qwen3-$d.txt" | tail -6
done
