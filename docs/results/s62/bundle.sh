#!/usr/bin/env bash
# The bundle for run_probe.sh: scripts/device-check.sh's plain bundle (benchmarks, no fixtures) plus the
# tokenizer files of qwen3-26M-linux, which `nibble synth --tokenizer-from` copies into the 8B-shaped model.
set -euo pipefail
cd "$(dirname "$0")/../../.."
SHARED=${NIBBLE_SHARED:-../shared}
scripts/device-check.sh --bundle
mkdir -p devrun/models/qwen3-26M-linux
cp "$SHARED"/models/qwen3-26M-linux/{config.json,tokenizer.json,tokenizer_config.json} devrun/models/qwen3-26M-linux/
tar -cf - devrun | xz -T2 --x86 --lzma2=preset=9e >devrun.tar.xz
du -sh devrun.tar.xz
