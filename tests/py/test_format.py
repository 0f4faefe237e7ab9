#!/usr/bin/env python3
"""Cross-check nibble's packed checkpoints against an independent reader written from docs/FORMAT.md.

    python3 tests/py/test_format.py --nibble build/bin/nibble --shared ../shared

The environment variable NIBBLE_SHARED, when set, wins over --shared. Exits non-zero on any failure.
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import read_packed as rp  # noqa: E402

FAILURES = []


def fail(msg):
    FAILURES.append(msg)
    print("FAIL: " + msg, flush=True)


def check(cond, msg):
    if not cond:
        fail(msg)
    return bool(cond)


def bits_equal(a, b):
    """Bit-identical float32 arrays (stricter than np.array_equal: -0 != +0, NaN payloads compared)."""
    a = np.ascontiguousarray(a, dtype=np.float32)
    b = np.ascontiguousarray(b, dtype=np.float32)
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


# --------------------------------------------------------------------------------- worked example


def test_worked_example():
    w = np.array([[-1.0, 0.0, 0.5, 2.0]], dtype=np.float32)
    q, s, m = rp.rtn_quantize(w, 32)
    check(q.dtype == np.uint8 and q.tolist() == [[0x50, 0xF7]], f"worked example qweight {q.tolist()}")
    check(s.tolist() == [[0x3E4D]], f"worked example scale bits {[hex(x) for x in s.ravel()]}")
    check(m.tolist() == [[0xBF80]], f"worked example min bits {[hex(x) for x in m.ravel()]}")
    check(float(rp.bf16_to_f32(s)[0, 0]) == 0.2001953125, "worked example scale value")
    check(rp.unpack_codes(q, 4).tolist() == [[0, 5, 7, 15]], "worked example codes")
    d = rp.dequantize(q, s, m, (1, 4), 32)
    want = np.array([[-1.0, 0.0009765625, 0.4013671875, 2.0029296875]], dtype=np.float32)
    check(bits_equal(d, want), f"worked example w' = {d.tolist()}")


def test_bf16_and_packing():
    # round to nearest even, at and around ties
    x = np.array([1.0, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 1.0 + 2.0**-8 + 2.0**-20, -2.5, 0.0, -0.0,
                  np.inf, -np.inf, 3.3895314e38, 3.4e38], dtype=np.float32)
    bits = rp.f32_to_bf16_rne(x).tolist()
    check(bits == [0x3F80, 0x3F80, 0x3F82, 0x3F81, 0xC020, 0x0000, 0x8000, 0x7F80, 0xFF80, 0x7F7F, 0x7F80],
          f"bf16_rne {[hex(b) for b in bits]}")
    check(np.isnan(rp.bf16_to_f32(rp.f32_to_bf16_rne(np.array([np.nan], np.float32))))[0], "bf16 NaN")
    # odd IN: high nibble of the last byte is padding (writer 0, reader ignores it)
    codes = np.array([[1, 2, 3], [15, 0, 9]], dtype=np.uint8)
    q = rp.pack_codes(codes)
    check(q.tolist() == [[0x21, 0x03], [0x0F, 0x09]], f"odd pack {q.tolist()}")
    q2 = q.copy()
    q2[:, -1] |= 0xA0
    check(np.array_equal(rp.unpack_codes(q2, 3), codes), "reader must ignore the padding nibble")


def test_synthetic_roundtrip(tmp):
    """Ragged groups (IN = 172, G = 64: 64+64+44), odd IN, a constant group, sharded file layout."""
    rng = np.random.default_rng(7)
    a = (rng.standard_normal((5, 172)) * 0.05).astype(np.float32)
    a[2, 64:128] = 0.25                                   # constant group -> scale 0, codes 0
    b = (rng.standard_normal((3, 33)) * 0.1 + 10.0).astype(np.float32)  # odd IN, far from zero
    emb = rng.standard_normal((4, 6)).astype(np.float32)
    d = os.path.join(tmp, "synthetic")
    os.makedirs(d)
    files = {"model-00001-of-00002.safetensors": {}, "model-00002-of-00002.safetensors": {}}
    metas = {}
    for (fn, lname, w, g) in [("model-00001-of-00002.safetensors", "l.a.weight", a, 64),
                              ("model-00002-of-00002.safetensors", "l.b.weight", b, 32)]:
        q, s, m = rp.rtn_quantize(w, g)
        x = lname[:-len(".weight")]
        files[fn].update({x + ".qweight": ("U8", q), x + ".scales": ("BF16", s), x + ".mins": ("BF16", m)})
        metas[fn] = {"format": "pt", "nibble.format": f"int4_g{g}_asym", "nibble.group_size": str(g),
                     "nibble.version": "test",
                     "nibble.tensors": json.dumps({lname: {"format": f"int4_g{g}_asym", "shape": list(w.shape)}})}
    files["model-00001-of-00002.safetensors"]["emb.weight"] = ("BF16", rp.f32_to_bf16_rne(emb))
    wm = {}
    for fn, t in files.items():
        rp.write_safetensors(os.path.join(d, fn), t, metas[fn])
        wm.update({n: fn for n in t})
    with open(os.path.join(d, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": wm}, f)
    ck = rp.read_packed(d, strict=True)
    check(sorted(ck.logical_names()) == ["emb.weight", "l.a.weight", "l.b.weight"], "synthetic names")
    check(ck.quantized["l.a.weight"].scales.shape == (5, 3), "synthetic ragged NG")
    check(ck.quantized["l.b.weight"].qweight.shape == (3, 17), "synthetic odd ceil(IN/2)")
    check(np.all(ck.quantized["l.a.weight"].codes()[2, 64:128] == 0), "constant group codes")
    out = ck.all_f32()
    check(np.all(out["l.a.weight"][2, 64:128] == np.float32(rp.bf16_to_f32(rp.f32_to_bf16_rne(np.float32(0.25))))),
          "constant group value")
    check(bits_equal(out["emb.weight"], rp.bf16_to_f32(rp.f32_to_bf16_rne(emb))), "synthetic plain bf16")
    for lname, w, g in [("l.a.weight", a, 64), ("l.b.weight", b, 32)]:
        st = error_stats(w, out[lname], ck.quantized[lname])
        check(st["over_bound"] == 0, f"synthetic {lname}: {st['over_bound']} weights over the doc's error bound")


# --------------------------------------------------------------------------------- real checkpoints


def error_stats(w, wq, qt):
    """Compare original w with reconstruction wq, per FORMAT.md §3's error statement."""
    g = qt.group
    out_f, in_f = qt.shape
    w64 = w.astype(np.float64)
    err = np.abs(w64 - wq.astype(np.float64))
    lo, hi = rp._group_minmax(np.ascontiguousarray(w, dtype=np.float32), g)
    s = rp.bf16_to_f32(qt.scales).astype(np.float64)
    half = rp._expand_groups(s / 2, in_f, g)
    # doc: |min - lo| <= 2^-8 |lo| and 15 |scale - (hi-lo)/15| <= 2^-8 (hi - lo)
    allow = rp._expand_groups(2.0**-8 * np.abs(lo.astype(np.float64)) +
                              2.0**-8 * (hi.astype(np.float64) - lo.astype(np.float64)), in_f, g)
    over_half = err > half
    over_bound = err > half + allow
    worst = 0.0
    if np.any(over_bound):
        worst = float(np.max((err - half - allow)[over_bound]))
    # measured bf16 roundings against the doc's 2^-8 claims
    m = rp.bf16_to_f32(qt.mins).astype(np.float64)
    rng = hi.astype(np.float64) - lo.astype(np.float64)
    min_claim = np.abs(m - lo) <= 2.0**-8 * np.abs(lo.astype(np.float64))
    scale_claim = 15 * np.abs(s - rng / 15) <= 2.0**-8 * rng * (1 + 2.0**-20)  # + fp32 rounding of (hi-lo)/15
    return {
        "over_half": int(over_half.sum()),
        "over_bound": int(over_bound.sum()),
        "worst_excess": worst,
        "max_err": float(err.max()) if err.size else 0.0,
        "rel_error": float(np.linalg.norm((wq.astype(np.float64) - w64).ravel()) / np.linalg.norm(w64.ravel())),
        "min_claim_violations": int((~min_claim).sum()),
        "scale_claim_violations": int((~scale_claim).sum()),
    }


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if r.returncode != 0:
        fail(f"command failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout}{r.stderr}")
        return False
    return True


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_model(nibble, src_dir, tmp, tag, group, expect_bpw=None):
    t0 = time.time()
    print(f"== {tag}: {os.path.basename(src_dir)}, group {group}", flush=True)
    packed = os.path.join(tmp, tag)
    deq = os.path.join(tmp, tag + "-d")
    qcmd = [nibble, "-q", "quantize", "--method", "rtn", "--model", src_dir, "--out", packed]
    if group != 128:
        qcmd += ["--group", str(group)]
    if not run(qcmd):
        return
    if not run([nibble, "-q", "dequantize", "--model", packed, "--out", deq, "--dtype", "f32"]):
        return
    fmt = f"int4_g{group}_asym"

    # --- the packed checkpoint, read per FORMAT.md (strict: header padding, no holes)
    try:
        ck = rp.read_packed(packed, strict=True)
    except rp.FormatError as e:
        fail(f"{tag}: reader: {e}")
        return
    for fn, md in ck.file_metadata.items():
        check(md.get("format") == "pt", f"{tag}/{fn}: __metadata__.format = {md.get('format')!r}")
        check(md.get("nibble.format") == fmt, f"{tag}/{fn}: nibble.format = {md.get('nibble.format')!r}")
        check(md.get("nibble.group_size") == str(group), f"{tag}/{fn}: nibble.group_size = {md.get('nibble.group_size')!r}")
        check(isinstance(md.get("nibble.version"), str), f"{tag}/{fn}: nibble.version missing")
    for lname, qt in ck.quantized.items():
        check(qt.format == fmt, f"{tag}: {lname} format {qt.format}")
        if qt.shape[1] % 2:
            check(np.all(qt.qweight[:, -1] >> 4 == 0), f"{tag}: {lname}: padding nibble not 0")
    if ck.index is not None:
        total = sum(a.nbytes for _, a in ck.plain.values()) + sum(
            q.qweight.nbytes + q.scales.nbytes + q.mins.nbytes for q in ck.quantized.values())
        check(ck.index["metadata"].get("total_size") == total,
              f"{tag}: index total_size {ck.index['metadata'].get('total_size')} != {total}")

    src = rp.read_model_dir(src_dir)
    with open(os.path.join(src_dir, "config.json")) as f:
        cfg = json.load(f)
    tied = bool(cfg.get("tie_word_embeddings", False))
    mine = ck.all_f32()

    # --- which tensors (FORMAT.md §2, §6)
    check(set(mine) == set(src), f"{tag}: logical names differ from the source: "
          f"extra {sorted(set(mine) - set(src))[:5]}, missing {sorted(set(src) - set(mine))[:5]}")
    if tied:
        check("lm_head.weight" not in mine, f"{tag}: tied model has an lm_head tensor")
    for name, (dt, a) in src.items():
        if name not in mine:
            continue
        expect_q = a.ndim == 2 and "embed_tokens" not in name
        check((name in ck.quantized) == expect_q,
              f"{tag}: {name} {'not ' if expect_q else ''}quantized (shape {list(a.shape)})")
        if name in ck.plain:  # stored exactly as in the source
            pdt, pa = ck.plain[name]
            check(pdt == dt and pa.shape == a.shape and pa.tobytes() == a.tobytes(),
                  f"{tag}: plain {name} differs from the source ({pdt} {list(pa.shape)} vs {dt} {list(a.shape)})")

    # --- (i) nibble dequantize output must be bit-identical to this reader
    dq = rp.read_model_dir(deq)
    check(set(dq) == set(mine), f"{tag}: dequantized names differ: {sorted(set(dq) ^ set(mine))[:5]}")
    n_diff = 0
    for name in sorted(set(dq) & set(mine)):
        dt, a = dq[name]
        check(dt == "F32", f"{tag}: dequantized {name} is {dt}, not F32")
        if not bits_equal(rp.to_f32(a, dt), mine[name]):
            n_diff += 1
            x, y = rp.to_f32(a, dt), mine[name]
            if x.shape != y.shape:
                fail(f"{tag}: dequantize vs reader: {name} shape {x.shape} vs {y.shape}")
            else:
                bad = np.argwhere(x.view(np.uint32) != y.view(np.uint32))
                i = tuple(bad[0])
                fail(f"{tag}: dequantize vs reader: {name}: {len(bad)} values differ, first at {list(i)}: "
                     f"nibble {x[i]!r} reader {y[i]!r}")
    print(f"   (i)  nibble dequantize == reader, bit for bit: {len(mine) - n_diff}/{len(mine)} tensors", flush=True)

    # --- (ii) own RTN codes / scales / mins, (iii) error bound, (iv) rel_error, (v) bits/weight
    with open(os.path.join(packed, "nibble.json")) as f:
        nj = json.load(f)
    check(nj.get("format") == fmt and nj.get("group_size") == group and nj.get("method") == "rtn",
          f"{tag}: nibble.json format/group_size/method {nj.get('format')}/{nj.get('group_size')}/{nj.get('method')}")
    for fn, digest in nj.get("source", {}).get("sha256", {}).items():
        check(sha256(os.path.join(src_dir, fn)) == digest, f"{tag}: nibble.json sha256 of {fn} wrong")
    over_half = over_bound = groups_bad = 0
    min_claim = scale_claim = 0
    worst = 0.0
    for lname, qt in sorted(ck.quantized.items()):
        dt, a = src[lname]
        w = rp.to_f32(a, dt)
        q, s, m = rp.rtn_quantize(w, qt.group)
        code_rows = np.any(q != qt.qweight, axis=1)
        sbad, mbad = s != qt.scales, m != qt.mins
        if code_rows.any() or sbad.any() or mbad.any():
            codes_mine = rp.unpack_codes(q, qt.shape[1])
            codes_nib = qt.codes()
            cbad = np.argwhere(codes_mine != codes_nib)
            gbad = np.zeros(s.shape, bool) | sbad | mbad
            for o, i in cbad:
                gbad[o, i // qt.group] = True
            groups_bad += int(gbad.sum())
            msg = f"{tag}: RTN mismatch in {lname}: {int(gbad.sum())}/{gbad.size} groups " \
                  f"({len(cbad)} codes, {int(sbad.sum())} scales, {int(mbad.sum())} mins)"
            if len(cbad):
                o, i = cbad[0]
                msg += f"; first code at [{o},{i}]: mine {codes_mine[o, i]} nibble {codes_nib[o, i]} (w={w[o, i]!r})"
            if sbad.any():
                o, g = np.argwhere(sbad)[0]
                msg += f"; first scale at [{o},{g}]: mine {s[o, g]:#06x} nibble {qt.scales[o, g]:#06x}"
            if mbad.any():
                o, g = np.argwhere(mbad)[0]
                msg += f"; first min at [{o},{g}]: mine {m[o, g]:#06x} nibble {qt.mins[o, g]:#06x}"
            fail(msg)
        st = error_stats(w, mine[lname], qt)
        over_half += st["over_half"]
        over_bound += st["over_bound"]
        min_claim += st["min_claim_violations"]
        scale_claim += st["scale_claim_violations"]
        worst = max(worst, st["worst_excess"])
        if st["over_bound"]:
            fail(f"{tag}: {lname}: {st['over_bound']} weights exceed scale/2 + the doc's bf16 allowance "
                 f"(worst by {st['worst_excess']:.3g})")
        tj = nj.get("tensors", {}).get(lname)
        if not check(tj is not None and tj.get("quantized") is True, f"{tag}: nibble.json lacks quantized {lname}"):
            continue
        check(tj.get("format") == qt.format, f"{tag}: nibble.json {lname} format {tj.get('format')}")
        re_n = tj.get("rel_error")
        check(isinstance(re_n, (int, float)) and abs(re_n - st["rel_error"]) <= 1e-6 * st["rel_error"],
              f"{tag}: {lname} rel_error nibble {re_n} vs mine {st['rel_error']!r}")
        mae = tj.get("max_abs_error")
        check(isinstance(mae, (int, float)) and abs(mae - st["max_err"]) <= 1e-6 * st["max_err"],
              f"{tag}: {lname} max_abs_error nibble {mae} vs mine {st['max_err']!r}")
        bpw = rp.bits_per_weight(qt.shape, qt.group)
        check(abs(tj.get("bits_per_weight", -1) - bpw) <= 1e-12,
              f"{tag}: {lname} bits_per_weight nibble {tj.get('bits_per_weight')} vs doc formula {bpw}")
        if expect_bpw is not None:
            check(bpw == expect_bpw, f"{tag}: {lname} {list(qt.shape)}: {bpw} bits/weight, expected {expect_bpw}")
        nbytes = qt.qweight.nbytes + qt.scales.nbytes + qt.mins.nbytes
        check(tj.get("params") == w.size and tj.get("bytes") == nbytes,
              f"{tag}: {lname} params/bytes {tj.get('params')}/{tj.get('bytes')} vs {w.size}/{nbytes}")
    summ = nj.get("summary", {})
    check(summ.get("quantized_tensors") == len(ck.quantized) and summ.get("total_tensors") == len(src),
          f"{tag}: summary tensor counts {summ.get('quantized_tensors')}/{summ.get('total_tensors')} "
          f"vs {len(ck.quantized)}/{len(src)}")
    check(summ.get("quantized_params") == sum(int(np.prod(q.shape)) for q in ck.quantized.values()),
          f"{tag}: summary quantized_params {summ.get('quantized_params')}")
    nq = sum(int(np.prod(q.shape)) for q in ck.quantized.values())
    print(f"   (ii) own RTN == nibble codes/scales/mins: {'yes' if groups_bad == 0 else f'NO, {groups_bad} groups differ'}"
          f" ({len(ck.quantized)} matrices, {nq} weights)")
    print(f"   (iii) weights with |w-w'| > scale/2: {over_half} of {nq}; "
          f"> scale/2 + doc bf16 allowance: {over_bound}"
          + (f" (worst excess {worst:.3g})" if over_bound else ""))
    print(f"        groups whose bf16 rounding breaks the doc's 2^-8 claims: min {min_claim}, scale {scale_claim}")
    check(min_claim == 0 and scale_claim == 0,
          f"{tag}: bf16 roundings beyond FORMAT.md's 2^-8 bound: {min_claim} mins, {scale_claim} scales")
    print(f"   (iv,v) nibble.json rel_error / max_abs_error / bits_per_weight checked; "
          f"{time.time() - t0:.1f}s", flush=True)
    return over_half


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("--nibble", required=True, help="path to the nibble CLI binary")
    ap.add_argument("--shared", default=None, help="shared data directory (env NIBBLE_SHARED wins)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = ap.parse_args()
    shared = os.environ.get("NIBBLE_SHARED") or args.shared
    if not shared:
        print("no shared directory: pass --shared or set NIBBLE_SHARED", file=sys.stderr)
        return 2
    t0 = time.time()
    tmp = tempfile.mkdtemp(prefix="nibble-format-", dir="/tmp" if os.path.isdir("/tmp") else None)
    try:
        test_worked_example()
        test_bf16_and_packing()
        test_synthetic_roundtrip(tmp)
        print(f"worked example, bf16, packing, synthetic ragged/odd/sharded: "
              f"{'ok' if not FAILURES else 'FAILED'}", flush=True)
        models = os.path.join(shared, "models")
        check_model(args.nibble, os.path.join(models, "stories260K"), tmp, "stories-g64", 64)
        check_model(args.nibble, os.path.join(models, "stories260K"), tmp, "stories-g32", 32)
        check_model(args.nibble, os.path.join(models, "qwen3-26M-linux"), tmp, "qwen3-g128", 128, expect_bpw=4.25)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"total {time.time() - t0:.1f}s")
    if FAILURES:
        print(f"{len(FAILURES)} FAILURE(S)")
        return 1
    print("all format checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
