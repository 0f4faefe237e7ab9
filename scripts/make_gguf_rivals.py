#!/usr/bin/env python3
"""llama.cpp's legacy quantizations of a Hugging Face checkpoint, for a same-bits
comparison with nibble on one ruler (docs/results/gguf-same-bits.md).

    python3 scripts/make_gguf_rivals.py MODEL OUT [TYPE ...]

MODEL: a Hugging Face dir of the Llama family (llama, qwen2, qwen3; safetensors).
TYPE: F32, Q8_0, Q5_1, Q5_0, Q4_1, Q4_0 (all when none). Each writes
OUT/<model>-<TYPE>.gguf: the decoder linears and the head (lm_head, where the
model has its own) in TYPE, what `llama-quantize --pure` stores for those
tensors, and the embeddings and norms in F32 (nibble keeps them unquantized too;
llama-quantize's default mixes would also quantize token_embd and put the head in
Q6_K). The quantizer is gguf-py's (the `gguf` package, llama.cpp's own Python
library), whose reference rounding --check-against finds bit-exact against
llama-quantize's files. Tensor names, q/k row order (llama only: the interleaved
RoPE pairs of llama.cpp's converter) and metadata follow llama.cpp's converter,
so nibble reads these as it reads any llama.cpp GGUF (`gguf:PATH`).

    python3 scripts/make_gguf_rivals.py --check-against ../shared/models/stories260K/gguf

requantizes the F32 file there and compares every Q4_0 / Q4_1 / Q5_0 / Q5_1 /
Q8_0 tensor of llama-quantize's files (those made without an importance matrix)
with gguf-py's bytes.

Needs numpy and gguf (scripts/install-deps.sh installs both); safetensors are
read by tests/py/read_packed.py (numpy alone).
"""
import json
import sys
from pathlib import Path

import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "py"))
from read_packed import load_plain_f32  # noqa: E402  (the repository's numpy reader of HF safetensors dirs)

TYPES = {"F32": Q.F32, "Q8_0": Q.Q8_0, "Q5_1": Q.Q5_1, "Q5_0": Q.Q5_0, "Q4_1": Q.Q4_1, "Q4_0": Q.Q4_0}
LAYER = {  # Hugging Face name inside model.layers.N -> llama.cpp's name inside blk.N
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "ffn_norm", "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}
QUANTIZED = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "output"}


def die(msg):
    sys.exit(f"make_gguf_rivals: {msg}")


def gguf_name(hf):
    base, suffix = hf.rsplit(".", 1)
    if base.startswith("model.layers."):
        layer, rest = base[len("model.layers."):].split(".", 1)
        if rest in LAYER:
            return f"blk.{layer}.{LAYER[rest]}.{suffix}"
    elif base in GLOBAL:
        return f"{GLOBAL[base]}.{suffix}"
    die(f"tensor {hf} has no llama.cpp name")


def permute(w, heads):
    """llama.cpp's converter order for a llama q / k projection: each head's rows as
    [2, head_dim/2], axes swapped (rows 2j + h hold HF row h·head_dim/2 + j)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write(model, cfg, tensors, qtype, path):
    arch = cfg["model_type"]
    if arch not in ("llama", "qwen2", "qwen3", "mistral"):
        die(f"{model}: model_type {arch} is not of the Llama family (llama, mistral, qwen2, qwen3)")
    if arch == "mistral":
        arch = "llama"  # llama.cpp writes Mistral 7B as llama
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads", cfg["num_attention_heads"])
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(model.name)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg.get("max_position_embeddings", 2048))
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg.get("rope_parameters") or {}  # transformers 5 keeps rope_theta here
    w.add_rope_freq_base(rope.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    if scaling:
        die(f"{model}: RoPE scaling {scaling} is not written by this script")
    bits = total = 0
    for hf, t in tensors.items():
        if hf.endswith("rotary_emb.inv_freq"):
            continue  # a buffer some older checkpoints carry; llama.cpp's converter drops it too
        name = gguf_name(hf)
        base = name.split(".")[-2]
        if arch == "llama" and base in ("attn_q", "attn_k"):
            t = permute(t, heads if base == "attn_q" else kv)
        t = np.ascontiguousarray(t, dtype=np.float32)
        if base in QUANTIZED and name.endswith(".weight") and qtype != Q.F32:
            if t.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0]:
                die(f"{hf}: {t.shape[-1]} inputs are not a multiple of {qtype.name}'s block")
            data = quantize(t, qtype)
            w.add_tensor(name, data, raw_dtype=qtype)
            bits += data.nbytes * 8
            total += t.size
        else:
            w.add_tensor(name, t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return bits / total if total else 32.0


def check_against(folder):
    """gguf-py's quantizers against llama-quantize's files of the same F32 source."""
    folder = Path(folder)
    src = {t.name: t for t in gguf.GGUFReader(next(folder.glob("*-F32.gguf"))).tensors}
    exact = differ = 0
    for path in sorted(folder.glob("*.gguf")):
        if "imatrix" in path.name:
            continue  # quantized with an importance matrix, which gguf-py's reference rounding does not take
        for t in gguf.GGUFReader(path).tensors:
            if t.tensor_type not in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
                continue
            s = src[t.name]
            x = np.asarray(s.data, dtype=np.float32).reshape(-1, int(s.shape[0]))
            same = np.array_equal(np.asarray(quantize(x, t.tensor_type)).view(np.uint8).reshape(-1),
                                  np.asarray(t.data).view(np.uint8).reshape(-1))
            exact += same
            differ += not same
            if not same:
                print(f"{path.name}: {t.name} ({t.tensor_type.name}) differs")
    print(f"gguf-py against llama-quantize: {exact} tensors bit-exact, {differ} differ")
    return differ == 0 and exact > 0


def main(argv):
    if len(argv) == 2 and argv[0] == "--check-against":
        return 0 if check_against(argv[1]) else 1
    if len(argv) < 2 or argv[0].startswith("-"):
        print(__doc__, file=sys.stderr)
        return 2
    model, out = Path(argv[0]), Path(argv[1])
    names = argv[2:] or list(TYPES)
    for n in names:
        if n not in TYPES:
            die(f"unknown type {n} (known: {', '.join(TYPES)})")
    if not (model / "config.json").is_file():
        die(f"{model}: no config.json (a Hugging Face checkpoint dir is expected)")
    cfg = json.loads((model / "config.json").read_text())
    tensors = load_plain_f32(str(model))
    out.mkdir(parents=True, exist_ok=True)
    for n in names:
        path = out / f"{model.name}-{n}.gguf"
        bpw = write(model, cfg, tensors, TYPES[n], path)
        print(f"wrote {path}: linears and head at {bpw:.3f} bits/weight")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
