#!/usr/bin/env bash
# Checks that need a GPU machine with torch + transformers (the lent H200):
#   1. the CUDA kernel tests (CI compiles them but has no GPU),
#   2. nibble's packed checkpoints, dequantized, load in transformers and generate.
# Usage on this machine: scripts/device-check.sh --bundle  (builds build-cuda/ and assembles devrun/)
#        on the GPU machine: scripts/device-check.sh --run OUTDIR
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${NIBBLE_SHARED:-../shared}

if [ "${1:-}" = "--bundle" ]; then
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DNIBBLE_CUDA=on >/dev/null
  cmake --build build-cuda >/dev/null
  rm -rf devrun && mkdir -p devrun/bin devrun/lib devrun/models
  cp build-cuda/bin/nibble build-cuda/bin/nibble_tests devrun/bin/
  # Libraries a bare CUDA image may lack (glibc and libstdc++ are the image's own).
  for l in libfmt.so.9 libcrypto.so.3 libgomp.so.1; do cp -L "/lib/x86_64-linux-gnu/$l" devrun/lib/; done
  for m in stories260K qwen3-26M-linux; do
    mkdir -p "devrun/models/$m"
    find "$SHARED/models/$m" -maxdepth 1 -type f \( -name '*.json' -o -name '*.safetensors' \) \
      -exec cp {} "devrun/models/$m/" \;
  done
  du -sh devrun
  exit 0
fi

[ "${1:-}" = "--run" ] || { echo "usage: $0 --bundle | --run OUTDIR" >&2; exit 2; }
OUT=$2
export LD_LIBRARY_PATH="$PWD/devrun/lib:${LD_LIBRARY_PATH:-}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$OUT/gpu.txt"
devrun/bin/nibble_tests --gtest_filter='Cuda*' 2>&1 | tee "$OUT/cuda_tests.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" |
  tee -a "$OUT/gpu.txt"
for spec in "stories260K 64 Once upon a time" "qwen3-26M-linux 128 static int"; do
  read -r m g prompt <<<"$spec"
  devrun/bin/nibble -q quantize --method rtn --model "devrun/models/$m" --out "/tmp/nibble-q-$m" --group "$g" --force
  devrun/bin/nibble -q dequantize --model "/tmp/nibble-q-$m" --out "/tmp/nibble-d-$m" --dtype f32 --force
  python3 scripts/check_transformers.py --original "devrun/models/$m" --dequantized "/tmp/nibble-d-$m" \
    --prompt "$prompt" --out "$OUT/transformers-$m.json" 2>&1 | tee "$OUT/transformers-$m.txt"
done
