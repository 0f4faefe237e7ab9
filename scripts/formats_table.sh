#!/usr/bin/env bash
# Every storage format of the registry on one real fixture: quantize with RTN
# (and GPTQ for the formats listed in GPTQ_FORMATS), then the KL yardstick
# against the reference with the same windows and corpora as the README's GPTQ
# tables (scripts/gptq_table.sh); prints a markdown table of bits per weight,
# KL mean, KL p99, top-1 and perplexity per format, and keeps the full eval
# report beside it.
#
#   scripts/formats_table.sh stories   # stories260K, TinyStories held-out half, 256-token windows
#   scripts/formats_table.sh qwen3     # qwen3-26M-linux, linux-eval.txt, 512-token windows
#
# Environment: NIBBLE (the binary), NIBBLE_SHARED, WORK (scratch dir),
# FORMATS (space-separated, default: every canonical name of the registry),
# GPTQ_FORMATS (space-separated formats also run with GPTQ, default none),
# REFINE_FORMATS (formats also run with GPTQ --refine 30, default none).
set -euo pipefail
which=${1:?usage: formats_table.sh stories|qwen3}
tag=formats-table
# shellcheck source=scripts/fixture_setup.sh
source "$(dirname "$0")/fixture_setup.sh"
# Every canonical name, from the registry itself (`nibble inspect --formats`).
formats=${FORMATS:-$("$nibble" inspect --formats | awk 'NR > 1 {print $1}')}
cands=()
for f in $formats; do
  "$nibble" quantize -q --method rtn --format "$f" --model "$model" --out "$work/rtn_$f" --force > /dev/null
  cands+=(--candidate "$work/rtn_$f")
done
for f in ${GPTQ_FORMATS:-}; do
  # shellcheck disable=SC2086
  "$nibble" quantize -q --method gptq --format "$f" --model "$model" --out "$work/gptq_$f" --force $calib > /dev/null
  cands+=(--candidate "$work/gptq_$f")
done
for f in ${REFINE_FORMATS:-}; do
  # shellcheck disable=SC2086
  "$nibble" quantize -q --method gptq --refine 30 --format "$f" --model "$model" --out "$work/gptq-refine_$f" --force \
    $calib > /dev/null
  cands+=(--candidate "$work/gptq-refine_$f")
done
"$nibble" eval -q --reference "$model" "${cands[@]}" --corpus "$corpus" --ctx $ctx --chunks $chunks \
  --reference-cache "$work/ref-cache" --json "$work/eval.json" > "$work/eval.md"
python3 - "$work" "$work/eval.json" <<'PY'
import json, os, sys
work, report = sys.argv[1], json.load(open(sys.argv[2]))
print("| format | method | bits/weight (linears + head) | KL mean [95 % CI] | KL p99 | top-1 [95 % CI] | ppl |")
print("|---|---|---|---|---|---|---|")
ref_ppl = None
for c in report["candidates"]:
    name = os.path.basename(c["name"].rstrip("/"))
    method, fmt = name.split("_", 1)
    method = {"gptq-refine": "gptq --refine 30"}.get(method, method)
    o = c["overall"]
    ref_ppl = o["ppl_ref"]
    print(f"| `{fmt}` | {method} | {c['bits_per_weight']:.3f} | "
          f"{o['kl_mean']:.5f} [{o['kl_mean_ci95'][0]:.5f}, {o['kl_mean_ci95'][1]:.5f}] | {o['kl_p99']:.4f} | "
          f"{100 * o['top1']:.2f} % [{100 * o['top1_ci95'][0]:.2f}, {100 * o['top1_ci95'][1]:.2f}] | "
          f"{o['ppl']:.4f} |")
print(f"\nReference ppl {ref_ppl:.4f}; noise floor (bf16 activations) KL {report['noise_floor']['kl_mean']:.2g}.")
PY
