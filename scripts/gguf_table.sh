#!/usr/bin/env bash
# llama.cpp's legacy quantizations against nibble's at the same bits on one real
# fixture, through the same forward and the same KL yardstick: Q4_0 (4.5 bits a
# weight) against int4 g64 (4.5) and int4 g32 sym (4.5, Q4_0's layout), Q4_1
# (5.0) against int4 g32 (5.0), and Q5_0, Q5_1, Q8_0 beside them. The GGUF
# files are written by scripts/make_gguf_rivals.py (gguf-py's reference
# rounding, checked bit-exact against llama-quantize's own files of stories260K
# first); nibble's by RTN and GPTQ, each also with --mse, with the yardstick
# tables' calibration (scripts/fixture_setup.sh). Prints a markdown table and
# keeps the full eval report beside it.
#
#   scripts/gguf_table.sh qwen3     # qwen3-26M-linux (widths 512 / 1536: every block type fits)
#
# Environment: NIBBLE (the binary), NIBBLE_SHARED, WORK (scratch dir).
set -euo pipefail
which=${1:?usage: gguf_table.sh qwen3}
tag=gguf-table
# shellcheck source=scripts/fixture_setup.sh
source "$(dirname "$0")/fixture_setup.sh"
python3 "$here/scripts/make_gguf_rivals.py" --check-against "$shared/models/stories260K/gguf" >&2
python3 "$here/scripts/make_gguf_rivals.py" "$model" "$work/gguf" >&2
cands=()
for t in F32 Q8_0 Q5_1 Q5_0 Q4_1 Q4_0; do cands+=(--candidate "gguf:$work/gguf/$(basename "$model")-$t.gguf"); done
# int4_g32_sym is Q4_0's own layout (symmetric codes, an fp16 scale per 32 inputs: 4.5 bits a weight).
for fmt in int4_g32_asym int4_g64_asym int4_g128_asym int4_g32_sym; do
  for m in rtn rtn-mse gptq gptq-mse; do
    flags=()
    case $m in *-mse) flags+=(--mse) ;; esac
    # shellcheck disable=SC2206
    case $m in gptq*) flags+=($calib) ;; esac
    "$nibble" quantize -q --method "${m%-mse}" --format $fmt --model "$model" \
      --out "$work/${m}_$fmt" --force "${flags[@]}" > /dev/null
    cands+=(--candidate "$work/${m}_$fmt")
  done
done
"$nibble" eval -q --reference "$model" "${cands[@]}" --corpus "$corpus" --ctx $ctx --chunks $chunks \
  --reference-cache "$work/ref-cache" --json "$work/eval.json" > "$work/eval.md"
python3 - "$work/eval.json" <<'PY'
import json, os, sys
report = json.load(open(sys.argv[1]))
print("| checkpoint | bits/weight (linears + head) | KL mean [95 % CI] | KL p99 | top-1 [95 % CI] | ppl |")
print("|---|---|---|---|---|---|")
for c in report["candidates"]:
    name = os.path.basename(c["name"].rstrip("/"))
    if name.endswith(".gguf"):
        name = "llama.cpp " + name.rsplit("-", 1)[1][:-5] + " (gguf-py)"
    else:
        method, fmt = name.split("_", 1)
        method = method.replace("-mse", " --mse")
        name = f"nibble {method} `{fmt}`"
    o = c["overall"]
    print(f"| {name} | {c['bits_per_weight']:.3f} | "
          f"{o['kl_mean']:.5f} [{o['kl_mean_ci95'][0]:.5f}, {o['kl_mean_ci95'][1]:.5f}] | {o['kl_p99']:.4f} | "
          f"{100 * o['top1']:.2f} % [{100 * o['top1_ci95'][0]:.2f}, {100 * o['top1_ci95'][1]:.2f}] | "
          f"{o['ppl']:.4f} |")
print(f"\nReference ppl {report['candidates'][0]['overall']['ppl_ref']:.4f}; noise floor (bf16 activations) KL "
      f"{report['noise_floor']['kl_mean']:.2g}.")
PY
