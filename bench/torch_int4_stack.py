#!/usr/bin/env python3
"""PyTorch's references for bench_w4a16 on the same Llama-3-8B-shaped stack (run on the GPU machine).

    python3 bench/torch_int4_stack.py [--layers 32] [--ms 1,4,16,64] [--tinygemm-only]

Times, as CUDA graph replays (median of --reps): torch's own int4 kernel
(aten._weight_int4pack_mm, "tinygemm", group 128) and bf16 F.linear (cuBLAS), for
the unfused stack (q, k, v, o, gate, up, down per layer, then the head).
Random weights and activations (never zeros). --tinygemm-only: the int4 rows
alone (bench_w4a16 runs it so, and times cuBLAS itself).
"""
import argparse

import torch


def shapes(layers):
    h, kv, ff, vocab = 4096, 1024, 14336, 128256
    s = []
    for _ in range(layers):
        s += [(h, h), (kv, h), (kv, h), (h, h), (ff, h), (ff, h), (h, ff)]
    return s + [(vocab, h)]


def time_graph(fn, reps):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()  # warm-up outside the graph (kernel selection, workspaces)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--ms", default="1,4,16,64")
    ap.add_argument("--tinygemm-only", action="store_true")
    args = ap.parse_args()
    ms = [int(v) for v in args.ms.split(",")]
    dev = torch.device("cuda")
    torch.manual_seed(0)
    sh = shapes(args.layers)
    cache = {}
    int4 = []
    for n, k in sh:
        if (n, k) not in cache:
            cache[(n, k)] = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev)
        w = torch.ops.aten._convert_weight_to_int4pack(cache[(n, k)], 8)  # a separate copy per linear
        sz = torch.empty(k // 128, n, 2, dtype=torch.bfloat16, device=dev)
        sz[..., 0].uniform_(0.002, 0.02)
        sz[..., 1].uniform_(-0.1, 0.0)
        int4.append((w, sz))
    int4_bytes = sum(n * k // 2 + (k // 128) * n * 4 for n, k in sh)
    xs = {m: {k: torch.randn(m, k, dtype=torch.bfloat16, device=dev) for k in (4096, 14336)} for m in ms}
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    print(f"{'M':>3} {'tinygemm ms':>12} {'int4 GB':>8}")
    for m in ms:
        def run():
            for (n, k), (w, sz) in zip(sh, int4):
                torch.ops.aten._weight_int4pack_mm(xs[m][k], w, 128, sz)
        print(f"{m:>3} {time_graph(run, args.reps):>12.3f} {int4_bytes / 1e9:>8.3f}", flush=True)
    del int4
    torch.cuda.empty_cache()
    if args.tinygemm_only:
        return
    bf16 = [torch.empty(n, k, dtype=torch.bfloat16, device=dev).uniform_(-0.05, 0.05) for n, k in sh]
    print(f"{'M':>3} {'cuBLAS bf16 ms':>15} {'bf16 GB':>8}")
    for m in ms:
        def run():
            for (n, k), w in zip(sh, bf16):
                torch.nn.functional.linear(xs[m][k], w)
        print(f"{m:>3} {time_graph(run, args.reps):>15.3f} {sum(2 * n * k for n, k in sh) / 1e9:>8.3f}", flush=True)


if __name__ == "__main__":
    main()
