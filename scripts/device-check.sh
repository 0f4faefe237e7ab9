#!/usr/bin/env bash
# Checks that need a GPU machine with torch + transformers (the lent H200):
#   gpu:           the CUDA kernel tests (CI compiles them but has no GPU) and the
#                  W4A16 stack benchmark, which prints torch's int4 kernel and cuBLAS bf16 on the same stack;
#   gptq:          GPTQ on the GPU: the Cuda.Gptq* / Cuda.Calibration* tests (solve, calibration forward,
#                  end-to-end runs) and bench_gptq_cuda (GPU vs CPU solve);
#   attention:     flash prefill attention: the Cuda.FlashAttention* tests and bench_attention;
#   eval:          the KL yardstick on the GPU: the CudaEval.* tests (and the GPU forward's), nibble eval on qwen3-26M-linux with
#                  --device cpu and --device cuda (same numbers, both times), and the 8B-shaped model on the GPU;
#   transformers:  nibble's packed checkpoints, dequantized, load in transformers and generate; so does
#                  llama.cpp's F32 GGUF of stories260K, dequantized (its tokenizer.json too);
#   gptq8b:        issue 6's GPTQ target: GPTQ+MSE of the 8B-shaped model on the GPU, 128 × 2048 tokens, with and
#                  without --refine 30 (whole command timed; nibble.json's seconds and refine totals);
#   decode:        issue 6's decode target: the 8B-shaped model (nibble synth, RTN int4 g128), nibble run
#                  --device cuda, 256 tokens, three runs (tok/s against the roofline from the bandwidth measured
#                  in the same process).
# Usage on this machine: scripts/device-check.sh --bundle [--models]
#          (builds build-cuda/ for sm_90a and assembles devrun/: binaries, the shared
#           libraries a bare CUDA image may lack, and with --models the two fixtures;
#           then packs it as devrun.tar.xz, the path to carry)
#        on the GPU machine: scripts/device-check.sh --run OUTDIR [gpu] [gptq] [attention] [eval] [transformers]
#                            [gptq8b] [decode]
#        scripts/device-check.sh --slim | --unslim
#          (removes the tracked files of docs/results/, the measurements' archive, which no check reads, so that a
#           --models bundle and the tree fit the device tool's 64 MiB; --unslim checks them out again. The run
#           scripts there (*.sh, about 70 KB in all) and files not yet committed stay, so a session's own device
#           scripts travel. Never commit while slim.)
set -euo pipefail
cd "$(dirname "$0")/.."
SHARED=${NIBBLE_SHARED:-../shared}

# Bytes the device tool counts for the files named (NUL-separated) on stdin that exist: by disk blocks (du), not by
# file sizes (14.4 MB against 11.4 MB for the tree in session 51). The tree it copies: the tracked files and the
# untracked ones git does not ignore (tree_files).
existing_bytes() {
  while IFS= read -r -d '' f; do if [ -f "$f" ]; then printf '%s\0' "$f"; fi; done |
    xargs -0 -r du -k | awk '{s += $1} END {print s * 1024}'
}
tree_files() { git ls-files -z --cached --others --exclude-standard; }
# What --slim removes: docs/results/' tracked files but its run scripts.
slim_files() { git ls-files -z docs/results | grep -zv '\.sh$'; }

case "${1:-}" in
  --slim)
    slim_files | xargs -0 rm -f
    find docs/results -type d -empty -delete
    echo "docs/results/ slim: $(tree_files | existing_bytes) bytes travel besides the bundle"
    exit 0 ;;
  --unslim) git checkout -- docs/results; exit 0 ;;
esac

