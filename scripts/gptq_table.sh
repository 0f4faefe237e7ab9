#!/usr/bin/env bash
# Per-layer relative output error on held-out text (nibble probe) and held-out
# perplexity for RTN and the GPTQ variants, on one real fixture; prints a
# markdown table (the README's GPTQ table comes from here).
#
#   scripts/gptq_table.sh stories   # stories260K, TinyStories halves, groups 32/64
#   scripts/gptq_table.sh qwen3     # qwen3-26M-linux, linux-calib/-eval, groups 64/128
set -euo pipefail
which=${1:?usage: gptq_table.sh stories|qwen3}
tag=gptq-table
# shellcheck source=scripts/fixture_setup.sh
source "$(dirname "$0")/fixture_setup.sh"
eval_txt=${corpus#*=}   # the held-out half (fixture_setup.sh's split)
case $which in
  stories) gsmall=32; gbig=64 ;;
  qwen3)   chunks=50; gsmall=64; gbig=128 ;;
esac
variants=(
  "rtn g$gbig|--method rtn --group $gbig"
  "gptq g$gbig|--method gptq --group $gbig $calib"
  "gptq+mse g$gbig|--method gptq --mse --group $gbig $calib"
  "gptq+act-order g$gbig|--method gptq --act-order --group $gbig $calib"
  "gptq+mse+act-order g$gbig|--method gptq --mse --act-order --group $gbig $calib"
  "gptq+refine g$gbig|--method gptq --refine 30 --group $gbig $calib"
  "gptq+mse+act-order+refine g$gbig|--method gptq --mse --act-order --refine 30 --group $gbig $calib"
  "gptq no-sequential g$gbig|--method gptq --no-sequential --group $gbig $calib"
  "rtn g$gsmall|--method rtn --group $gsmall"
  "gptq+mse g$gsmall|--method gptq --mse --group $gsmall $calib"
)
ref_ppl=$("$nibble" ppl -q --model "$model" --text "$eval_txt" --ctx $ctx --chunks $chunks | awk '{print $2}')
layers=$(python3 -c "import json,sys; print(json.load(open('$model/config.json'))['num_hidden_layers'])")
hdr="| variant |"; sep="|---|"
for ((l = 0; l < layers; l++)); do hdr+=" L$l |"; sep+="---|"; done
echo "$hdr head | mean | held-out ppl |"
echo "$sep---|---|---|"
for v in "${variants[@]}"; do
  name=${v%%|*}; args=${v#*|}
  out=$work/$(echo "$name" | tr ' +' '__')
  # shellcheck disable=SC2086
  "$nibble" quantize -q --model "$model" --out "$out" --force $args > /dev/null
  "$nibble" probe -q --reference "$model" --candidate "$out" --corpus "$eval_txt" --ctx $ctx --chunks 8 \
    --json "$out.probe.json" > /dev/null
  ppl=$("$nibble" ppl -q --model "$out" --text "$eval_txt" --ctx $ctx --chunks $chunks | awk '{print $2}')
  python3 - "$out.probe.json" "$name" "$ppl" "$layers" <<'PY'
import json, sys, math
j = json.load(open(sys.argv[1])); name, ppl, layers = sys.argv[2], sys.argv[3], int(sys.argv[4])
per = {}
for m, r in j["matrices"].items():
    per.setdefault(r["layer"], []).append(r["rel_output_error"])
cells = [f"{sum(per[l]) / len(per[l]):.4f}" for l in range(layers)]
head = f"{per[-1][0]:.4f}" if -1 in per else "tied"
allv = [v for l in range(layers) for v in per[l]] + (per[-1] if -1 in per else [])
print(f"| {name} | " + " | ".join(cells) + f" | {head} | {sum(allv) / len(allv):.4f} | {ppl} |")
PY
done
echo
echo "Unquantized held-out ppl: $ref_ppl ($ctx-token windows, $chunks chunks). Cells: relative output error"
echo "||(W'-W)x|| / ||Wx|| on the reference's activations, mean over the layer's 7 matrices (8 windows of $ctx)."
