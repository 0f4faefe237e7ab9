#!/usr/bin/env bash
# session 66, fifth call: NIBBLE_X_DEEP (probe-deep.patch) in decode on an 8-layer copy of the 8B shape (the same
# per-layer kernels; tok/s are not the 32-layer model's), each setting twice, alternated. Under $OUT.
set -uo pipefail
OUT=$1
tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
devrun/bin/nibble -q synth --out /tmp/l8 --layers 8 --tokenizer-from devrun/models/qwen3-26M-linux --force
devrun/bin/nibble -q quantize --method rtn --model /tmp/l8 --out /tmp/l8-rtn --force
for r in 1 2; do for x in ${SETTINGS:-0 1 2 3}; do
  echo "== NIBBLE_X_DEEP=$x round $r" >>"$OUT/decode.txt"
  NIBBLE_X_DEEP=$x devrun/bin/nibble run --model /tmp/l8-rtn --prompt hello -n 256 --ignore-eos --device cuda \
    2>>"$OUT/decode.txt" | md5sum >>"$OUT/decode.txt"
done; done
grep -E "==|measured|-$|x_deep=.*(deep 1|lean 1)" "$OUT/decode.txt"
