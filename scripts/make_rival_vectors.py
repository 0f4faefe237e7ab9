#!/usr/bin/env python3
"""Test vectors for nibble's rival-checkpoint readers (src/io/rival_source.cpp),
made by the rivals' own libraries: GPTQModel (TorchLinear.pack_original and its
v2 -> v1 export), AutoAWQ (WQLinear_GEMM.from_linear, dequantize_gemm; WQLinear_GEMV.from_linear),
compressed-tensors (its compressors' compress and decompress), bitsandbytes
(Linear4bit / Linear8bitLt state dicts, dequantize_4bit, int8_vectorwise_dequant)
and auto-round (auto_round_extension's GPTQ-layout QuantLinear pack and forward).

Each case is one safetensors file in tests/data/rivals/: the stored tensors of
one linear under the prefix "layer" as the library writes them, "reference"
(F32 [out, in], the library's own dequantization), and the quantization_config
as JSON in the file's metadata. Weights are random (seeded); nothing comes from
a model.

    python3 -m venv /tmp/rv && /tmp/rv/bin/pip install torch compressed-tensors bitsandbytes
    /tmp/rv/bin/pip install --no-deps autoawq gptqmodel auto-round   (+ the modules they import)
    /tmp/rv/bin/python scripts/make_rival_vectors.py tests/data/rivals

compressed-tensors dropped its sparse compressors after 0.14.0.1; the sparse
cases (ct_sparse*) are made with that version, alone:

    /tmp/rv/bin/pip install --no-deps --target /tmp/ct14 compressed-tensors==0.14.0.1
    ONLY=$(grep -o '"ct_sparse[a-z0-9_]*"' scripts/make_rival_vectors.py | tr -d '"' | paste -sd,) \
      PYTHONPATH=/tmp/ct14 /tmp/rv/bin/python scripts/make_rival_vectors.py tests/data/rivals
"""
import json
import math
import os
import sys
import types
from pathlib import Path

import torch
from safetensors.torch import save_file

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "tests/data/rivals")
OUT.mkdir(parents=True, exist_ok=True)


# ONLY=name1,name2 makes those cases alone.
ONLY = set(filter(None, os.environ.get("ONLY", "").split(",")))


def case(fn):
    """A case function (its first argument the case's name), skipped when ONLY leaves it out."""
    def run(name, *args, **kwargs):
        if not ONLY or name in ONLY:
            fn(name, *args, **kwargs)
    return run


def save(name, tensors, reference, qconfig):
    t = {k: v.contiguous() for k, v in tensors.items()}
    t["reference"] = reference.float().contiguous()
    save_file(t, str(OUT / f"{name}.safetensors"), metadata={"quantization_config": json.dumps(qconfig)})
    print(name, {k: (str(v.dtype), list(v.shape)) for k, v in t.items()})


