#!/usr/bin/env python3
"""Independent reader of nibble's packed checkpoint format, written from docs/FORMAT.md alone.

Library:
    load_checkpoint(dir) -> {logical name: float32 ndarray}   (every tensor, dequantized / converted)
    read_packed(dir)     -> PackedCheckpoint                  (raw view: plain tensors + quantized parts)
    read_safetensors(path), read_model_dir(dir)               (plain safetensors reading, no dependency)
    dequantize(qweight, scales, mins, shape, group)           (FORMAT.md §3, bit-exact)
    rtn_quantize(w, group) -> (qweight, scales_bits, mins_bits)  (FORMAT.md §3 writer rule)
    bf16_to_f32(bits), f32_to_bf16_rne(x)

CLI:
    read_packed.py DIR                 list every logical tensor (shape, how it was stored, checksum)
    read_packed.py DIR --out FILE.npz  also dump every tensor as float32 into an .npz

Only numpy is needed; safetensors is parsed with struct/json.
"""

import argparse
import json
import math
import os
import re
import struct
import sys

import numpy as np

# safetensors dtype strings -> numpy little-endian dtypes. BF16 is read as raw uint16 bits.
_ST_DTYPES = {
    "BOOL": np.dtype("?"),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "U16": np.dtype("<u2"),
    "I16": np.dtype("<i2"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "U32": np.dtype("<u4"),
    "I32": np.dtype("<i4"),
    "F32": np.dtype("<f4"),
    "U64": np.dtype("<u8"),
    "I64": np.dtype("<i8"),
    "F64": np.dtype("<f8"),
}
_NP_TO_ST = {np.dtype("u1"): "U8", np.dtype("<f4"): "F32", np.dtype("<f2"): "F16", np.dtype("<i4"): "I32",
             np.dtype("<i8"): "I64", np.dtype("i1"): "I8"}

FORMAT_RE = re.compile(r"^int4_g(32|64|128)_asym$")


class FormatError(Exception):
    pass


# --------------------------------------------------------------------------------------------- bf16


def bf16_to_f32(bits):
    """bf16 bits (uint16 array) -> float32: shift left by 16 and reinterpret (exact)."""
    bits = np.asarray(bits, dtype=np.uint16)
    return (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16_rne(x):
    """float32 -> bf16 bits (uint16), round to nearest, ties to even; NaN stays NaN; overflow -> inf."""
    x = np.asarray(x, dtype=np.float32)
    u = x.view(np.uint32)
    lsb = (u >> np.uint32(16)) & np.uint32(1)
    r = ((u + np.uint32(0x7FFF) + lsb) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(x)
    if np.any(nan):
        r = np.where(nan, ((u >> np.uint32(16)) | np.uint32(0x0040)).astype(np.uint16), r)
    return r


def to_f32(arr, st_dtype):
    """Convert a plain stored tensor to float32 (BF16 given as raw uint16 bits)."""
    if st_dtype == "BF16":
        return bf16_to_f32(arr)
    return np.asarray(arr).astype(np.float32)


# -------------------------------------------------------------------------------------- safetensors


class SafetensorsFile:
    """One safetensors file: header entries, __metadata__, raw tensors (numpy, BF16 as uint16)."""

    def __init__(self, path, strict=False):
        self.path = path
        with open(path, "rb") as f:
            blob = f.read()
        if len(blob) < 8:
            raise FormatError(f"{path}: shorter than 8 bytes")
        (n,) = struct.unpack("<Q", blob[:8])
        if 8 + n > len(blob):
            raise FormatError(f"{path}: header length {n} beyond end of file")
        self.header_len = n
        header = json.loads(blob[8:8 + n].decode("utf-8"))
        self.metadata = header.pop("__metadata__", None) or {}
        self.entries = header
        self._buf = memoryview(blob)[8 + n:]
        self.buffer_len = len(self._buf)
        if strict:
            self._check_strict()

    def _check_strict(self):
        """Checks beyond reading: FORMAT.md §1 padding to 8 bytes, no holes/overlaps in the buffer."""
        if self.header_len % 8 != 0:
            raise FormatError(f"{self.path}: header length {self.header_len} not a multiple of 8")
        for k, v in self.metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise FormatError(f"{self.path}: __metadata__ entry {k!r} is not string -> string")
        spans = sorted((e["data_offsets"][0], e["data_offsets"][1], name) for name, e in self.entries.items())
        pos = 0
        for b, e, name in spans:
            if b != pos:
                raise FormatError(f"{self.path}: tensor {name} starts at {b}, expected {pos} (hole or overlap)")
            pos = e
        if pos != self.buffer_len:
            raise FormatError(f"{self.path}: tensors end at {pos}, buffer is {self.buffer_len} bytes")

    def names(self):
        return list(self.entries.keys())

    def dtype(self, name):
        return self.entries[name]["dtype"]

    def shape(self, name):
        return tuple(self.entries[name]["shape"])

    def raw(self, name):
        """The tensor as stored (numpy array; BF16 as uint16 bits)."""
        e = self.entries[name]
        dt = _ST_DTYPES.get(e["dtype"])
        if dt is None:
            raise FormatError(f"{self.path}: {name}: unsupported dtype {e['dtype']}")
        b, end = e["data_offsets"]
        shape = tuple(e["shape"])
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - b != count * dt.itemsize or b < 0 or end > self.buffer_len:
            raise FormatError(f"{self.path}: {name}: data_offsets {b}..{end} do not fit {e['dtype']} {list(shape)}")
        return np.frombuffer(self._buf[b:end], dtype=dt).reshape(shape)

    def raw_bytes(self, name):
        b, end = self.entries[name]["data_offsets"]
        return bytes(self._buf[b:end])


def weight_files(model_dir):
    """FORMAT.md §4.1: the values of weight_map in model.safetensors.index.json, else model.safetensors."""
    idx = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(idx):
        with open(idx) as f:
            index = json.load(f)
        files = []
        for fn in index["weight_map"].values():
            if fn not in files:
                files.append(fn)
        return files, index
    if os.path.exists(os.path.join(model_dir, "model.safetensors")):
        return ["model.safetensors"], None
    raise FormatError(f"{model_dir}: neither model.safetensors.index.json nor model.safetensors")


def read_safetensors(path, strict=False):
    return SafetensorsFile(path, strict=strict)


def read_model_dir(model_dir, strict=False):
    """Plain (unquantized) HF directory -> {name: (st_dtype, raw array)} over all weight files."""
    files, index = weight_files(model_dir)
    out = {}
    for fn in files:
        st = SafetensorsFile(os.path.join(model_dir, fn), strict=strict)
        for name in st.names():
            if name in out:
                raise FormatError(f"{model_dir}: tensor {name} appears in two files")
            if index is not None and index["weight_map"].get(name) != fn:
                raise FormatError(f"{model_dir}: {name} is in {fn} but the index says {index['weight_map'].get(name)}")
            out[name] = (st.dtype(name), st.raw(name))
    return out


def load_plain_f32(model_dir):
    """Every tensor of a plain HF directory, as float32."""
    return {n: to_f32(a, dt) for n, (dt, a) in read_model_dir(model_dir).items()}


# ------------------------------------------------------------------------------------- int4 format


def parse_format(fmt):
    m = FORMAT_RE.match(fmt)
    if not m:
        raise FormatError(f"unknown format {fmt!r}")
    return int(m.group(1))


def unpack_codes(qweight, in_features):
    """qweight U8 [OUT, ceil(IN/2)] -> codes uint8 [OUT, IN]; low nibble = even input, high = odd."""
    q = np.asarray(qweight, dtype=np.uint8)
    codes = np.empty((q.shape[0], 2 * q.shape[1]), dtype=np.uint8)
    codes[:, 0::2] = q & 0x0F
    codes[:, 1::2] = q >> 4
    return codes[:, :in_features]


def pack_codes(codes):
    """codes [OUT, IN] (0..15) -> qweight U8 [OUT, ceil(IN/2)]; odd IN pads the high nibble with 0."""
    codes = np.asarray(codes, dtype=np.uint8)
    out_f, in_f = codes.shape
    if in_f % 2:
        codes = np.concatenate([codes, np.zeros((out_f, 1), np.uint8)], axis=1)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)


def _expand_groups(per_group, in_features, group):
    """[OUT, NG] -> [OUT, IN]: column i takes group floor(i/G)."""
    return np.repeat(per_group, group, axis=1)[:, :in_features]


def dequantize(qweight, scales_bits, mins_bits, shape, group):
    """FORMAT.md §3: w' = float32(float32(code * s) + m), two separately rounded fp32 operations."""
    out_f, in_f = shape
    ng = -(-in_f // group)
    if qweight.shape != (out_f, (in_f + 1) // 2):
        raise FormatError(f"qweight shape {qweight.shape}, expected {(out_f, (in_f + 1) // 2)}")
    if scales_bits.shape != (out_f, ng) or mins_bits.shape != (out_f, ng):
        raise FormatError(f"scales/mins shapes {scales_bits.shape}/{mins_bits.shape}, expected {(out_f, ng)}")
    codes = unpack_codes(qweight, in_f).astype(np.float32)
    s = _expand_groups(bf16_to_f32(scales_bits), in_f, group)
    m = _expand_groups(bf16_to_f32(mins_bits), in_f, group)
    prod = np.multiply(codes, s, dtype=np.float32)   # rounded to fp32
    return np.add(prod, m, dtype=np.float32)         # rounded to fp32 again (no FMA)


def _group_minmax(w, group):
    """Per-group fp32 min and max of w [OUT, IN] -> ([OUT, NG], [OUT, NG]); the last group may be ragged."""
    out_f, in_f = w.shape
    nfull = in_f // group
    los, his = [], []
    if nfull:
        v = w[:, :nfull * group].reshape(out_f, nfull, group)
        los.append(v.min(axis=2))
        his.append(v.max(axis=2))
    if in_f % group:
        tail = w[:, nfull * group:]
        los.append(tail.min(axis=1, keepdims=True))
        his.append(tail.max(axis=1, keepdims=True))
    return np.concatenate(los, axis=1), np.concatenate(his, axis=1)


def rtn_params(w, group):
    """FORMAT.md §3 writer rule: per group lo, hi (fp32) and the bf16 bits of scale and min."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    lo, hi = _group_minmax(w, group)
    lo = lo + np.float32(0.0)  # a zero lo is taken as +0.0 (x + 0 turns -0 into +0)
    rng = np.subtract(hi, lo, dtype=np.float32)
    step = np.divide(rng, np.float32(15.0), dtype=np.float32)
    return lo, hi, f32_to_bf16_rne(step), f32_to_bf16_rne(lo)


def rtn_quantize(w, group):
    """Round-to-nearest int4 asym per FORMAT.md §3 -> (qweight U8, scales bf16 bits, mins bf16 bits)."""
    w = np.ascontiguousarray(w, dtype=np.float32)
    if w.ndim != 2:
        raise ValueError("rtn_quantize wants a 2-D matrix")
    if not np.all(np.isfinite(w)):
        raise ValueError("rtn_quantize: non-finite weights")
    out_f, in_f = w.shape
    _, _, s_bits, m_bits = rtn_params(w, group)
    s = _expand_groups(bf16_to_f32(s_bits), in_f, group)
    m = _expand_groups(bf16_to_f32(m_bits), in_f, group)
    diff = np.subtract(w, m, dtype=np.float32)
    zero = s == 0
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.divide(diff, np.where(zero, np.float32(1.0), s), dtype=np.float32)
    codes = np.clip(np.rint(ratio), 0, 15)      # np.rint rounds half to even
    codes = np.where(zero, 0, codes).astype(np.uint8)
    return pack_codes(codes), s_bits, m_bits


def bits_per_weight(shape, group):
    """FORMAT.md §3: (8*OUT*ceil(IN/2) + 2*16*OUT*NG) / (OUT*IN)."""
    out_f, in_f = shape
    ng = -(-in_f // group)
    return (8 * out_f * ((in_f + 1) // 2) + 2 * 16 * out_f * ng) / (out_f * in_f)


# ----------------------------------------------------------------------------------- packed reader


class QuantizedTensor:
    def __init__(self, name, fmt, shape, qweight, scales, mins, file):
        self.name, self.format, self.shape = name, fmt, tuple(shape)
        self.group = parse_format(fmt)
        self.qweight, self.scales, self.mins, self.file = qweight, scales, mins, file

    def codes(self):
        return unpack_codes(self.qweight, self.shape[1])

    def dequantize(self):
        return dequantize(self.qweight, self.scales, self.mins, self.shape, self.group)


class PackedCheckpoint:
    """plain: {name: (st_dtype, raw array)}; quantized: {logical name: QuantizedTensor}; files' metadata."""

    def __init__(self, model_dir, strict=False):
        self.dir = model_dir
        self.plain = {}
        self.quantized = {}
        self.file_metadata = {}
        files, self.index = weight_files(model_dir)
        seen = {}
        for fn in files:
            st = SafetensorsFile(os.path.join(model_dir, fn), strict=strict)
            self.file_metadata[fn] = st.metadata
            for name in st.names():
                if name in seen:
                    raise FormatError(f"stored tensor {name} in both {seen[name]} and {fn}")
                seen[name] = fn
                if self.index is not None and self.index["weight_map"].get(name) != fn:
                    raise FormatError(f"{name} is stored in {fn} but the index maps it to "
                                      f"{self.index['weight_map'].get(name)}")
            parts = set()
            nt = st.metadata.get("nibble.tensors")
            if nt is not None:
                for lname, info in json.loads(nt).items():
                    if not lname.endswith(".weight"):
                        raise FormatError(f"{fn}: logical name {lname} does not end in .weight")
                    base = lname[:-len(".weight")]
                    fmt = info["format"]
                    out_f, in_f = info["shape"]
                    group = parse_format(fmt)
                    ng = -(-in_f // group)
                    want = {".qweight": ("U8", (out_f, (in_f + 1) // 2)),
                            ".scales": ("BF16", (out_f, ng)),
                            ".mins": ("BF16", (out_f, ng))}
                    arrs = {}
                    for suf, (dt, shp) in want.items():
                        pn = base + suf
                        if pn not in st.entries:
                            raise FormatError(f"{fn}: {lname}: part {pn} missing from the same file")
                        if st.dtype(pn) != dt or st.shape(pn) != shp:
                            raise FormatError(f"{fn}: {pn}: {st.dtype(pn)} {list(st.shape(pn))}, "
                                              f"expected {dt} {list(shp)}")
                        arrs[suf] = st.raw(pn)
                        parts.add(pn)
                    if lname in self.quantized:
                        raise FormatError(f"{lname} quantized in two files")
                    self.quantized[lname] = QuantizedTensor(lname, fmt, (out_f, in_f), arrs[".qweight"],
                                                            arrs[".scales"], arrs[".mins"], fn)
            for name in st.names():
                if name not in parts:
                    self.plain[name] = (st.dtype(name), st.raw(name))
        clash = set(self.plain) & set(self.quantized)
        if clash:
            raise FormatError(f"names both plain and quantized: {sorted(clash)[:5]}")

    def logical_names(self):
        return sorted(set(self.plain) | set(self.quantized))

    def tensor_f32(self, name):
        if name in self.quantized:
            return self.quantized[name].dequantize()
        dt, a = self.plain[name]
        return to_f32(a, dt)

    def all_f32(self):
        return {n: self.tensor_f32(n) for n in self.logical_names()}


def read_packed(model_dir, strict=False):
    return PackedCheckpoint(model_dir, strict=strict)


def load_checkpoint(model_dir):
    """Every logical tensor of a packed (or plain) nibble checkpoint, as float32."""
    return PackedCheckpoint(model_dir).all_f32()


# ---------------------------------------------------------------------------- minimal writer (tests)


def write_safetensors(path, tensors, metadata=None):
    """tensors: {name: (st_dtype, ndarray)} (BF16 as uint16 bits). Header padded with spaces to 8 bytes."""
    header, blobs, pos = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, (dt, arr) in tensors.items():
        arr = np.ascontiguousarray(arr, dtype=_ST_DTYPES[dt])
        b = arr.tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [pos, pos + len(b)]}
        blobs.append(b)
        pos += len(b)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ------------------------------------------------------------------------------------------- CLI


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="packed nibble checkpoint directory (or a plain HF one)")
    ap.add_argument("--out", help="write every tensor as float32 into this .npz")
    ap.add_argument("--strict", action="store_true", help="also check safetensors layout (padding, holes)")
    args = ap.parse_args(argv)
    ck = PackedCheckpoint(args.dir, strict=args.strict)
    tensors = {}
    for name in ck.logical_names():
        t = ck.tensor_f32(name)
        tensors[name] = t
        how = ck.quantized[name].format if name in ck.quantized else ck.plain[name][0]
        print(f"{name:60s} {str(list(t.shape)):16s} {how:16s} sum={float(t.sum(dtype=np.float64)):.9g}")
    print(f"{len(tensors)} tensors, {len(ck.quantized)} quantized")
    if args.out:
        np.savez(args.out, **tensors)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
