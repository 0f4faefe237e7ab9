#!/usr/bin/env python3
"""Warp-stall samples per instruction from Nsight Compute's source page.

  ncu -k regex:KERNEL --section SourceCounters --section WarpStateStats -o rep BINARY ...
  ncu --import rep.ncu-rep --page source --print-source sass --csv > sass.csv
  scripts/ncu-sass-stalls.py sass.csv [--kernel I] [--top N] [--loop COUNT]

Prints, for profiled kernel I (0 = the first in the file): the stall reasons of
each group of instructions that executed equally often (a loop body shares one
count), the N instructions with the most samples, and with --loop COUNT the
opcode mix of the instructions executed COUNT times.

ncu 2025.3 leaves one column out of some rows (67 fields against the header's
68, before the stall columns), so each row's stall columns are read from the
end: without that, every sample of those rows lands on the reason next to its own.
"""
import argparse
import collections
import csv
import sys


def kernels(path):
    out, cur, hdr = [], None, None
    with open(path, newline="") as f:
        for r in csv.reader(f):
            if not r:
                continue
            if r[0] == "Kernel Name":
                cur = {"name": r[1], "rows": []}
                out.append(cur)
            elif r[0] == "Address":
                hdr = r
            elif cur is not None and r[0].startswith("0x"):
                cur["rows"].append(r)
    if hdr is None:
        sys.exit(f"{path}: no 'Address' header row (was it written with --page source --csv?)")
    return hdr, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--kernel", type=int, default=0)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--loop", type=int, default=0, help="opcode mix of the instructions executed this often")
    a = ap.parse_args()
    hdr, ks = kernels(a.csv)
    if not 0 <= a.kernel < len(ks):
        sys.exit(f"{a.csv}: {len(ks)} kernels, no kernel {a.kernel}")
    k = ks[a.kernel]
    col = {h: i for i, h in enumerate(hdr)}
    stalls = [h for h in hdr if h.startswith("stall_") and "Not Issued" not in h]

    def reasons(r):
        shift = len(hdr) - len(r)
        return {h[6:]: int(r[col[h] - shift] or 0) for h in stalls}

    def executed(r):
        return int(r[col["Instructions Executed"]] or 0)

    print(f"kernel {a.kernel}: {k['name'][:160]}")
    by_count = collections.defaultdict(collections.Counter)
    for r in k["rows"]:
        by_count[executed(r)].update(reasons(r))
    total = sum(sum(c.values()) for c in by_count.values())
    print(f"{total} samples; by execution count (count: samples, share, top reasons in %):")
    for n in sorted(by_count, key=lambda n: -sum(by_count[n].values()))[:6]:
        c = by_count[n]
        s = sum(c.values())
        if s == 0:
            continue
        top = ", ".join(f"{h} {100 * v / s:.1f}" for h, v in c.most_common(6) if v)
        print(f"  {n}: {s} ({100 * s / total:.0f} %): {top}")
    print(f"top {a.top} instructions (address, executed, samples, source, reasons):")
    for r in sorted(k["rows"], key=lambda r: -sum(reasons(r).values()))[: a.top]:
        c = reasons(r)
        top = ", ".join(f"{h} {v}" for h, v in sorted(c.items(), key=lambda x: -x[1])[:3] if v)
        print(f"  {r[0][-5:]} {executed(r):7d} {sum(c.values()):5d}  {r[1].strip()[:56]:56s} {top}")
    if a.loop:
        mix = collections.Counter()
        for r in k["rows"]:
            if executed(r) == a.loop:
                mix[next(t for t in r[1].split() if not t.startswith("@"))] += 1
        print(f"opcodes executed {a.loop} times: {sum(mix.values())}")
        for op, n in mix.most_common():
            print(f"  {op:28s}{n:4d}")


if __name__ == "__main__":
    main()
