#!/usr/bin/env python3
"""Writes variants.json: goldens from HF `tokenizers` for tokenizer.json variants
that the shared fixtures do not cover (Metaspace pre-tokenizer schemes, a
Llama-3-style Split regex + ignore_merges, GPT-2 ByteLevel regex, NFC/NFD,
added-token flags, unk without byte fallback, RobertaProcessing, truncation,
BPE continuing_subword_prefix / end_of_word_suffix).

Each variant is a base fixture tokenizer.json (stories260K or qwen3-26M-linux
from shared/models) with some top-level components replaced ("set"), model
fields overridden ("model") and added tokens appended ("added_tokens"); the
test (TokenizerVariants in tests/unit/test_tokenizer.cpp) applies the same edits and
compares its ids and decodes with the ones stored here.
"bpe_affixes" is a whole tokenizer.json trained here (it is small).

Usage: python3 make_goldens.py [--shared ../../../../shared]   (needs `pip install tokenizers`)
"""
import argparse
import copy
import json
import os
import random
import tempfile

import tokenizers
from tokenizers import Tokenizer

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SP = "\u2581"

COMMON = [
    "Hello world", " leading space", "   ", "trailing  ", "a  b   c", "", "x",
    "I'm 12345 years old, you'RE sure? They'LL see", "line1\n\n\nline2\r\n", "tabs\tand\u00a0nbsp",
    "caf\u00e9 na\u00efve e\u0301 A\u030a", "\u65e5\u672c\u8a9e \U0001F600 \U0001F44D\U0001F3FD", SP + "already " + SP + SP + "two",
    "x<s>y</s> z <unk>", "<|im_start|>user\nhi<|im_end|>\n", "\u216b \u00bd \u00b2 \u0661\u0663",
    "a\u180eb\u0085c\u2028d\u3000e", "don't  stop--now...", "3.14159 and 1,000,000", "  \n  \n", "\n",
    "Once upon a time, there was a little girl named Lily.",
    "if (x->y && !z) { return -EINVAL; }\n\tfoo_bar(baz);",
]


def fuzz(n, seed):
    rng = random.Random(seed)
    alphabet = (list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") * 2 + list(" " * 20) +
                list("\t\n\r.,;:!?'\"()<>-_=+*/\\|#$%") + ["'s", "'LL", "'ve", "\u00a0", "\u0085", "\u3000", "\u00e9",
                                                          "e\u0301", "\u00df", "\u65e5", "\U0001F600", "\u00bd", SP])
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 20))) for _ in range(n)]


def added(id_, content, special=False, normalized=None, lstrip=False, rstrip=False, single_word=False):
    return {"id": id_, "content": content, "single_word": single_word, "lstrip": lstrip, "rstrip": rstrip,
            "normalized": (not special) if normalized is None else normalized, "special": special}


def metaspace(scheme, split, legacy=None):
    if legacy is not None:
        return {"type": "Metaspace", "replacement": SP, "add_prefix_space": legacy}
    return {"type": "Metaspace", "replacement": SP, "prepend_scheme": scheme, "split": split}


def byte_level(add_prefix_space, use_regex):
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True, "use_regex": use_regex}


def split(pattern, behavior, invert=False, kind="Regex"):
    return {"type": "Split", "pattern": {kind: pattern}, "behavior": behavior, "invert": invert}


