# Sourced by a session's own device scripts (docs/results/sNN/*.sh) on the GPU machine, with OUT set to the
# device tool's output folder: unpacks the bundle scripts/device-check.sh --bundle made (devrun.tar.xz, carried
# with the call), points the binaries at its libraries and fixtures, names the CLI as $N, and records the GPU in
# $OUT/gpu.txt.
rm -rf devrun && tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
N=devrun/bin/nibble
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
# The Llama-3-8B-shaped random-weight model, RTN g128, that the decode runs use, at /tmp/l8b-rtn: built once
# (about 100 s), kept while the machine stays warm.
l8b_rtn() {
  [ -d /tmp/l8b-rtn ] && return 0
  $N -q synth --out /tmp/l8b --tokenizer-from devrun/models/qwen3-26M-linux --force &&
    $N -q quantize --method rtn --model /tmp/l8b --out /tmp/l8b-rtn --force
  local rc=$?
  rm -rf /tmp/l8b
  return $rc
}
