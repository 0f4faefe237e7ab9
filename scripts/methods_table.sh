#!/usr/bin/env bash
# Every quantization method (issue 7) on one real fixture, measured exactly like
# the formats table (scripts/formats_table.sh): same reference, corpora, windows
# and calibration. Weight-only rows in int4 (the fixture's group size), W8A8 rows
# in int8_channel_sym with per-token INT8 activations, and the KV-cache rows
# (the unquantized model with a quantized cache). Prints a markdown table and
# keeps the full eval report beside it.
#
#   scripts/methods_table.sh stories   # stories260K, TinyStories held-out half, 256-token windows
#   scripts/methods_table.sh qwen3     # qwen3-26M-linux, linux-eval.txt, 512-token windows
#
# Environment: NIBBLE (the binary), NIBBLE_SHARED, WORK (scratch dir).
set -euo pipefail
which=${1:?usage: methods_table.sh stories|qwen3}
tag=methods-table
# shellcheck source=scripts/fixture_setup.sh
source "$(dirname "$0")/fixture_setup.sh"
cands=()
q() {  # q NAME METHOD FORMAT [extra quantize args...]
  local name=$1 method=$2 format=$3
  shift 3
  # shellcheck disable=SC2086
  "$nibble" quantize -q --method "$method" --format "$format" --model "$model" --out "$work/$name" --force \
    $calib "$@" > /dev/null 2>&1
  cands+=(--candidate "$work/$name")
}
q "rtn" rtn "$int4"
q "gptq" gptq "$int4"
q "awq" awq "$int4"
q "awq+gptq" awq+gptq "$int4"
q "rotate" rotate "$int4"
q "rotate+gptq" rotate+gptq "$int4"
q "w8a8-rtn" rtn int8_channel_sym --activations int8_token
q "w8a8-smoothquant" smoothquant int8_channel_sym --activations int8_token
"$nibble" eval -q --reference "$model" "${cands[@]}" --corpus "$corpus" --ctx $ctx --chunks $chunks \
  --reference-cache "$work/ref-cache" --json "$work/eval.json" > "$work/eval.md"
"$nibble" eval -q --reference "$model" --candidate "$model" --kv int8,int4,fp8_e4m3 --corpus "$corpus" --ctx $ctx \
  --chunks $chunks --reference-cache "$work/ref-cache" --json "$work/eval-kv.json" > "$work/eval-kv.md"
python3 - "$work" "$work/eval.json" "$work/eval-kv.json" <<'PY'
import json, os, sys
work = sys.argv[1]
print("| method | weights | activations | KV cache | bits/weight (linears + head) | KL mean [95 % CI] | KL p99 | top-1 | ppl |")
print("|---|---|---|---|---|---|---|---|---|")
for path in sys.argv[2:]:
    report = json.load(open(path))
    for c in report["candidates"]:
        o = c["overall"]
        name = os.path.basename(c["name"].split(" ")[0].rstrip("/"))
        kv = c.get("kv_cache") or "f32"
        act = c.get("activations") or "—"
        info = os.path.join(work, name, "nibble.json")
        if os.path.exists(info):
            j = json.load(open(info))
            method, fmt = j["method"], j["format"]
            act = j.get("activations", act)
        else:
            method, fmt = "none (reference weights)", "bf16/f32"
        print(f"| {method} | `{fmt}` | {act} | {kv} | {c['bits_per_weight']:.3f} | "
              f"{o['kl_mean']:.5f} [{o['kl_mean_ci95'][0]:.5f}, {o['kl_mean_ci95'][1]:.5f}] | {o['kl_p99']:.4f} | "
              f"{100 * o['top1']:.2f} % | {o['ppl']:.4f} |")
r = json.load(open(sys.argv[2]))
print(f"\nReference ppl {r['candidates'][0]['overall']['ppl_ref']:.4f}; noise floor (bf16 activations) KL "
      f"{r['noise_floor']['kl_mean']:.2g}.")
PY
