#!/usr/bin/env bash
# make demo: quantize the stories260K fixture with RTN int4, show what came out, measure it,
# dequantize it, and generate a story with the packed checkpoint.
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
echo
echo "== measure: perplexity on held-out TinyStories, original vs int4 (ctx 256, 20 windows)"
TEXT="$SHARED/data/corpora/tinystories-valid-sample.txt"
# SOURCES.md's split: bytes [0, 96207) calibrate, the rest evaluates.
head -c 96207 "$TEXT" > "$OUT/ts-calib.txt"
tail -c +96208 "$TEXT" > "$OUT/ts-eval.txt"
printf "original: "; "$NIBBLE" -q ppl --model "$MODEL" --text "$OUT/ts-eval.txt" --ctx 256 --chunks 20
printf "int4 g64: "; "$NIBBLE" -q ppl --model "$OUT/stories260K-rtn-g64" --text "$OUT/ts-eval.txt" --ctx 256 --chunks 20
echo
echo "== nibble run: a story from the packed int4 checkpoint (int4 kernels read the packed bytes directly)"
"$NIBBLE" run --model "$OUT/stories260K-rtn-g64" --prompt "Once upon a time" -n 120
echo
echo "== nibble quantize --method gptq --mse: calibrated on the other half of TinyStories"
"$NIBBLE" quantize --method gptq --mse --model "$MODEL" --out "$OUT/stories260K-gptq-g64" --group 64 \
  --calib "$OUT/ts-calib.txt" --calib-samples 64 --calib-len 256 --force
echo
echo "== the same with act-order and --refine 30 (coordinate descent and group refits after the sweep)"
"$NIBBLE" quantize --method gptq --mse --act-order --refine 30 --model "$MODEL" --out "$OUT/stories260K-gptq-refine-g64" \
  --group 64 --calib "$OUT/ts-calib.txt" --calib-samples 64 --calib-len 256 --force
echo
echo "== nibble eval: the KL yardstick on held-out text, RTN vs GPTQ+MSE vs GPTQ+MSE+act-order+refine (ctx 256, 40 windows)"
"$NIBBLE" -q eval --reference "$MODEL" --candidate "$OUT/stories260K-rtn-g64" --candidate "$OUT/stories260K-gptq-g64" \
  --candidate "$OUT/stories260K-gptq-refine-g64" --corpus tinystories="$OUT/ts-eval.txt" --ctx 256 --chunks 40
