#!/usr/bin/env python3
"""Rivals' own quantization algorithms on a model, for the head-to-head in
docs/results/rival-checkpoints.md: each writes its checkpoint, which nibble then
reads (RivalSource) and measures on the same ruler as its own.

    /tmp/rv/bin/python scripts/run_rival_quantizers.py MODEL CALIB.txt OUT [NAME ...]

NAME (all when none): gptqmodel (GPTQModel's GPTQ, its defaults), gptqmodel-desc-act
(the same with desc_act=True), autoround (Intel's AutoRound, 200 iterations,
its auto_round format). All are 4-bit, groups of 128, asymmetric, lm_head kept,
calibrated on 128 sequences of 512 tokens: the first 65 536 tokens of CALIB.txt
through the model's tokenizer, as `nibble quantize --calib CALIB.txt
--calib-samples 128 --calib-len 512 --calib-windows first` takes them (without
--calib-windows first, nibble draws its windows at random starts in the whole
file: another calibration set).

Needs torch, transformers, gptqmodel and auto-round (see make_rival_vectors.py
for the venv); on a small CPU machine set GPTQMODEL_CPU_WORKERS=2.
"""
import sys
import time
from pathlib import Path

MODEL, CALIB, OUT = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
ONLY = set(sys.argv[4:])
SAMPLES, LEN = 128, 512


def calibration(tok):
    ids = tok(CALIB.read_text())["input_ids"]
    assert len(ids) >= SAMPLES * LEN, f"{CALIB}: {len(ids)} tokens, need {SAMPLES * LEN}"
    return [ids[i * LEN:(i + 1) * LEN] for i in range(SAMPLES)]


def gptqmodel(name, desc_act):
    from gptqmodel import GPTQModel, QuantizeConfig
    from transformers import AutoTokenizer

    calib = [{"input_ids": s, "attention_mask": [1] * LEN} for s in calibration(AutoTokenizer.from_pretrained(MODEL))]
    model = GPTQModel.load(MODEL, QuantizeConfig(bits=4, group_size=128, sym=False, desc_act=desc_act), device="cpu")
    model.quantize(calib, batch_size=1)
    model.save(str(OUT / name))


def autoround(name):
    import torch
    from auto_round import AutoRound
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(MODEL)
    model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.float32)
    # AutoRound takes text: the same token windows, decoded (it re-tokenizes them).
    calib = [tok.decode(s) for s in calibration(tok)]
    ar = AutoRound(model, tok, bits=4, group_size=128, sym=False, dataset=calib, seqlen=LEN, nsamples=SAMPLES,
                   iters=200, device_map="cpu")
    ar.quantize_and_save(str(OUT / name), format="auto_round")


RUNS = {
    "gptqmodel": lambda: gptqmodel("gptqmodel", False),
    "gptqmodel-desc-act": lambda: gptqmodel("gptqmodel-desc-act", True),
    "autoround": lambda: autoround("autoround"),
}
for name, run in RUNS.items():
    if ONLY and name not in ONLY:
        continue
    t = time.time()
    run()
    print(f"{name}: {time.time() - t:.1f} s -> {OUT / name}", flush=True)
