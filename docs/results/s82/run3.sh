#!/usr/bin/env bash
# Session 82, third call: on an H200 only (none measured since session 75), issue 6's stack at groups of 128 (torch
# and cuBLAS beside) and the 8B decode; no W4A16 kernel has changed since, so these are main's figures there.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
grep -q H200 "$OUT/gpu.txt" || { echo "not an H200: nothing to measure"; exit 0; }
t0=$(date +%s)
timeout 120 devrun/bin/bench_w4a16 >"$OUT/stack_g128.txt" 2>&1
grep -E "^fused|^unfused|^M=1 prepared|read bandwidth|torch|cuBLAS" "$OUT/stack_g128.txt" | head -30
echo "stack done at $(( $(date +%s) - t0 )) s"
timeout 200 scripts/device-check.sh --run "$OUT" decode 2>&1 | tail -8
echo "all done at $(( $(date +%s) - t0 )) s"
