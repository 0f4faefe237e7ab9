#!/usr/bin/env bash
# Installs what nibble needs to build and test, quietly and only what is missing.
# Debian/Ubuntu (apt) for the C++ side; pip for the Python used by the format
# cross-check (an independent reader written from docs/FORMAT.md) and by the
# GGUF tests (gguf: llama.cpp's own reader and dequantizers, the reference).
set -euo pipefail

APT_PACKAGES=(
  cmake ninja-build g++ pkg-config
  nlohmann-json3-dev libcli11-dev libfmt-dev libssl-dev
  libopenblas-dev libopenblas0-openmp liblapacke-dev libpcre2-dev libutf8proc-dev
  libgtest-dev libgmock-dev libbenchmark-dev
)

# `install-deps.sh --fuzz` adds clang and its libFuzzer/sanitizer runtime (make fuzz).
if [ "${1:-}" = "--fuzz" ]; then APT_PACKAGES+=(clang libclang-rt-dev); fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/tmp/nibble-apt.log 2>&1; then
    $SUDO apt-get update -qq >/tmp/nibble-apt.log 2>&1
    $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >>/tmp/nibble-apt.log 2>&1 ||
      { echo "install-deps: apt-get failed, see /tmp/nibble-apt.log" >&2; tail -20 /tmp/nibble-apt.log >&2; exit 1; }
  fi
fi

PY=${PYTHON:-python3}
if command -v "$PY" >/dev/null 2>&1 && ! "$PY" -c "import numpy, gguf" 2>/dev/null; then
  echo "install-deps: pip install numpy gguf" >&2
  "$PY" -m pip install -q numpy gguf >/tmp/nibble-pip.log 2>&1 ||
    { echo "install-deps: pip install numpy gguf failed, see /tmp/nibble-pip.log" >&2; exit 1; }
fi