SPM_DECODER = {"type": "Sequence", "decoders": [
    {"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"}, {"type": "Fuse"},
    {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
BOS_TEMPLATE = {"type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}

VARIANTS = [
    # --- SentencePiece-style on the stories260K vocab ---
    dict(name="metaspace_first_nosplit", base="stories260K",
         set={"normalizer": None, "pre_tokenizer": metaspace("first", False), "decoder": metaspace("first", False)}),
    dict(name="metaspace_always_split", base="stories260K",
         set={"normalizer": None, "pre_tokenizer": metaspace("always", True), "decoder": metaspace("always", True)}),
    dict(name="metaspace_never_split_spm_decoder", base="stories260K",
         set={"normalizer": None, "pre_tokenizer": metaspace("never", True), "decoder": SPM_DECODER}),
    dict(name="metaspace_legacy_add_prefix_space", base="stories260K",
         set={"normalizer": None, "pre_tokenizer": metaspace(None, None, legacy=True),
              "decoder": metaspace(None, None, legacy=True)}),
    dict(name="unk_fused_no_byte_fallback", base="stories260K", model={"byte_fallback": False, "fuse_unk": True}),
    dict(name="unk_unfused_no_byte_fallback", base="stories260K", model={"byte_fallback": False, "fuse_unk": False}),
    dict(name="spm_added_token_flags", base="stories260K",
         added_tokens=[added(512, "<tag>"), added(513, "[MASK]", special=True, lstrip=True, rstrip=True),
                       added(514, "word", single_word=True, normalized=False), added(515, "Lily")],
         texts=["<tag> x <tag>", "a [MASK] b  [MASK]  c[MASK]d", "word words sword word_ word.", "Lily and Lily",
                " Lily", "<tag>Lily[MASK]word"]),
    dict(name="nfd_strip_replace_regex", base="stories260K",
         set={"normalizer": {"type": "Sequence", "normalizers": [
             {"type": "NFD"}, {"type": "Strip", "strip_left": True, "strip_right": True},
             {"type": "Replace", "pattern": {"Regex": " {2,}"}, "content": " "},
             {"type": "Prepend", "prepend": SP}, {"type": "Replace", "pattern": {"String": " "}, "content": SP}]}}),
    dict(name="bert_style_bos_eos", base="stories260K",
         set={"post_processor": {"type": "BertProcessing", "sep": ["</s>", 2], "cls": ["<s>", 1]}}),
    dict(name="truncation_left", base="stories260K",
         set={"truncation": {"direction": "Left", "max_length": 6, "strategy": "LongestFirst", "stride": 0}}),
    # --- byte-level on the qwen3-26M-linux vocab ---
    dict(name="llama3_style", base="qwen3-26M-linux", model={"ignore_merges": True},
         set={"pre_tokenizer": {"type": "Sequence", "pretokenizers": [split(LLAMA3_REGEX, "Isolated"),
                                                                       byte_level(False, False)]},
              "post_processor": {"type": "Sequence", "processors": [
                  {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
                  {"type": "TemplateProcessing",
                   "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}},
                              {"Sequence": {"id": "A", "type_id": 0}}],
                   "pair": [], "special_tokens": {"<|begin_of_text|>": {
                       "id": "<|begin_of_text|>", "ids": [8192], "tokens": ["<|begin_of_text|>"]}}}]}},
         added_tokens=[added(8192, "<|begin_of_text|>", special=True), added(8193, "<|eot_id|>", special=True)],
         texts=["<|begin_of_text|>Hi<|eot_id|>", "static int main(void)\n{\n\treturn 0;\n}\n"]),
    dict(name="gpt2_byte_level_regex", base="qwen3-26M-linux", set={"pre_tokenizer": byte_level(False, True)}),
    dict(name="gpt2_add_prefix_space", base="qwen3-26M-linux", set={"pre_tokenizer": byte_level(True, True)}),
    dict(name="qwen2_nfc", base="qwen3-26M-linux", set={"normalizer": {"type": "NFC"}},
         texts=["e\u0301\u0323 \u1e0b\u0323 \u0041\u030a\u0301 \u1100\u1161\u11a8 \u212b \u0344 \u0f73 \u0958"]),
    dict(name="split_behaviors", base="qwen3-26M-linux",
         set={"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
             split(" ", "MergedWithPrevious", kind="String"), split(r"\p{P}", "Contiguous"),
             split(r"\s+", "Removed", invert=True), {"type": "Digits", "individual_digits": True},
             split("o", "MergedWithNext", kind="String"), byte_level(False, False)]}}),
    dict(name="digits_runs_removed", base="qwen3-26M-linux",
         set={"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
             split(r"\s+", "Removed"), {"type": "Digits", "individual_digits": False}, byte_level(False, False)]}}),
    dict(name="byte_level_added_token_flags", base="qwen3-26M-linux", set={"normalizer": {"type": "NFC"}},
         added_tokens=[added(8192, "<mask>", special=True, lstrip=True), added(8193, "foo", single_word=True),
                       added(8194, "e\u0301x", normalized=True), added(8195, "ab", rstrip=True, normalized=False),
                       added(8196, "abc", normalized=False)],
         texts=["a <mask> b", "foo foobar barfoo foo_ (foo)", "\u00e9x e\u0301x", "ab  abc abcd", "  <mask>  "]),
    dict(name="roberta_post", base="qwen3-26M-linux",
         set={"post_processor": {"type": "RobertaProcessing", "sep": ["<|im_end|>", 2], "cls": ["<|im_start|>", 1],
                                 "trim_offsets": True, "add_prefix_space": False}}),
]


def case(tok, text):
    enc = tok.encode(text, add_special_tokens=False).ids
    return {"text": text, "ids": enc, "ids_with_special": tok.encode(text).ids,
            "decode": tok.decode(enc, skip_special_tokens=True), "decode_keep_special": tok.decode(enc, skip_special_tokens=False)}


def apply(base_json, v):
    j = copy.deepcopy(base_json)
    for k, val in v.get("set", {}).items():
        j[k] = val
    for k, val in v.get("model", {}).items():
        j["model"][k] = val
    j["added_tokens"] = j["added_tokens"] + v.get("added_tokens", [])
    return j


def train_affixes():
    from tokenizers import models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token="[UNK]", continuing_subword_prefix="##", end_of_word_suffix="</w>"))
    tok.pre_tokenizer = pre_tokenizers.Split(tokenizers.Regex(r"\s+"), "removed")
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["[UNK]"], continuing_subword_prefix="##",
                                  end_of_word_suffix="</w>", show_progress=False)
    text = ("Once upon a time there was a little girl named Lily. She liked to play in the park with her dog. "
            "The dog was happy and they played all day until the sun went down. ") * 20
    tok.train_from_iterator([text], trainer)
    return json.loads(tok.to_str())


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=os.path.join(here, "..", "..", "..", "..", "shared"))
    args = ap.parse_args()
    out = {"generated_by": f"make_goldens.py with tokenizers {tokenizers.__version__}",
           "note": "decode: skip_special_tokens=True (the Python default); decode_keep_special: False",
           "variants": []}
    texts_all = COMMON + fuzz(40, 1)
    for v in VARIANTS:
        with open(os.path.join(args.shared, "models", v["base"], "tokenizer.json"), encoding="utf-8") as f:
            j = apply(json.load(f), v)
        tok = Tokenizer.from_str(json.dumps(j))
        entry = {k: v[k] for k in ("name", "base", "set", "model", "added_tokens") if k in v}
        entry["cases"] = [case(tok, t) for t in texts_all + v.get("texts", [])]
        out["variants"].append(entry)
    aff = train_affixes()
    tok = Tokenizer.from_str(json.dumps(aff))
    out["variants"].append({"name": "bpe_affixes", "tokenizer": aff,
                            "cases": [case(tok, t) for t in ["Once upon a time", "Lily liked the dog.", "dogs parked",
                                                             "zzz qq", "a", "  the   sun  "] + fuzz(10, 2)]})
    with open(os.path.join(here, "variants.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=True, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
