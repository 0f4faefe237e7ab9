#!/usr/bin/env python3
"""Independent check of `nibble eval`: recompute its KL, top-1 and perplexities with transformers in float64.

On a machine with torch + transformers + numpy (e.g. the lent GPU machine):

    # token ids both sides use (any int .npy works; this one is the reference's HF tokenization of a text)
    python3 scripts/check_eval_numpy.py --tokenize EVAL.txt --reference REF --tokens ids.npy
    nibble quantize --method rtn --model REF --out Q --group 64
    nibble dequantize --model Q --out Q-hf --dtype f32             # exact: the values nibble's forward uses
    nibble eval --reference REF --candidate Q --corpus ts=ids.npy --ctx 256 --chunks 40 --json r.json
    python3 scripts/check_eval_numpy.py --reference REF --candidate Q-hf --tokens ids.npy --nibble-json r.json

What nibble scores (src/eval/perplexity.cpp make_windows, src/eval/kl.cpp), re-created here from the ids:
  * windows: the ids (flattened, C order) cut into non-overlapping runs of ctx tokens from index 0 — window k is
    ids[k*ctx : (k+1)*ctx] — the shorter tail dropped, only the first W windows kept (W = --chunks when > 0);
  * BOS: the first token of every window is replaced by the BOS id when the reference's tokenizer adds one
    (nibble's leading_bos: encode("a") with special tokens is longer than without; its first id is BOS);
  * scored positions: j = ctx/2 .. ctx-2 (integer ctx/2) of each window, the prediction at j of token j+1:
    ctx - 1 - ctx/2 positions per window; positions are pooled over windows with equal weight.
  * per position: KL(ref || cand) = sum_v p_ref(v) (log p_ref(v) - log p_cand(v)) over the whole vocabulary,
    top-1 agreement (argmax of the two models' logits), NLL of the true next token under each model.
  * kl_mean, top1 = means over positions; ppl_ref, ppl = exp(mean NLL).
ctx, W and the position count come from nibble's JSON (ctx, corpora[NAME].windows / .positions), so the script
scores exactly the windows nibble reported.

Here both models run in float64 (model.double(), eager attention); nibble runs in fp32, so agreement to 1e-4
relative is expected for the means. Two allowances, both printed: KL means also get an absolute 1e-6 (fp32
logits' own rounding; the bf16 noise floor is ~1e-5), and top-1 may differ by the share of positions where either
model's best two logits are within --tie-gap of each other (an fp32 vs fp64 near-tie can flip the argmax).
Exits 1 on any mismatch, 0 when all agree.
"""

import argparse
import json
import math
import sys

import numpy as np


def nibble_windows(ids, ctx, windows, bos):
    """nibble's make_windows: [W, ctx] int64, first token of each window replaced by bos (when not None)."""
    ids = np.asarray(ids).reshape(-1).astype(np.int64)
    n = ids.size // ctx
    if n <= 0:
        raise SystemExit(f"the ids hold {ids.size} tokens, fewer than one window of ctx {ctx}")
    if windows > 0:
        if windows > n:
            raise SystemExit(f"nibble reported {windows} windows, the ids only make {n} of ctx {ctx}")
        n = windows
    w = ids[: n * ctx].reshape(n, ctx).copy()
    if bos is not None:
        w[:, 0] = bos
    return w


