#!/usr/bin/env python3
"""Reference values for nibble's GGUF reader, from llama.cpp's own Python
package (gguf-py, `pip install gguf`): an independent reader and independent
numpy dequantizers to hold nibble's C++ ones against.

  gguf_reference.py dump  FILE.gguf OUTDIR
      OUTDIR/manifest.json: {"version", "alignment", "tensors": [{name, type,
      ne, offset, nbytes, npy}], "metadata": {key: {"type", "value"}}} and one
      OUTDIR/tNNN.npy per tensor: gguf.quants.dequantize() of its bytes, f32,
      in row-major order (shape = ne reversed), nothing else applied.
  gguf_reference.py synth FILE.gguf SEED
      Writes a GGUF with gguf.GGUFWriter holding one [3, 512] tensor of random
      blocks per type nibble dequantizes (every scale field a random finite
      f16, every code field random bits) and metadata of every value type.

Exit status 3 (and a message) when the gguf package cannot be imported.
"""
import json
import os
import sys

try:
    import numpy as np
    import gguf
    from gguf import GGMLQuantizationType as Q
    from gguf import GGUFValueType as V
except ImportError as e:  # the C++ test skips on this
    print(f"gguf_reference.py: cannot import the gguf package ({e}); pip install gguf", file=sys.stderr)
    sys.exit(3)


def metadata_value(field):
    types = [V(t) for t in field.types]
    value = field.contents()
    return {"type": [t.name for t in types], "value": value}


def dump(path, outdir):
    r = gguf.GGUFReader(path)
    os.makedirs(outdir, exist_ok=True)
    meta = {}
    for key, field in r.fields.items():
        if key.startswith("GGUF."):
            continue  # the reader's pseudo-fields for the header
        meta[key] = metadata_value(field)
    tensors = []
    for i, t in enumerate(r.tensors):
        deq = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        deq = np.ascontiguousarray(deq.reshape(shape))
        npy = f"t{i:04d}.npy"
        np.save(os.path.join(outdir, npy), deq)
        tensors.append({"name": t.name, "type": t.tensor_type.name, "ne": [int(d) for d in t.shape.tolist()],
                        "offset": int(t.data_offset), "nbytes": int(t.n_bytes), "npy": npy})
    version = int(r.fields["GGUF.version"].contents())
    alignment = int(r.alignment)
    with open(os.path.join(outdir, "manifest.json"), "w") as f:
        json.dump({"version": version, "alignment": alignment, "tensors": tensors, "metadata": meta}, f)


# Byte offsets of the f16 scale/min fields inside one block of each type
# (ggml-common.h's block structs).
F16_FIELDS = {
    Q.Q8_0: [0], Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.IQ4_NL: [0],
    Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208], Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.IQ4_XS: [0],
    Q.TQ1_0: [52], Q.TQ2_0: [64], Q.MXFP4: [], Q.NVFP4: [],  # MXFP4: an E8M0 byte, every value valid
}
# Byte ranges of unsigned 7-bit scale fields (NVFP4's UE4M3): the top bit cleared.
UE4M3_FIELDS = {Q.NVFP4: (0, 4)}


def random_finite_f16_bits(rng, n):
    bits = rng.integers(0, 1 << 16, size=n, dtype=np.uint32).astype(np.uint16)
    # Exponent all ones is inf/NaN: move those to the largest finite exponent.
    exp_all_ones = (bits & 0x7C00) == 0x7C00
    bits[exp_all_ones] &= np.uint16(0xFBFF)
    return bits


def synth(path, seed):
    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(path, "synthetic")
    # One key per value type, and nested arrays.
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4000000000)
    w.add_int32("t.i32", -2000000000)
    w.add_uint64("t.u64", 18000000000000000000)
    w.add_int64("t.i64", -9000000000000000000)
    w.add_float32("t.f32", 0.1)
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ▁wörld")
    w.add_array("t.arr_i", [1, -2, 3])
    w.add_array("t.arr_s", ["a", "", "▁b"])
    w.add_array("t.arr_f", [0.5, -1.25])
    w.add_array("t.nested", [[1, 2], [3]])
    rows, cols = 3, 512
    for qt in [Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.IQ4_NL, Q.Q4_K, Q.Q5_K, Q.Q6_K,
               Q.Q2_K, Q.Q3_K, Q.IQ4_XS, Q.TQ1_0, Q.TQ2_0, Q.MXFP4, Q.NVFP4]:
        block, size = gguf.GGML_QUANT_SIZES[qt]
        nb = rows * cols // block
        if qt == Q.F32:  # random finite f32 bit patterns, subnormals included
            bits = rng.integers(0, 1 << 32, size=rows * cols, dtype=np.uint64).astype(np.uint32)
            bits[(bits & 0x7F800000) == 0x7F800000] &= np.uint32(0xFF7FFFFF)
            data = bits.view(np.uint8)
        elif qt == Q.F16:
            data = random_finite_f16_bits(rng, rows * cols).view(np.uint8)
        elif qt == Q.BF16:
            bits = rng.integers(0, 1 << 16, size=rows * cols, dtype=np.uint32).astype(np.uint16)
            bits[(bits & 0x7F80) == 0x7F80] &= np.uint16(0xFF7F)
            data = bits.view(np.uint8)
        else:
            blocks = rng.integers(0, 256, size=(nb, size), dtype=np.uint16).astype(np.uint8)
            for off in F16_FIELDS[qt]:
                blocks[:, off:off + 2] = random_finite_f16_bits(rng, nb).view(np.uint8).reshape(nb, 2)
            if qt in UE4M3_FIELDS:
                a, b = UE4M3_FIELDS[qt]
                blocks[:, a:b] &= np.uint8(0x7F)
            data = blocks.reshape(-1)
        data = np.ascontiguousarray(data.reshape(rows, -1))
        w.add_tensor(f"synth.{qt.name}", data, raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "dump":
        dump(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 4 and sys.argv[1] == "synth":
        synth(sys.argv[2], int(sys.argv[3]))
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