def linear(out_f, in_f, seed, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(in_f, out_f, bias=False)
    lin.weight.data = torch.randn(out_f, in_f, generator=g) * scale
    return lin, g


# ------------------------------------------------------------------ GPTQ
@case
def gptq_case(name, bits, group_size, sym, desc_act, v1, out_f=16, in_f=256, seed=1, planar=False):
    from gptqmodel.nn_modules.qlinear.torch import TorchLinear
    from gptqmodel.utils.model import convert_gptq_v2_to_v1_format_module

    lin, g = linear(out_f, in_f, seed)
    gs = group_size if group_size > 0 else in_f
    groups = math.ceil(in_f / gs)
    maxq = 2**bits - 1
    if desc_act:  # act-order: each input's group from a permutation (as GPTQ's static-groups export writes it)
        perm = torch.randperm(in_f, generator=g)
        g_idx = (perm // gs).to(torch.int32)
    else:
        g_idx = (torch.arange(in_f) // gs).to(torch.int32)
    # Per (output, group): a range that covers the weights, zeros across the whole code range (0 and maxq included).
    scales = torch.rand(out_f, groups, generator=g) * 0.02 + 0.01
    if sym:
        zeros = torch.full((out_f, groups), float((maxq + 1) // 2))
    else:
        zeros = torch.randint(0, maxq + 1, (out_f, groups), generator=g).float()
        zeros[0, 0], zeros[1, 0] = 0, maxq
    # Weights inside each group's range, so that the codes are not all clamped.
    codes = torch.randint(0, maxq + 1, (out_f, in_f), generator=g).float()
    lin.weight.data = (codes - zeros[:, g_idx.long()]) * scales[:, g_idx.long()] + (torch.rand(out_f, in_f, generator=g) - 0.5) * 0.5 * scales[:, g_idx.long()]
    extra = {}
    if planar:  # GPTQModel's planar gptq_p layout (5-7 bits always; 3 bits when asked), v2 zeros
        from gptqmodel.quantization.config import FORMAT
        extra["format"] = FORMAT.GPTQ_P
    ql = TorchLinear(bits=bits, group_size=gs if group_size > 0 else -1, sym=sym, desc_act=desc_act, in_features=in_f,
                     out_features=out_f, bias=False, **extra)
    ql.pack_original(lin, scales.half().float(), zeros, g_idx=g_idx)
    ref = ql.dequantize_weight().T.float()  # [in, out] -> [out, in]
    if v1:
        cfg = types.SimpleNamespace(bits=bits, pack_dtype=torch.int32)
        convert_gptq_v2_to_v1_format_module(ql, cfg)
    t = {"layer.qweight": ql.qweight, "layer.qzeros": ql.qzeros, "layer.scales": ql.scales}
    if desc_act:
        t["layer.g_idx"] = ql.g_idx.to(torch.int32)
    q = {"quant_method": "gptq", "bits": bits, "group_size": group_size, "sym": sym, "desc_act": desc_act,
         "checkpoint_format": "gptq_p" if planar else "gptq" if v1 else "gptq_v2"}
    save(name, t, ref, q)


# ------------------------------------------------------------------- AWQ
@case
def awq_case(name, group_size, out_f=32, in_f=256, seed=2):
    from awq.modules.linear.gemm import WQLinear_GEMM
    from awq.utils.packing_utils import dequantize_gemm

    lin, g = linear(out_f, in_f, seed)
    groups = in_f // group_size
    scales = (torch.rand(groups, out_f, generator=g) * 0.02 + 0.01).half()
    zeros = torch.randint(0, 16, (groups, out_f), generator=g)
    zeros[0, 0], zeros[0, 1] = 0, 15
    codes = torch.randint(0, 16, (out_f, in_f), generator=g)
    gi = torch.arange(in_f) // group_size
    lin.weight.data = ((codes - zeros.T[:, gi]) * scales.float().T[:, gi]).float()
    ql = WQLinear_GEMM.from_linear(lin, 4, group_size, scales=scales, zeros=zeros)
    ref = dequantize_gemm(ql.qweight, ql.qzeros, ql.scales, 4, group_size).T.float()
    q = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm"}
    save(name, {"layer.qweight": ql.qweight, "layer.qzeros": ql.qzeros, "layer.scales": ql.scales}, ref, q)


def awq_per_row_case(out_f, in_f, group_size, seed):
    """A linear of exact weights (code - zero) * scale with per-row [out, groups] fp16 scales and integer zeros, as
    the GEMV layouts take them; returns the linear and codes, zeros, scales and each input's group."""
    lin, g = linear(out_f, in_f, seed)
    groups = in_f // group_size
    scales = (torch.rand(out_f, groups, generator=g) * 0.02 + 0.01).half()
    zeros = torch.randint(0, 16, (out_f, groups), generator=g)
    zeros[0, 0], zeros[1, 0] = 0, 15
    codes = torch.randint(0, 16, (out_f, in_f), generator=g)
    gi = torch.arange(in_f) // group_size
    lin.weight.data = ((codes - zeros[:, gi]) * scales.float()[:, gi]).float()
    return lin, codes, zeros, scales, gi


@case
def awq_gemv_case(name, group_size, out_f=32, in_f=256, seed=4):
    """AutoAWQ's GEMV layout (WQLinear_GEMV.from_linear). AutoAWQ dequantizes it only inside its CUDA kernel, so the
    reference is the weight it was given, (code - zero) * scale exactly, which from_linear's rounding packs back to
    those codes (the zeros and scales padded to its calculate_zeros_width)."""
    from awq.modules.linear.gemv import WQLinear_GEMV

    lin, _, zeros, scales, _ = awq_per_row_case(out_f, in_f, group_size, seed)
    ref = lin.weight.data.clone()
    ql = WQLinear_GEMV.from_linear(lin, 4, group_size, scales=scales, zeros=zeros)
    q = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemv"}
    save(name, {"layer.qweight": ql.qweight, "layer.qzeros": ql.qzeros, "layer.scales": ql.scales}, ref, q)


@case
def awq_gemv_fast_case(name, group_size, out_f=32, in_f=256, seed=10):
    """AutoAWQ's GEMV-fast layout (WQLinear_GEMVFast.from_linear): I16 codes of four interleaved rows, scales and
    zeros as [padded groups, out] fp16, the zeros stored as -scale * zero. AutoAWQ dequantizes it only inside its
    CUDA kernel, as code * scale + zero in fp16 (one rounding), so that is the reference."""
    from awq.modules.linear.gemv_fast import WQLinear_GEMVFast

    lin, codes, zeros, scales, gi = awq_per_row_case(out_f, in_f, group_size, seed)
    ql = WQLinear_GEMVFast.from_linear(lin, 4, group_size, scales=scales, zeros=zeros)
    qz = ql.qzeros[: zeros.shape[1]].T.float()  # [out, groups]: fp16(-scale * zero)
    ref = (codes.float() * scales.float()[:, gi] + qz[:, gi]).half().float()
    q = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemv_fast"}
    save(name, {"layer.qweight": ql.qweight, "layer.qzeros": ql.qzeros, "layer.scales": ql.scales}, ref, q)


# ---------------------------------------------------- compressed-tensors
@case
def ct_case(name, fmt, weights, out_f=16, in_f=256, seed=3, scale_dtype=torch.float32):
    from compressed_tensors.compressors import BaseCompressor
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    from compressed_tensors.quantization.utils import calculate_qparams

    lin, g = linear(out_f, in_f, seed)
    w = lin.weight.data
    args = QuantizationArgs(**weights)
    scheme = QuantizationScheme(targets=["Linear"], weights=args)
    # Scales and zero points from the weights' own ranges, by the library.
    strategy = weights["strategy"]
    if strategy == "tensor":
        mn, mx = w.min().reshape(1, 1), w.max().reshape(1, 1)
    elif strategy == "channel":
        mn, mx = w.min(dim=1, keepdim=True).values, w.max(dim=1, keepdim=True).values
    elif strategy in ("group", "tensor_group"):
        gsz = weights["group_size"]
        wg = w.reshape(out_f, in_f // gsz, gsz)
        mn, mx = wg.min(dim=2).values, wg.max(dim=2).values
    elif strategy == "block":
        bo, bi = weights["block_structure"]
        wb = w.reshape(out_f // bo, bo, in_f // bi, bi)
        mn, mx = wb.amin(dim=(1, 3)), wb.amax(dim=(1, 3))
    global_scale = None
    state = {"weight": w.clone()}
    if fmt == "nvfp4-pack-quantized":
        from compressed_tensors.quantization.utils import generate_gparam
        global_scale = generate_gparam(w.min(), w.max())
        state["weight_global_scale"] = global_scale
    scale, zp = calculate_qparams(mn, mx, args, global_scale=global_scale)
    mx = ("nvfp4-pack-quantized", "mxfp4-pack-quantized", "mxfp6-pack-quantized", "mxfp8-quantized")
    state["weight_scale"] = scale.to(scale_dtype) if fmt not in mx else scale
    state["weight_zero_point"] = zp
    comp = BaseCompressor.get_value_from_registry(fmt) if hasattr(BaseCompressor, "get_value_from_registry") else BaseCompressor.load_from_registry(fmt)
    compressed = comp.compress(state, scheme)
    ref = comp.decompress(dict(compressed), scheme)["weight"].float()
    t = {f"layer.{k}": v for k, v in compressed.items()}
    q = {"quant_method": "compressed-tensors", "format": fmt,
         "config_groups": {"group_0": {"targets": ["Linear"], "weights": args.model_dump(mode="json")}}}
    save(name, t, ref, q)


# A pruned linear in compressed-tensors' sparsity formats (ModelCompressor with
# a sparsity_config): sparse-24-bitmask (2 of every 4 inputs kept, the larger)
# or sparse-bitmask (unstructured), of plain weights or, with `weights`, of
# int-quantized / float-quantized codes (channel scales from the pruned
# weights' ranges). The reference is the library's: its sparse decompression,
# then the quantization compressor's. `in_f` is no multiple of 8: each
# bitmask row ends in padding bits.
@case
def ct_sparse_case(name, sparse_fmt, weights=None, dtype=torch.float32, out_f=16, in_f=196, seed=12):
    from compressed_tensors.compressors import BaseCompressor, ModelCompressor
    from compressed_tensors.config import SparsityCompressionConfig
    from compressed_tensors.quantization import (QuantizationArgs, QuantizationConfig, QuantizationScheme,
                                                 apply_quantization_config)
    from compressed_tensors.quantization.utils import calculate_qparams

    lin, g = linear(out_f, in_f, seed)
    w = lin.weight.data
    if sparse_fmt == "sparse-24-bitmask":
        keep = torch.zeros_like(w, dtype=torch.bool)
        keep.view(-1, 4).scatter_(1, w.abs().view(-1, 4).topk(2, dim=1).indices, True)
    else:
        keep = torch.rand(out_f, in_f, generator=g) < 0.6
    model = torch.nn.Module()
    model.layer = lin
    lin.weight.data = (w * keep).to(dtype)
    qc = None
    if weights:
        args = QuantizationArgs(**weights)
        qc = QuantizationConfig(config_groups={"group_0": QuantizationScheme(targets=["Linear"], weights=args)},
                                format="float-quantized" if args.type == "float" else "int-quantized",
                                quantization_status="frozen")
        apply_quantization_config(model, qc)
        wt = lin.weight.data.float()
        scale, zp = calculate_qparams(wt.min(dim=1, keepdim=True).values, wt.max(dim=1, keepdim=True).values, args)
        lin.weight_scale.data = scale
        if hasattr(lin, "weight_zero_point"):
            lin.weight_zero_point.data = zp
    sc = SparsityCompressionConfig.load_from_registry(
        sparse_fmt, targets=["Linear"], sparsity_structure="2:4" if sparse_fmt == "sparse-24-bitmask" else "unstructured")
    mc = ModelCompressor(sparsity_config=sc, quantization_config=qc)
    t = dict(mc.compress(model))
    ref = dict(mc.sparsity_compressor.decompress_from_state_dict(dict(t)))["layer.weight"]
    if qc:
        params = {"weight": ref, **{k.split(".", 1)[1]: v for k, v in t.items() if k.startswith("layer.weight_")}}
        ref = BaseCompressor.load_from_registry(qc.format).decompress_weight(params, quantization_args=args)
    # As ModelCompressor.update_config writes it into config.json.
    q = {"quant_method": "compressed-tensors", "sparsity_config": sc.model_dump(mode="json")}
    if qc:
        q.update(qc.model_dump(mode="json", exclude=["quant_method"]))
    save(name, t, ref, q)


# ------------------------------------------------------------- auto-round
@case
def ar_case(name, packing, bits, group_size, sym, out_f=32, in_f=256, seed=6):
    """auto-round's own GPTQ-layout packers (auto_round_extension): qlinear_torch_zp for "auto_round:auto_gptq"
    (zeros minus one, clamped at 0), qlinear_torch for "auto_round" (zeros as they are). The reference is the
    layer's own forward of the identity."""
    from auto_round_extension.torch.qlinear_torch import QuantLinear as PlainZeros
    from auto_round_extension.torch.qlinear_torch_zp import QuantLinear as ZerosMinusOne

    lin, g = linear(out_f, in_f, seed)
    groups = in_f // group_size
    maxq = 2**bits - 1
    scales = (torch.rand(out_f, groups, generator=g) * 0.02 + 0.01).half().float()
    if sym:
        zeros = torch.full((out_f, groups), float((maxq + 1) // 2))
    else:
        zeros = torch.randint(1, maxq + 1, (out_f, groups), generator=g).float()
        zeros[0, 0] = maxq
    gi = torch.arange(in_f) // group_size
    codes = torch.randint(0, maxq + 1, (out_f, in_f), generator=g).float()
    lin.weight.data = (codes - zeros[:, gi]) * scales[:, gi]
    cls = ZerosMinusOne if packing == "auto_round:auto_gptq" else PlainZeros
    ql = cls(bits, group_size, in_f, out_f, bias=False)
    ql.device = torch.device("cpu")  # qlinear_torch's packer reads it; only its loader sets it
    ql.pack(lin, scales, zeros)
    ref = ql.forward(torch.eye(in_f)).T.float()
    q = {"quant_method": "auto-round", "packing_format": packing, "bits": bits, "group_size": group_size, "sym": sym,
         "data_type": "int", "iters": 200}
    save(name, {"layer.qweight": ql.qweight, "layer.qzeros": ql.qzeros, "layer.scales": ql.scales}, ref, q)


@case
def ar_awq_case(name, group_size, out_f=32, in_f=256, seed=7):
    """auto-round's "auto_round:auto_awq" export: its own copy of AWQ's GEMM packer and dequantize_gemm."""
    from auto_round.export.export_to_awq.utils import WQLinear_GEMM, dequantize_gemm

    lin, g = linear(out_f, in_f, seed)
    groups = in_f // group_size
    scales = (torch.rand(groups, out_f, generator=g) * 0.02 + 0.01).half()
    zeros = torch.randint(0, 16, (groups, out_f), generator=g)
    gi = torch.arange(in_f) // group_size
    codes = torch.randint(0, 16, (out_f, in_f), generator=g)
    lin.weight.data = ((codes - zeros.T[:, gi]) * scales.float().T[:, gi]).float()
    ql = WQLinear_GEMM.from_linear(lin, 4, group_size, scales=scales, zeros=zeros)
    ref = dequantize_gemm(ql.qweight, ql.qzeros, ql.scales, 4, group_size).T.float()
    q = {"quant_method": "auto-round", "packing_format": "auto_round:auto_awq", "bits": 4, "group_size": group_size,
         "sym": False, "data_type": "int"}
    save(name, {"layer.qweight": ql.qweight, "layer.qzeros": ql.qzeros, "layer.scales": ql.scales}, ref, q)


# ------------------------------------------------------------ bitsandbytes
@case
def bnb4_case(name, quant_type, double_quant, dtype, blocksize, out_f, in_f, seed=4):
    """A Linear4bit's state dict as transformers saves it, and the library's dequantize_4bit (in `dtype`)."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    lin, _ = linear(out_f, in_f, seed)
    w = lin.weight.data.to(dtype)
    m = bnb.nn.Linear4bit(in_f, out_f, bias=False, quant_type=quant_type, compress_statistics=double_quant,
                          compute_dtype=dtype)
    m.weight = bnb.nn.Params4bit(w.clone(), requires_grad=False, quant_type=quant_type,
                                 compress_statistics=double_quant, blocksize=blocksize)
    m.weight._quantize("cpu")
    ref = F.dequantize_4bit(m.weight.data, m.weight.quant_state)
    assert ref.dtype == dtype and tuple(ref.shape) == (out_f, in_f)
    t = {f"layer.{k}": v for k, v in m.state_dict().items()}
    q = {"quant_method": "bitsandbytes", "load_in_4bit": True, "load_in_8bit": False,
         "bnb_4bit_quant_type": quant_type, "bnb_4bit_use_double_quant": double_quant,
         "bnb_4bit_compute_dtype": str(dtype).removeprefix("torch."), "bnb_4bit_quant_storage": "uint8"}
    save(name, t, ref, q)


@case
def bnb8_case(name, out_f=16, in_f=256, seed=5):
    """A Linear8bitLt's state dict (LLM.int8: row-wise absmax) and the library's int8_vectorwise_dequant."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    lin, _ = linear(out_f, in_f, seed)
    m = bnb.nn.Linear8bitLt(in_f, out_f, bias=False, has_fp16_weights=False)
    m.weight = bnb.nn.Int8Params(lin.weight.data.clone(), requires_grad=False, has_fp16_weights=False)
    m = m.to("cpu")
    sd = m.state_dict()
    ref = F.int8_vectorwise_dequant(sd["weight"], sd["SCB"])
    q = {"quant_method": "bitsandbytes", "load_in_4bit": False, "load_in_8bit": True, "llm_int8_threshold": 6.0}
    save(name, {f"layer.{k}": v for k, v in sd.items()}, ref, q)


@case
def bnb8_matmul_case(name, out_f=24, in_f=256, tokens=12, seed=6):
    """LLM.int8's activations: a Linear8bitLt (threshold 6) run on fp16 inputs whose columns 3 and 100 hold
    outliers (|x| >= 6, one exactly 6), with entries just below 6 elsewhere. Besides the layer and its
    dequantized weight ("reference"): "x" (the input), "x_quant" (the input as the int8 matmul sees it:
    int8_vectorwise_quant's codes times their row scale / 127, the outlier columns as they are) and "y" (the
    layer's own output, fp16)."""
    import bitsandbytes as bnb
    import bitsandbytes.functional as F

    lin, g = linear(out_f, in_f, seed)
    m = bnb.nn.Linear8bitLt(in_f, out_f, bias=False, has_fp16_weights=False, threshold=6.0)
    m.weight = bnb.nn.Int8Params(lin.weight.data.clone(), requires_grad=False, has_fp16_weights=False)
    m = m.to("cpu").eval()  # inference (from_pretrained's mode): in training mode the CPU dequantizes instead
    sd = m.state_dict()
    x = torch.randn(tokens, in_f, generator=g) * 1.5
    x[2, 3], x[7, 3], x[5, 100], x[0, 100] = 9.5, -7.25, 6.0, 5.99  # outliers of columns 3 and 100 (and 5.99 < 6)
    x[4, 50], x[9, 200] = -5.995, 5.98  # below the threshold: ordinary entries, each its row's absmax
    x = x.half()
    ca, sca, cols = F.int8_vectorwise_quant(x.clone(), threshold=6.0)
    xq = ca.float() * (sca.unsqueeze(1) / 127.0)
    xq[:, cols] = x[:, cols].float()
    with torch.no_grad():
        y = m(x)
    ref = F.int8_vectorwise_dequant(sd["weight"], sd["SCB"])
    q = {"quant_method": "bitsandbytes", "load_in_4bit": False, "load_in_8bit": True, "llm_int8_threshold": 6.0}
    print(name, "outlier columns", cols.tolist())
    save(name, {**{f"layer.{k}": v for k, v in sd.items()}, "x": x.float(), "x_quant": xq, "y": y.float()}, ref, q)


gptq_case("gptq_b4_g32_asym_v1", 4, 32, sym=False, desc_act=False, v1=True)
gptq_case("gptq_b4_g64_asym_v2", 4, 64, sym=False, desc_act=False, v1=False)
gptq_case("gptq_b4_g64_sym_actorder_v1", 4, 64, sym=True, desc_act=True, v1=True)
gptq_case("gptq_b8_g128_asym_v1", 8, 128, sym=False, desc_act=False, v1=True)
gptq_case("gptq_b2_g32_asym_v1", 2, 32, sym=False, desc_act=False, v1=True)
gptq_case("gptq_b4_channel_asym_v1", 4, -1, sym=False, desc_act=False, v1=True)
# 3 bits: a bit stream across word boundaries (32 values in 3 words); 3-bit zeros need outputs in multiples of 32.
gptq_case("gptq_b3_g32_asym_v1", 3, 32, sym=False, desc_act=False, v1=True, out_f=32)
gptq_case("gptq_b3_g64_asym_v2", 3, 64, sym=False, desc_act=False, v1=False, out_f=32)
gptq_case("gptq_b3_g64_sym_actorder_v1", 3, 64, sym=True, desc_act=True, v1=True, out_f=32)
# GPTQModel's planar layout (gptq_p): 5, 6 and 7 bits, and 3 bits the planar way (not the continuous layout above).
gptq_case("gptq_p_b5_g32_asym", 5, 32, sym=False, desc_act=False, v1=False, out_f=32, planar=True)
gptq_case("gptq_p_b6_g64_sym_actorder", 6, 64, sym=True, desc_act=True, v1=False, out_f=32, planar=True)
gptq_case("gptq_p_b7_g128_asym", 7, 128, sym=False, desc_act=False, v1=False, out_f=32, planar=True)
gptq_case("gptq_p_b3_g64_asym", 3, 64, sym=False, desc_act=False, v1=False, out_f=32, planar=True)
awq_case("awq_g64", 64)
awq_case("awq_g128", 128)
awq_gemv_case("awq_gemv_g64", 64)
awq_gemv_case("awq_gemv_g128", 128)
# A second shape: 384 inputs (6 or 3 groups, so the GEMV layout pads its zeros and scales to
# calculate_zeros_width); 64 outputs for the GEMM layout (eight packed words per input row; its packer needs a
# multiple of 32), 40 for the GEMV layout (rows not a multiple of 32).
awq_case("awq_g64_64x384", 64, out_f=64, in_f=384, seed=5)
awq_case("awq_g128_64x384", 128, out_f=64, in_f=384, seed=6)
awq_gemv_case("awq_gemv_g64_40x384", 64, out_f=40, in_f=384, seed=8)
awq_gemv_case("awq_gemv_g128_40x384", 128, out_f=40, in_f=384, seed=9)
awq_gemv_fast_case("awq_gemv_fast_g64", 64)
awq_gemv_fast_case("awq_gemv_fast_g128_40x384", 128, out_f=40, in_f=384, seed=11)
ct_case("ct_w4a16_group_sym", "pack-quantized",
        {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128})
ct_case("ct_w4a16_group_asym", "pack-quantized",
        {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": 64})
ct_case("ct_w8a16_channel_sym", "pack-quantized",
        {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"})
ct_case("ct_w8_channel_asym", "pack-quantized",
        {"num_bits": 8, "type": "int", "symmetric": False, "strategy": "channel"})
ct_case("ct_w4_channel_asym_bf16", "pack-quantized",
        {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "channel"}, scale_dtype=torch.bfloat16)
ct_case("ct_int8_channel", "int-quantized",
        {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"})
ct_case("ct_fp8_tensor", "float-quantized",
        {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "tensor"})
ct_case("ct_fp8_channel", "float-quantized",
        {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "channel"})
ct_case("ct_fp8_block", "float-quantized",
        {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "block", "block_structure": [16, 64]}, out_f=32)
ct_case("ct_nvfp4", "nvfp4-pack-quantized",
        {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "tensor_group", "group_size": 16})
ct_case("ct_mxfp4", "mxfp4-pack-quantized",
        {"num_bits": 4, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32,
         "scale_dtype": "torch.uint8", "zp_dtype": None})
ct_case("ct_mxfp6", "mxfp6-pack-quantized",
        {"num_bits": 6, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32,
         "scale_dtype": "torch.uint8", "zp_dtype": None})
ct_case("ct_mxfp8", "mxfp8-quantized",
        {"num_bits": 8, "type": "float", "symmetric": True, "strategy": "group", "group_size": 32,
         "scale_dtype": "torch.uint8", "zp_dtype": None})
# bitsandbytes: NF4 with double quantization over two nested blocks (264 blocks of 64), FP4 with a ragged last
# block, NF4 in fp16 with blocks of 128, and LLM.int8.
bnb4_case("bnb_nf4_dq_bf16", "nf4", True, torch.bfloat16, 64, out_f=24, in_f=704)
bnb4_case("bnb_fp4_bf16_ragged", "fp4", False, torch.bfloat16, 64, out_f=15, in_f=100)
bnb4_case("bnb_nf4_f16_b128", "nf4", False, torch.float16, 128, out_f=16, in_f=256)
bnb8_case("bnb_int8")
bnb8_matmul_case("bnb_int8_matmul")
# auto-round's own format: GPTQ layout, zeros minus one ("auto_round:auto_gptq", its default for symmetric
# weights) or as they are ("auto_round", asymmetric).
ct_sparse_case("ct_sparse24_bf16", "sparse-24-bitmask", dtype=torch.bfloat16)
ct_sparse_case("ct_sparse_bitmask_f16", "sparse-bitmask", dtype=torch.float16, in_f=203, seed=13)
ct_sparse_case("ct_sparse24_fp8_channel", "sparse-24-bitmask",
               dict(num_bits=8, type="float", strategy="channel", symmetric=True), seed=14)
ct_sparse_case("ct_sparse24_int8_channel_asym", "sparse-24-bitmask",
               dict(num_bits=8, type="int", strategy="channel", symmetric=False), seed=15)
ct_sparse_case("ct_sparse_bitmask_int8_channel", "sparse-bitmask",
               dict(num_bits=8, type="int", strategy="channel", symmetric=True), in_f=203, seed=16)
ar_case("ar_gptq_sym_b4_g128", "auto_round:auto_gptq", 4, 128, sym=True)
ar_case("ar_gptq_asym_b4_g32", "auto_round:auto_gptq", 4, 32, sym=False)
ar_case("ar_asym_b4_g64", "auto_round", 4, 64, sym=False)
ar_case("ar_asym_b2_g32", "auto_round", 2, 32, sym=False)
ar_awq_case("ar_awq_g64", 64)