def scored_positions(ctx):
    """Positions ctx/2 .. ctx-2 (inclusive): predictions of tokens ctx/2+1 .. ctx-1."""
    return np.arange(ctx // 2, ctx - 1)


def leading_bos(ref_dir):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(ref_dir)
    with_ = tok("a", add_special_tokens=True)["input_ids"]
    without = tok("a", add_special_tokens=False)["input_ids"]
    return with_[0] if len(with_) > len(without) and with_ else None


def load_f64(path, device):
    import torch
    import transformers
    from transformers import AutoModelForCausalLM
    kw = {"dtype": torch.float32}
    ver = tuple(int(x) for x in transformers.__version__.split(".")[:2] if x.isdigit())
    if ver < (4, 56):  # older releases only know torch_dtype
        kw = {"torch_dtype": torch.float32}
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", **kw)
    return model.double().to(device).eval()


def score(ref_dir, cand_dir, windows, ctx, batch, tie_gap, device):
    """Per scored position: KL, top-1 agreement, NLL under both, near-tie flag (numpy float64 arrays)."""
    import torch
    dev = torch.device(device)
    pos = torch.as_tensor(scored_positions(ctx), device=dev)
    ref, cand = load_f64(ref_dir, dev), load_f64(cand_dir, dev)
    kl, agree, nll_r, nll_c, tie = [], [], [], [], []
    with torch.inference_mode():
        for b0 in range(0, windows.shape[0], batch):
            x = torch.as_tensor(windows[b0:b0 + batch], device=dev)           # [B, ctx]
            lr = ref(input_ids=x, use_cache=False).logits[:, pos, :]          # [B, P, V] float64
            lc = cand(input_ids=x, use_cache=False).logits[:, pos, :]
            target = x[:, pos + 1]                                            # [B, P]
            pr, pc = torch.log_softmax(lr, -1), torch.log_softmax(lc, -1)
            kl.append((pr.exp() * (pr - pc)).sum(-1).reshape(-1))
            agree.append((lr.argmax(-1) == lc.argmax(-1)).reshape(-1))
            nll_r.append(-pr.gather(-1, target[..., None])[..., 0].reshape(-1))
            nll_c.append(-pc.gather(-1, target[..., None])[..., 0].reshape(-1))
            if lr.dtype != torch.float64 or lc.dtype != torch.float64:
                raise SystemExit(f"logits came back as {lr.dtype}/{lc.dtype}, not float64 (an old transformers "
                                 "that casts logits to float32?)")
            top_r, top_c = lr.topk(2, -1).values, lc.topk(2, -1).values   # [B, P, 2], descending
            gap_r, gap_c = top_r[..., 0] - top_r[..., 1], top_c[..., 0] - top_c[..., 1]
            tie.append(((gap_r < tie_gap) | (gap_c < tie_gap)).reshape(-1))
    cat = lambda xs: torch.cat(xs).double().cpu().numpy()
    return cat(kl), cat(agree), cat(nll_r), cat(nll_c), cat(tie)


def pick(j, corpus, index):
    cands = j["candidates"]
    if not 0 <= index < len(cands):
        raise SystemExit(f"--candidate-index {index}: the JSON has {len(cands)} candidates")
    c = cands[index]
    names = list(c["corpora"].keys())
    if corpus is None:
        if len(names) != 1:
            raise SystemExit(f"the JSON has corpora {names}: name one with --corpus")
        corpus = names[0]
    if corpus not in c["corpora"]:
        raise SystemExit(f"--corpus {corpus}: the JSON has {names}")
    return c["name"], corpus, c["corpora"][corpus]


def main():
    ap = argparse.ArgumentParser(description="recompute nibble eval's KL/top-1/ppl in float64 with transformers")
    ap.add_argument("--reference", required=True, help="reference HF model directory (what nibble eval --reference got)")
    ap.add_argument("--candidate", help="candidate HF directory: `nibble dequantize --dtype f32` of nibble's candidate")
    ap.add_argument("--tokens", required=True, help=".npy of token ids: the file given to nibble eval --corpus NAME=FILE")
    ap.add_argument("--nibble-json", help="nibble eval --json output")
    ap.add_argument("--corpus", help="corpus NAME in the JSON (default: the only one)")
    ap.add_argument("--candidate-index", type=int, default=0, help="which candidate of the JSON (default 0)")
    ap.add_argument("--bos", help="BOS id, or 'none' (default: from the reference's tokenizer, as nibble does)")
    ap.add_argument("--tokenize", metavar="TEXT", help="only write --tokens: TEXT tokenized by the reference's tokenizer")
    ap.add_argument("--windows-only", action="store_true", help="only re-create the windows and check their counts")
    ap.add_argument("--rtol", type=float, default=1e-4)
    ap.add_argument("--kl-atol", type=float, default=1e-6)
    ap.add_argument("--tie-gap", type=float, default=1e-3, help="logit gap under which a top-1 is a near-tie")
    ap.add_argument("--batch", type=int, default=4, help="windows per forward")
    ap.add_argument("--device", default=None, help="default: cuda if available, else cpu")
    args = ap.parse_args()

    if args.tokenize:
        from transformers import AutoTokenizer
        tok = AutoTokenizer.from_pretrained(args.reference)
        with open(args.tokenize, encoding="utf-8") as f:
            ids = tok(f.read(), add_special_tokens=True)["input_ids"]
        np.save(args.tokens, np.asarray(ids, dtype=np.int32))
        print(f"wrote {args.tokens}: {len(ids)} ids")
        return 0
    if not args.nibble_json:
        ap.error("--nibble-json is required (unless --tokenize)")

    with open(args.nibble_json) as f:
        j = json.load(f)
    name, corpus, nb = pick(j, args.corpus, args.candidate_index)
    ctx = int(j["ctx"])
    if args.bos is None:
        bos = leading_bos(args.reference)
    else:
        bos = None if args.bos.lower() == "none" else int(args.bos)
    windows = nibble_windows(np.load(args.tokens), ctx, int(nb["windows"]), bos)
    per = len(scored_positions(ctx))
    print(f"candidate {name} (JSON #{args.candidate_index}), corpus {corpus}: {windows.shape[0]} windows of {ctx}, "
          f"BOS {bos}, positions {ctx // 2}..{ctx - 2} ({per} per window)")
    if windows.shape[0] * per != int(nb["positions"]):
        print(f"MISMATCH: {windows.shape[0] * per} positions here, nibble scored {nb['positions']}")
        return 1
    if args.windows_only:
        print(f"windows and positions agree with nibble ({nb['positions']} positions)")
        return 0
    if not args.candidate:
        ap.error("--candidate is required")

    import torch
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    kl, agree, nll_r, nll_c, tie = score(args.reference, args.candidate, windows, ctx, args.batch, args.tie_gap, device)
    n = kl.size
    ours = {"kl_mean": kl.mean(), "top1": agree.mean(), "ppl_ref": math.exp(nll_r.mean()), "ppl": math.exp(nll_c.mean())}
    ties = int(tie.sum())
    allow = {"kl_mean": args.kl_atol, "top1": ties / n, "ppl_ref": 0.0, "ppl": 0.0}
    print(f"{n} positions on {device}; near-ties (top-2 logit gap < {args.tie_gap}): {ties}")
    print(f"{'metric':8} {'float64 (here)':>18} {'nibble':>18} {'rel. diff':>10} {'allowed':>10}  ok")
    bad = 0
    for k, v in ours.items():
        ref = float(nb[k])
        tol = args.rtol * abs(ref) + allow[k]
        ok = abs(v - ref) <= tol
        bad += not ok
        rel = abs(v - ref) / abs(ref) if ref else abs(v - ref)
        print(f"{k:8} {v:18.10g} {ref:18.10g} {rel:10.2e} {tol / abs(ref) if ref else tol:10.2e}  "
              f"{'yes' if ok else 'NO'}")
    print("all agree" if not bad else f"{bad} mismatch(es)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
