#!/usr/bin/env bash
# Builds a variant of a CUDA benchmark for an A/B run on the device: one CUDA
# source of the library recompiled with extra flags (say -DSOME_PROBE), the
# benchmark linked against a copy of libnibble.a holding that object, so the
# variant and main's binary come from the same tree and differ in that source
# alone. build-cuda/ must be configured and built (scripts/device-check.sh
# --bundle, or cmake as docs/CUDA.md says).
# Usage: scripts/bench-variant.sh OUT SOURCE.cu "FLAGS" [TARGET]
#   e.g. scripts/bench-variant.sh /tmp/bench_probe src/backend/cuda/w4a16_small_m.cu "-DPROBE=1"
#   TARGET defaults to bench_w4a16; OUT is the variant's binary.
set -euo pipefail
[ $# -ge 3 ] || { sed -n 2,12p "$0"; exit 2; }
out=$1 src=$2 flags=$3 target=${4:-bench_w4a16}
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-cuda
[ -f "$build/build.ninja" ] || { echo "bench-variant: no build-cuda/ (configure and build it first)" >&2; exit 1; }
[ -f "$root/$src" ] || { echo "bench-variant: no source $src" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$build"
ninja "$target" >/dev/null
obj=$(basename "$src").o
# The source's own compile command, with the flags added and the object written aside.
cmd=$(ninja -t commands lib/libnibble.a | grep -F -- "-c $root/$src " | head -1)
[ -n "$cmd" ] || { echo "bench-variant: $src is not a source of libnibble.a" >&2; exit 1; }
cmd=$(printf '%s' "$cmd" | sed -E "s# -o [^ ]+\$# -o $work/$obj#; s# -MD -MT [^ ]+ -MF [^ ]+##")
eval "${cmd/ -c / $flags -c }"
cp lib/libnibble.a "$work/libnibble.a"
ar r "$work/libnibble.a" "$work/$obj" 2>/dev/null
# The target's link command, against that library and writing OUT.
link=$(ninja -t commands "$target" | tail -1 | sed -E 's/^: && //; s/ && :$//')
link=${link//lib\/libnibble.a/$work\/libnibble.a}
link=$(printf '%s' "$link" | sed -E "s# -o [^ ]+ # -o $out #")
eval "$link"
echo "bench-variant: $out ($src with $flags)"
