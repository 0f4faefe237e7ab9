#!/usr/bin/env python3
"""Make the tiny random-weight checkpoints and goldens in tests/data/tiny/ (run on a machine with torch +
transformers + tokenizers; no network needed):

    python3 scripts/make_tiny_fixtures.py --out tests/data/tiny --text ../shared/data/corpora/tinyshakespeare.txt

For each architecture path the shipped fixtures cannot reach (qwen2 q/k/v biases, mistral with a sliding window
shorter than the sequence, llama with `llama3` and with `linear` rope scaling), a checkpoint with random weights
(f32, seeded, each < 1 MB) and transformers' logits for two random token sequences (eager attention, fp32, CPU).
Also a Llama-3-style byte-level BPE tokenizer.json trained with the `tokenizers` library (Llama 3's pre-tokenizer
regex, ignore_merges) and that library's ids for a varied set of strings.
"""
import argparse
import json
import os
import zlib

import torch
import transformers
from safetensors.torch import save_file

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")

BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-5,
            tie_word_embeddings=False)

CASES = {
    "qwen2-bias": (transformers.Qwen2Config, dict(rope_theta=1e6)),
    "mistral-swa": (transformers.MistralConfig, dict(sliding_window=16, rope_theta=1e4, head_dim=16)),
    "llama3-rope": (transformers.LlamaConfig, dict(rope_theta=5e5, rope_scaling=dict(
        rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=32))),
    "llama-linear-tied": (transformers.LlamaConfig, dict(rope_theta=1e4, tie_word_embeddings=True,
                                                        rope_scaling=dict(rope_type="linear", factor=2.0))),
}


def make_model(name, cls, extra, out):
    torch.manual_seed(zlib.crc32(name.encode()))  # fixed per case (hash() is salted per process)
    cfg = cls(**{**BASE, **extra})
    cfg._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(cfg, torch_dtype=torch.float32)
    with torch.no_grad():  # larger-than-init weights so the logits are not all ~0
        for n, p in model.named_parameters():
            if "norm" in n:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif n.endswith("bias"):
                p.copy_(0.5 * torch.randn_like(p))
            else:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5 * (4.0 if "embed" in n else 1.0))
    model.eval()
    d = os.path.join(out, name)
    model.save_pretrained(d, safe_serialization=True)
    g = torch.Generator().manual_seed(7)
    tensors = {}
    for i, T in enumerate([40, 97]):
        ids = torch.randint(0, BASE["vocab_size"], (1, T), generator=g)
        with torch.no_grad():
            logits = model(ids).logits[0].float()
        tensors[f"seq{i}.input_ids"] = ids[0].to(torch.int32).contiguous()
        tensors[f"seq{i}.logits"] = logits.contiguous()
    save_file(tensors, os.path.join(d, "golden_logits.safetensors"))
    print(name, "params", sum(p.numel() for p in model.parameters()), "max|logit|",
          float(tensors["seq1.logits"].abs().max()))


def make_tokenizer(text_path, out):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=["<|begin_of_text|>", "<|end_of_text|>"])
    with open(text_path, encoding="utf-8") as f:
        text = f.read()[:300_000]
    tok.train_from_iterator([text[i:i + 2000] for i in range(0, len(text), 2000)], trainer)
    d = os.path.join(out, "llama3-tokenizer")
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    strings = ["Hello world", "I'm 12345 years old, isn't it?", "  leading and trailing  ", "tabs\tand\nnewlines\r\n",
               "ROMEO: What's in a name? That which we call a rose", "caf\u00e9 na\u00efve \u65e5\u672c\u8a9e \U0001F600",
               "x=1234567890;y=3.14159", "WE'LL SEE THEY'RE HERE", "", " ", "\n\n\n", "a\u00a0b", "don't STOP",
               "<|begin_of_text|>Hi<|end_of_text|>", "ends with spaces   ", "multi\n\n  line\n text"]
    cases = [{"text": s, "ids": tok.encode(s).ids, "decode": tok.decode(tok.encode(s).ids)} for s in strings]
    with open(os.path.join(d, "golden.json"), "w", encoding="utf-8") as f:
        json.dump({"tokenizers": __import__("tokenizers").__version__, "cases": cases}, f, ensure_ascii=False,
                  indent=1)
    print("tokenizer vocab", tok.get_vocab_size())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--text", required=True)
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    for name, (cls, extra) in CASES.items():
        make_model(name, cls, extra, a.out)
    make_tokenizer(a.text, a.out)
    with open(os.path.join(a.out, "VERSIONS.json"), "w") as f:
        json.dump({"torch": torch.__version__, "transformers": transformers.__version__}, f)


if __name__ == "__main__":
    main()
