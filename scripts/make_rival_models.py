#!/usr/bin/env python3
"""Whole rival checkpoints of a real model, packed by the rivals' own libraries,
to check nibble's RivalSource end to end (docs/results/rival-checkpoints.md).

For each scheme, every decoder linear of MODEL is rounded to the nearest code
with scales and zeros from its groups' min/max (plain RTN: this checks the
reader, not the rivals' calibrated algorithms) and packed by the library:
    OUT/NAME/          the rival's checkpoint (config.json with its quantization_config)
    OUT/NAME-dequant/  the same weights as the library dequantizes them, plain f32
`nibble eval --reference OUT/NAME-dequant --candidate OUT/NAME` must then give
KL at the level of the libraries' fp16/bf16 rounding.

    /tmp/rv/bin/python scripts/make_rival_models.py ../shared/models/qwen3-26M-linux OUT

The pruned checkpoints (ct-sparse*: compressed-tensors' sparse formats, which it
dropped after 0.14.0.1) are made with that version, by name:

    /tmp/rv/bin/pip install --no-deps --target /tmp/ct14 compressed-tensors==0.14.0.1
    PYTHONPATH=/tmp/ct14 /tmp/rv/bin/python scripts/make_rival_models.py ../shared/models/qwen3-26M-linux OUT \
        ct-sparse24 ct-sparse24-fp8-channel
"""
import json
import math
import shutil
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

MODEL, OUT = Path(sys.argv[1]), Path(sys.argv[2])
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def load_model():
    tensors = {}
    for f in sorted(MODEL.glob("*.safetensors")):
        tensors.update(load_file(str(f)))
    return tensors


