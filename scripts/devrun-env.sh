# Sourced by a session's own device scripts (docs/results/sNN/*.sh) on the GPU machine, with OUT set to the
# device tool's output folder: unpacks the bundle scripts/device-check.sh --bundle made (devrun.tar.xz, carried
# with the call), points the binaries at its libraries and fixtures, names the CLI as $N, and records the GPU in
# $OUT/gpu.txt.
rm -rf devrun && tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH=$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}
export NIBBLE_SHARED=$PWD/devrun NIBBLE_TEST_BIN=$PWD/devrun/bin/nibble
N=devrun/bin/nibble
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
