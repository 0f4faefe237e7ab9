#!/usr/bin/env bash
# make demo: quantize the stories260K fixture with RTN int4, show what came out,
# and check it by reading it back and dequantizing it.
set -euo pipefail
NIBBLE=${1:-build/bin/nibble}
SHARED=${2:-../shared}
OUT=${3:-demo-out}
MODEL="$SHARED/models/stories260K"
[ -d "$MODEL" ] || { echo "demo: $MODEL not found (set NIBBLE_SHARED to the shared data folder)" >&2; exit 1; }

echo "== nibble quantize: stories260K (f32, tied head, 172-wide down_proj) -> int4 g64 RTN"
"$NIBBLE" quantize --method rtn --model "$MODEL" --out "$OUT/stories260K-rtn-g64" --group 64 --force
echo
echo "== nibble inspect"
"$NIBBLE" inspect "$OUT/stories260K-rtn-g64"
echo
echo "== a down_proj with 172 inputs (groups of 64, 64 and a ragged 44), dequantized"
"$NIBBLE" inspect "$OUT/stories260K-rtn-g64" --tensor model.layers.0.mlp.down_proj.weight --rows 2 --cols 6
echo
echo "== nibble dequantize -> a plain HF checkpoint (f32) that transformers can load"
"$NIBBLE" dequantize --model "$OUT/stories260K-rtn-g64" --out "$OUT/stories260K-rtn-g64-hf" --force
