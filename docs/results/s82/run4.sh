#!/usr/bin/env bash
# Session 82, a last short call: on an H200 only, issue 6's stack at groups of 128 (torch and cuBLAS beside), main's
# kernels (unchanged since session 75's measurement there). Decode does not fit the session's remaining device time.
set -uo pipefail
OUT=$1
source scripts/devrun-env.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
grep -q H200 "$OUT/gpu.txt" || { echo "not an H200: nothing to measure"; exit 0; }
timeout 100 devrun/bin/bench_w4a16 >"$OUT/stack_g128.txt" 2>&1
grep -E "^fused|^unfused|^M=1 prepared|read bandwidth|torch|cuBLAS" "$OUT/stack_g128.txt" | head -30