def minmax_params(w, gs, bits):
    """Asymmetric RTN parameters per (output, group): scale [out, groups], zero [out, groups]."""
    out_f, in_f = w.shape
    wg = w.reshape(out_f, in_f // gs, gs)
    mn, mx = wg.amin(dim=2).clamp(max=0), wg.amax(dim=2).clamp(min=0)
    maxq = 2**bits - 1
    scale = ((mx - mn) / maxq).clamp(min=1e-8).half().float()
    zero = torch.round(-mn / scale).clamp(0, maxq)
    return scale, zero


def gptq(w, gs=128, bits=4, planar=False):
    """planar: GPTQModel's gptq_p layout (its only layout at 5-7 bits), zeros as they are (v2)."""
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.quantization.config import FORMAT
    from gptqmodel.utils.model import convert_gptq_v2_to_v1_format_module

    out_f, in_f = w.shape
    scale, zero = minmax_params(w, gs, bits)
    lin = torch.nn.Linear(in_f, out_f, bias=False)
    lin.weight.data = w.clone()
    ql = TorchLinear(bits=bits, group_size=gs, sym=False, desc_act=False, in_features=in_f, out_features=out_f,
                     bias=False, **({"format": FORMAT.GPTQ_P} if planar else {}))
    ql.pack_original(lin, scale, zero, g_idx=(torch.arange(in_f) // gs).to(torch.int32))
    ref = ql.dequantize_weight().T.float()
    if not planar:
        convert_gptq_v2_to_v1_format_module(ql, types.SimpleNamespace(bits=bits, pack_dtype=torch.int32))
    parts = {"qweight": ql.qweight, "qzeros": ql.qzeros, "scales": ql.scales}
    return parts, ref


def awq_grid(w, gs):
    """A linear holding w rounded to AutoAWQ's 4-bit grid, and its scales and zeros [out, groups]. AutoAWQ packs
    round((w + z·s) / s) without clamping (its quantizer hands it weights already on the grid): give it the weights
    rounded and clamped to the codes' range, as that quantizer would."""
    out_f, in_f = w.shape
    scale, zero = minmax_params(w, gs, 4)
    g = torch.arange(in_f) // gs
    s_, z_ = scale[:, g], zero[:, g]
    lin = torch.nn.Linear(in_f, out_f, bias=False)
    lin.weight.data = (torch.clamp(torch.round(w / s_) + z_, 0, 15) - z_) * s_
    return lin, scale, zero


def awq(w, gs=128):
    from awq.modules.linear.gemm import WQLinear_GEMM
    from awq.utils.packing_utils import dequantize_gemm

    lin, scale, zero = awq_grid(w, gs)
    ql = WQLinear_GEMM.from_linear(lin, 4, gs, scales=scale.T.contiguous().half(), zeros=zero.T.contiguous().to(torch.int32))
    ref = dequantize_gemm(ql.qweight, ql.qzeros, ql.scales, 4, gs).T.float()
    return {"qweight": ql.qweight, "qzeros": ql.qzeros, "scales": ql.scales}, ref


def awq_gemv(w, gs=128):
    """AutoAWQ's GEMV layout of the same weights as awq() (it has no CPU dequantization: the reference is the
    grid weights it is given, which its rounding packs back exactly)."""
    from awq.modules.linear.gemv import WQLinear_GEMV

    lin, scale, zero = awq_grid(w, gs)
    ql = WQLinear_GEMV.from_linear(lin, 4, gs, scales=scale.contiguous().half(), zeros=zero.contiguous().to(torch.int32))
    return {"qweight": ql.qweight, "qzeros": ql.qzeros, "scales": ql.scales}, lin.weight.data.float()


def ct(fmt, weights):
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams, generate_gparam

    args = QuantizationArgs(**weights)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    comp = BaseCompressor.load_from_registry(fmt)

    def pack(w):
        out_f, in_f = w.shape
        s = weights["strategy"]
        if s == "channel":
            mn, mx = w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
        else:
            gsz = weights["group_size"]
            wg = w.reshape(out_f, in_f // gsz, gsz)
            mn, mx = wg.amin(dim=2), wg.amax(dim=2)
        state = {"weight": w.clone()}
        gscale = None
        if fmt == "nvfp4-pack-quantized":
            gscale = generate_gparam(w.min(), w.max())
            state["weight_global_scale"] = gscale
        scale, zp = calculate_qparams(mn, mx, args, global_scale=gscale)
        state["weight_scale"], state["weight_zero_point"] = scale, zp
        c = comp.compress(state, scheme)
        ref = comp.decompress(dict(c), scheme)["weight"].float()
        return {k: v for k, v in c.items()}, ref

    qcfg = {"quant_method": "compressed-tensors", "format": fmt,
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": args.model_dump(mode="json")}},
            "ignore": ["lm_head"]}
    return pack, qcfg


def ct_sparse24(weights=None):
    """Each linear pruned 2:4 by the library's own mask (in each 4 inputs the 2 of largest magnitude kept), then stored
    in its sparse-24-bitmask format as bf16 or, with `weights`, as float-quantized codes (RTN on the library's
    calculate_qparams; the compressor then keeps the codes the mask kept, and a kept weight that rounds to code 0 is
    stored as a 0). The reference: the library's sparse decompression, then its quantization compressor's."""
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.compressors.sparse_compressors.sparse_24_bitmask import (Sparse24BitMaskTensor,
                                                                                    get_24_bytemasks)
    from compressed_tensors.config import SparsityCompressionConfig
    from compressed_tensors.quantization import QuantizationArgs
    from compressed_tensors.quantization.utils import calculate_qparams

    sc = SparsityCompressionConfig.load_from_registry("sparse-24-bitmask", targets=["Linear"],
                                                      sparsity_structure="2:4", ignore=["lm_head"])
    qcfg = {"quant_method": "compressed-tensors", "sparsity_config": sc.model_dump(mode="json")}
    if weights:
        args = QuantizationArgs(**weights)
        comp = BaseCompressor.load_from_registry("float-quantized")
        qcfg.update({"format": "float-quantized", "ignore": ["lm_head"],
                     "config_groups": {"group_0": {"targets": ["Linear"], "weights": args.model_dump(mode="json")}}})

    def pack(w):
        w = w * get_24_bytemasks(w)  # pruned first, as SparseGPT leaves a model before quantization
        parts = {}
        if weights:
            scale, zp = calculate_qparams(w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True), args)
            codes = comp.compress_weight(w.clone(), scale, args, zero_point=zp)["weight"]
            parts = {"weight_scale": scale}
        else:
            codes = w.to(torch.bfloat16)
        t = Sparse24BitMaskTensor.from_dense(codes, "2:4")
        parts.update({k.split(".", 1)[1]: v for k, v in t.dict(name_prefix="P.weight").items()})  # P.compressed, ...
        ref = t.decompress()
        if weights:
            ref = comp.decompress_weight({"weight": ref, **{k: v for k, v in parts.items() if k.startswith("weight_")}},
                                         quantization_args=args)
        return parts, ref.float()

    return pack, qcfg


def bnb4(quant_type, double_quant, dtype=torch.bfloat16, blocksize=64):
    def pack(w):
        import bitsandbytes as bnb
        import bitsandbytes.functional as F

        out_f, in_f = w.shape
        p = bnb.nn.Params4bit(w.to(dtype), requires_grad=False, quant_type=quant_type,
                              compress_statistics=double_quant, blocksize=blocksize)
        p._quantize("cpu")
        m = bnb.nn.Linear4bit(in_f, out_f, bias=False, quant_type=quant_type, compress_statistics=double_quant)
        m.weight = p
        return dict(m.state_dict()), F.dequantize_4bit(p.data, p.quant_state).float()

    qcfg = {"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
            "bnb_4bit_quant_type": quant_type, "bnb_4bit_use_double_quant": double_quant,
            "bnb_4bit_compute_dtype": "bfloat16", "bnb_4bit_quant_storage": "uint8"}
    return pack, qcfg


def bnb8(w):
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    out_f, in_f = w.shape
    m = bnb.nn.Linear8bitLt(in_f, out_f, bias=False, has_fp16_weights=False)
    m.weight = bnb.nn.Int8Params(w.clone(), requires_grad=False, has_fp16_weights=False)
    sd = m.to("cpu").state_dict()
    return dict(sd), F.int8_vectorwise_dequant(sd["weight"], sd["SCB"]).float()


def build(name, pack, qcfg):
    src = load_model()
    rival, plain = {}, {}
    for k, v in src.items():
        prefix = k[: -len(".weight")] if k.endswith(".weight") else None
        if prefix and prefix.rsplit(".", 1)[-1] in LINEARS:
            parts, ref = pack(v.float())
            for suffix, t in parts.items():
                rival[f"{prefix}.{suffix}"] = t.contiguous()
            plain[k] = ref.contiguous()
        else:
            rival[k] = v.contiguous()
            plain[k] = v.float().contiguous()
    for d, tensors, q in ((OUT / name, rival, qcfg), (OUT / f"{name}-dequant", plain, None)):
        d.mkdir(parents=True, exist_ok=True)
        for f in MODEL.iterdir():
            if f.is_file() and not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
                shutil.copy(f, d / f.name)
        cfg = json.loads((MODEL / "config.json").read_text())
        if q:
            cfg["quantization_config"] = q
        (d / "config.json").write_text(json.dumps(cfg, indent=2))
        save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    print("wrote", OUT / name)


ONLY = set(sys.argv[3:])  # names to build (all when empty)
if ONLY:
    _build = build
    build = lambda name, pack, qcfg: _build(name, pack, qcfg) if name in ONLY else None
build("gptq-w4g128", gptq, {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": False, "desc_act": False,
                            "checkpoint_format": "gptq"})
build("gptq-w3g128", lambda w: gptq(w, bits=3),
      {"quant_method": "gptq", "bits": 3, "group_size": 128, "sym": False, "desc_act": False,
       "checkpoint_format": "gptq"})
build("gptq-p-w6g128", lambda w: gptq(w, bits=6, planar=True),
      {"quant_method": "gptq", "bits": 6, "group_size": 128, "sym": False, "desc_act": False,
       "checkpoint_format": "gptq_p"})
build("awq-w4g128", awq, {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"})
build("awq-gemv-w4g128", awq_gemv,
      {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemv"})
for name, fmt, w in (
    ("ct-w4a16-g128-asym", "pack-quantized",
     {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 128}),
    ("ct-w8a16-channel", "pack-quantized", {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}),
    ("ct-fp8-channel", "float-quantized", {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"}),
    ("ct-nvfp4", "nvfp4-pack-quantized",
     {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group", "group_size": 16}),
    ("ct-mxfp6", "mxfp6-pack-quantized",
     {"num_bits": 6, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32,
      "scale_dtype": "torch.uint8", "zp_dtype": None}),
    ("ct-mxfp8", "mxfp8-quantized",
     {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32,
      "scale_dtype": "torch.uint8", "zp_dtype": None}),
):
    if not ONLY or name in ONLY:
        build(name, *ct(fmt, w))
for name, w in (("ct-sparse24", None),
                ("ct-sparse24-fp8-channel", {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"})):
    if not ONLY or name in ONLY:
        build(name, *ct_sparse24(w))
build("bnb-nf4-dq", *bnb4("nf4", True))
build("bnb-fp4", *bnb4("fp4", False))
build("bnb-int8", bnb8, {"quant_method": "bitsandbytes", "load_in_4bit": False, "load_in_8bit": True,
                         "llm_int8_threshold": 6.0})
