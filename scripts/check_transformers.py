#!/usr/bin/env python3
"""Compare an original HF model with nibble's dequantized copy under transformers.

    python3 scripts/check_transformers.py --original ../shared/models/stories260K \
        --dequantized out/stories-rtn-hf --prompt "Once upon a time" --out stories.json

Both are loaded with AutoModelForCausalLM in float32 (cuda if available, else cpu). Reports, for the
prompt: max |logit difference|, KL(original || dequantized) averaged over positions, top-1 agreement;
then greedy-generates N new tokens from each and prints both texts. Needs torch + transformers only
(no network: both directories must be complete).
"""

import argparse
import json
import os
import sys

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def load_model(path, device):
    kw = {"dtype": torch.float32}
    ver = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
    if ver < (4, 56):  # older releases only know torch_dtype
        kw = {"torch_dtype": torch.float32}
    model, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True, **kw)
    model = model.float().to(device).eval()   # bf16 -> f32 is exact; makes the dtype certain
    info = {k: sorted(v) if isinstance(v, (set, list)) else str(v) for k, v in info.items()}
    return model, info


def main():
    ap = argparse.ArgumentParser(description="original vs dequantized model under transformers")
    ap.add_argument("--original", required=True)
    ap.add_argument("--dequantized", required=True)
    ap.add_argument("--prompt", default="Once upon a time")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--out", help="write a JSON summary here")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()

    torch.manual_seed(0)
    dev = torch.device(args.device)
    tok = AutoTokenizer.from_pretrained(args.original)
    enc = tok(args.prompt, return_tensors="pt").to(dev)
    ids = enc["input_ids"]
    mask = enc.get("attention_mask")
    if mask is None:
        mask = torch.ones_like(ids)

    res = {"original": args.original, "dequantized": args.dequantized, "prompt": args.prompt,
           "prompt_ids": ids[0].tolist(), "device": str(dev), "torch": torch.__version__,
           "transformers": transformers.__version__, "max_new_tokens": args.max_new_tokens}
    logits, gens = {}, {}
    for tag, path in (("original", args.original), ("dequantized", args.dequantized)):
        model, info = load_model(path, dev)
        res[tag + "_loading"] = info
        emb, head = model.get_input_embeddings(), model.get_output_embeddings()
        res[tag + "_head_tied"] = bool(head is not None and head.weight.data_ptr() == emb.weight.data_ptr())
        pad = tok.pad_token_id if tok.pad_token_id is not None else model.config.eos_token_id
        if isinstance(pad, (list, tuple)):
            pad = pad[0]
        with torch.inference_mode():
            logits[tag] = model(input_ids=ids, attention_mask=mask).logits[0].float()
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.max_new_tokens,
                                 do_sample=False, num_beams=1, pad_token_id=pad)
        gens[tag] = out[0, ids.shape[1]:].tolist()
        del model
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    # A dequantized directory with its own tokenizer (one nibble wrote from a GGUF file's tokenizer.ggml.*):
    # the same ids as the original's tokenizer, through the tokenizers library.
    if os.path.exists(os.path.join(args.dequantized, "tokenizer.json")):
        tok_d = AutoTokenizer.from_pretrained(args.dequantized)
        texts = [args.prompt, " two  spaces, digits 12345, caf\u00e9 \U0001F600\n\nand a newline", "x" * 50]
        same = [tok(t)["input_ids"] == tok_d(t)["input_ids"] for t in texts]
        res["tokenizer_same_ids"] = all(same)
        print(f"dequantized tokenizer: the original's ids on {sum(same)} of {len(texts)} texts")

    lo, ld = logits["original"], logits["dequantized"]
    lp_o, lp_d = torch.log_softmax(lo.double(), -1), torch.log_softmax(ld.double(), -1)
    kl = (lp_o.exp() * (lp_o - lp_d)).sum(-1)           # per position, KL(original || dequantized)
    agree = (lo.argmax(-1) == ld.argmax(-1)).float()
    go, gd = gens["original"], gens["dequantized"]
    prefix = next((i for i, (a, b) in enumerate(zip(go, gd)) if a != b), min(len(go), len(gd)))
    res.update({
        "positions": int(lo.shape[0]),
        "max_abs_logit_diff": float((lo - ld).abs().max()),
        "mean_kl": float(kl.mean()),
        "max_kl": float(kl.max()),
        "top1_agreement": float(agree.mean()),
        "generated_ids": gens,
        "generated_text": {k: tok.decode(v, skip_special_tokens=True) for k, v in gens.items()},
        "generated_identical": go == gd,
        "generated_common_prefix": prefix,
    })

    print(f"prompt {args.prompt!r}: {res['positions']} positions on {dev}")
    for tag in ("original", "dequantized"):
        miss = res[tag + "_loading"].get("missing_keys", [])
        unexp = res[tag + "_loading"].get("unexpected_keys", [])
        if miss or unexp:
            print(f"WARNING {tag}: missing keys {miss[:8]}, unexpected keys {unexp[:8]}")
        print(f"{tag}: head tied to embedding: {res[tag + '_head_tied']}")
    print(f"max |logit diff| {res['max_abs_logit_diff']:.6g}   mean KL {res['mean_kl']:.6g} "
          f"(max {res['max_kl']:.6g})   top-1 agreement {res['top1_agreement']:.4f}")
    for tag in ("original", "dequantized"):
        print(f"--- {tag} greedy ({len(gens[tag])} tokens):\n{args.prompt}{res['generated_text'][tag]}")
    print(f"--- generations identical: {res['generated_identical']} (common prefix {prefix} tokens)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