if [ "${1:-}" = "--bundle" ]; then
  # A machine restored from a snapshot gives every file a new mtime, so ninja cannot see that an object was built
  # from a source that was changed afterwards (a probe applied, bundled, then reverted). Each bundle records the
  # commit it was built at and the files that differed from it; the next one touches those and every file changed
  # since, so ninja rebuilds them (all sources where the recorded commit is unknown).
  stamp=build-cuda/.bundle-sources
  if [ -f "$stamp" ]; then
    base=$(head -n 1 "$stamp")
    if changed=$(git diff --name-only "$base" 2>/dev/null); then
      { tail -n +2 "$stamp"; echo "$changed"; } | sort -u | while read -r f; do if [ -f "$f" ]; then touch "$f"; fi; done
    else
      git ls-files src include bench tools tests | xargs touch
    fi
  fi
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DNIBBLE_CUDA=on >/dev/null
  cmake --build build-cuda --target nibble_cli nibble_tests bench_w4a16 bench_gptq_cuda bench_attention \
    bench_decode_trace >/dev/null
  { git rev-parse HEAD; git diff --name-only HEAD; } >"$stamp"
  rm -rf devrun && mkdir -p devrun/bin devrun/lib devrun/models
  cp build-cuda/bin/nibble build-cuda/bin/nibble_tests build-cuda/bin/bench_w4a16 build-cuda/bin/bench_gptq_cuda \
     build-cuda/bin/bench_attention build-cuda/bin/bench_decode_trace devrun/bin/
  # Shared libraries outside glibc/libstdc++/CUDA that the binaries need (the GPU machine has the CUDA 13
  # toolkit's libraries: cuBLAS(Lt), cuSOLVER and its cuSPARSE / nvJitLink, and CUPTI under extras/, which --run
  # puts on the library path).
  ldd build-cuda/bin/nibble_tests build-cuda/bin/bench_w4a16 build-cuda/bin/bench_gptq_cuda \
    build-cuda/bin/bench_decode_trace | awk '/=> \//{print $3}' | sort -u |
    grep -Ev '/(libc|libm|libdl|libpthread|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|libcuda|libcublas|libcudart|libcusolver|libcusparse|libnvJitLink|libcupti' |
    while read -r l; do cp -L "$l" devrun/lib/; done
  if [ "${2:-}" = "--models" ]; then
    # The benchmarks stay: in the solid xz stream, which they share with nibble's other binaries, all four add about
    # 0.7 MB (session 66; sessions 59-65 left them out).
    for m in stories260K qwen3-26M-linux; do
      mkdir -p "devrun/models/$m"
      find "$SHARED/models/$m" -maxdepth 1 -type f \( -name '*.json' -o -name '*.safetensors' \) \
        -exec cp {} "devrun/models/$m/" \;
    done
    # The calibration text of the GPU GPTQ end-to-end tests (Cuda.GptqOnGpu*).
    mkdir -p devrun/data/corpora
    # (Cuda.GptqOnGpuQuantizesTheHeadAndResumes draws 8 windows of 128 tokens: 100 KB of linux-calib.txt is enough.)
    cp "$SHARED/data/corpora/tinystories-valid-sample.txt" devrun/data/corpora/
    head -c 100000 "$SHARED/data/corpora/linux-calib.txt" >devrun/data/corpora/linux-calib.txt
    # The GPU gsm8k test's problems, and four of llama.cpp's files of stories260K (GGUF tokenizer, dequantize, Q4_0 and
    # Q4_1 on the W4A16 kernels).
    head -n 50 "$SHARED/data/corpora/gsm8k-test.jsonl" >devrun/data/corpora/gsm8k-test.jsonl
    mkdir -p devrun/models/stories260K/gguf
    cp "$SHARED/models/stories260K/gguf/stories260K-F32.gguf" "$SHARED/models/stories260K/gguf/stories260K-Q4_K_M.gguf" \
       "$SHARED/models/stories260K/gguf/stories260K-Q4_0.gguf" "$SHARED/models/stories260K/gguf/stories260K-Q4_1.gguf" \
       "$SHARED/models/stories260K/gguf/stories260K-Q5_K_M.gguf" "$SHARED/models/stories260K/gguf/stories260K-IQ4_NL.gguf" \
      devrun/models/stories260K/gguf/
    # The eval check's corpus: the first 250 KB of linux-eval.txt (about 60 000 tokens: the check scores 40 chunks
    # of 512, the tests read 60 KB) keeps the bundle small.
    head -c 250000 "$SHARED/data/corpora/linux-eval.txt" >devrun/data/corpora/linux-eval.txt
  fi
  strip devrun/bin/*  # their symbol tables: about 1 MB of the archive
  # The device tool takes at most 64 MiB with the working tree: ship one compressed archive (carry devrun.tar.xz).
  # The checks run no golden test and no CPU benchmark, so neither travels (with them it was over the limit).
  tar -cf - devrun | xz -T2 --x86 --lzma2=preset=9e >devrun.tar.xz  # x86 filter: the binaries and libraries 0.4 MB smaller
  du -sh devrun devrun.tar.xz
  tree=$(tree_files | existing_bytes)
  total=$((tree + $(stat -c %s devrun.tar.xz)))
  echo "travels: $total bytes of 67108864 (working tree $tree + devrun.tar.xz)"
  if [ "$total" -gt 67108864 ]; then
    # docs/results/ (the measurements' archive) is most of the tree and no check reads it: the call may leave out
    # its tracked files but the run scripts (slim_files).
    results=$(slim_files | existing_bytes)
    echo "over the device tool's 64 MiB ($total bytes); slim (--slim) $((total - results)) bytes:" >&2
    echo "  $0 --slim before the call, $0 --unslim after it" >&2
    [ $((total - results)) -le 67108864 ] || exit 1
  fi
  exit 0
fi

[ "${1:-}" = "--run" ] || { echo "usage: $0 --bundle [--models] | --slim | --unslim | --run OUTDIR [gpu] [gptq] [attention] [eval] [transformers] [gptq8b] [decode]" >&2; exit 2; }
OUT=$2
shift 2
[ -d devrun ] || tar -xJf devrun.tar.xz
export LD_LIBRARY_PATH="$PWD/devrun/lib:/usr/local/cuda/extras/CUPTI/lib64:${LD_LIBRARY_PATH:-}"
export NIBBLE_SHARED="$PWD/devrun" NIBBLE_TEST_BIN="$PWD/devrun/bin/nibble"  # the tests' fixtures and CLI
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
for what in "${@:-gpu}"; do
  case $what in
    gpu)
      devrun/bin/nibble_tests --gtest_filter='Cuda*' 2>&1 | tee "$OUT/cuda_tests.txt" | tail -25
      # bench_w4a16 runs bench/torch_int4_stack.py itself (torch's tinygemm beside nibble's stacks).
      devrun/bin/bench_w4a16 2>&1 | tee "$OUT/bench_w4a16.txt"
      ;;
    gptq)
      devrun/bin/nibble_tests --gtest_filter='Cuda.Gptq*:Cuda.Hessian*:Cuda.Calibration*:Cuda.Refine*:Gptq*:Refine*' 2>&1 |
        tee "$OUT/cuda_gptq_tests.txt" | tail -40
      devrun/bin/bench_gptq_cuda --cpu-ref small 2>&1 | tee "$OUT/bench_gptq_cuda.txt"
      ;;
    attention)
      devrun/bin/nibble_tests --gtest_filter='Cuda.FlashAttention*' 2>&1 | tee "$OUT/cuda_attention_tests.txt" | tail -25
      devrun/bin/bench_attention 2>&1 | tee "$OUT/bench_attention.txt"
      ;;
    eval)
      devrun/bin/nibble_tests --gtest_filter='CudaEval.*:KlEval.*:Cuda.GpuForward*:Cuda.DecodeGraph*:Cuda.ActQuant*' 2>&1 | tee "$OUT/cuda_eval_tests.txt" | tail -12
      m=devrun/models/qwen3-26M-linux c=linux=devrun/data/corpora/linux-eval.txt
      devrun/bin/nibble -q quantize --method rtn --model $m --out /tmp/nibble-q-eval --force
      for d in cpu cuda; do
        { time devrun/bin/nibble eval -q --device $d --reference $m --candidate /tmp/nibble-q-eval --corpus $c \
            --ctx 512 --chunks 40 --json "$OUT/eval-qwen3-$d.json"; } 2>&1 | tee "$OUT/eval-qwen3-$d.txt" | tail -8
      done
      # The 8B shape on the GPU: reference and noise floor (cached), then the candidate, timed apart.
      devrun/bin/nibble -q synth --out /tmp/nibble-l8b --tokenizer-from $m --force
      devrun/bin/nibble -q quantize --method rtn --model /tmp/nibble-l8b --out /tmp/nibble-l8b-rtn --force
      { time devrun/bin/nibble eval -q --device cuda --noise-floor --reference /tmp/nibble-l8b --corpus $c --ctx 512 \
          --chunks 16 --reference-cache /tmp/nibble-l8b-ref; } 2>&1 | tee "$OUT/eval-l8b-reference.txt" | tail -5
      { time devrun/bin/nibble eval -q --device cuda --reference /tmp/nibble-l8b --candidate /tmp/nibble-l8b-rtn \
          --corpus $c --ctx 512 --chunks 16 --reference-cache /tmp/nibble-l8b-ref; } 2>&1 |
        tee "$OUT/eval-l8b-candidate.txt" | tail -8
      ;;
    transformers)
      python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" |
        tee -a "$OUT/gpu.txt"
      for spec in "stories260K 64 Once upon a time" "qwen3-26M-linux 128 static int"; do
        read -r m g prompt <<<"$spec"
        devrun/bin/nibble -q quantize --method rtn --model "devrun/models/$m" --out "/tmp/nibble-q-$m" --group "$g" --force
        devrun/bin/nibble -q dequantize --model "/tmp/nibble-q-$m" --out "/tmp/nibble-d-$m" --dtype f32 --force
        python3 scripts/check_transformers.py --original "devrun/models/$m" --dequantized "/tmp/nibble-d-$m" \
          --prompt "$prompt" --out "$OUT/transformers-$m.json" 2>&1 | tee "$OUT/transformers-$m.txt"
      done
      # llama.cpp's F32 file of stories260K, dequantized by nibble (config.json and tokenizer.json written from
      # the GGUF metadata): transformers should load it, tokenize as the original and give its logits.
      devrun/bin/nibble -q dequantize --model devrun/models/stories260K/gguf/stories260K-F32.gguf \
        --out /tmp/nibble-d-gguf --force
      python3 scripts/check_transformers.py --original devrun/models/stories260K --dequantized /tmp/nibble-d-gguf \
        --prompt "Once upon a time" --out "$OUT/transformers-gguf.json" 2>&1 | tee "$OUT/transformers-gguf.txt"
      ;;
    decode)
      devrun/bin/nibble synth --out /tmp/nibble-l8b-d --tokenizer-from devrun/models/qwen3-26M-linux --force 2>&1 |
        tail -3 | tee "$OUT/decode-synth.txt"
      devrun/bin/nibble -q quantize --method rtn --model /tmp/nibble-l8b-d --out /tmp/nibble-l8b-d-rtn --force
      rm -rf /tmp/nibble-l8b-d
      for r in 1 2 3; do
        echo "== run $r" >>"$OUT/decode.txt"
        devrun/bin/nibble run --model /tmp/nibble-l8b-d-rtn --prompt hello -n 256 --ignore-eos --device cuda 2>&1 \
          >/dev/null | grep -E "decode|prefill" >>"$OUT/decode.txt"
      done
      cat "$OUT/decode.txt"
      ;;
    gptq8b)
      # Issue 6's GPTQ target: GPTQ+MSE of the 8B-shaped model (nibble synth) with 128 × 2048 calibration tokens
      # (2^20 random token ids) on the GPU, and the same with --refine 30; the whole command timed, and nibble.json's
      # per-step seconds and refine totals.
      devrun/bin/nibble -q synth --out /tmp/nibble-l8b-g --force
      python3 -c "import numpy as np; np.save('/tmp/nibble-ids.npy', np.random.default_rng(0).integers(0, 128256, 1 << 20).astype(np.int32))"
      for extra in "" "--refine 30"; do
        tag=gptq${extra:+-refine}
        { time devrun/bin/nibble -q quantize --method gptq --mse --device cuda --model /tmp/nibble-l8b-g \
            --calib /tmp/nibble-ids.npy --calib-samples 128 --calib-len 2048 $extra --out /tmp/nibble-l8b-$tag \
            --force; } 2>&1 | tee "$OUT/$tag-8b.txt" | tail -4
        python3 - "/tmp/nibble-l8b-$tag/nibble.json" <<'PY' | tee -a "$OUT/$tag-8b.txt"
import json, sys
j = json.load(open(sys.argv[1]))
print("seconds:", json.dumps(j.get("calibration", {}).get("seconds", {})))
t = [v["refine"] for v in j["tensors"].values() if "refine" in v]
if t:
    b, a = sum(x["objective_before"] for x in t), sum(x["objective_after"] for x in t)
    print(f"refine: {len(t)} matrices, objective {b:.6g} -> {a:.6g} ({100 * (1 - a / b):.2f} % lower), "
          f"{sum(x['codes_changed'] for x in t)} weights moved, {sum(x['groups_refit'] for x in t)} groups refit")
PY
        rm -rf "/tmp/nibble-l8b-$tag"
      done
      ;;
    *) echo "unknown check: $what" >&2; exit 2 ;;
  esac
done
