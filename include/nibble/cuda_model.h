// The Llama-family forward pass on an NVIDIA GPU (CUDA builds only; see
// docs/CUDA.md). Linears of a format with a CUDA kernel (int4_asym, int4_sym and int4_asym_f32:
// w4a16_mma; also a rival's linears such a format holds exactly,
// ModelSource::exact_format) stay packed on the device; everything else is held as bf16 and runs through
// cuBLAS. Inputs of linears are bf16 (f32 in decode when every linear takes
// f32 single-token inputs: the integer W4A16 GEMV); their outputs, the
// residual stream, norms, RoPE and attention are fp32, and so is the KV cache
// unless GpuOptions::kv_dtype makes it bf16.
// GpuOptions::f32_linears instead holds every linear as f32 with f32 inputs
// (the KL yardstick's forward).
// Not yet: simulated activation quantizers (ModelSource::activation_quant(),
// which this forward does not apply) and KV caches other than f32 and bf16;
// nibble run and nibble eval refuse them on --device cuda.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "nibble/act_quant.h"
#include "nibble/dtype.h"
#include "nibble/model.h"
#include "nibble/model_config.h"
#include "nibble/sampler.h"
#include "nibble/source.h"
#include "nibble/tensor.h"

namespace nibble::cuda {

struct GpuOptions {
  // Decode (one token per forward) replays one CUDA graph captured at load
  // time; off, the same kernels are launched one by one (same results).
  bool decode_graph = true;
  // q|k|v and gate|up each as one linear (rows concatenated at load, same
  // values) when they share a format.
  bool fuse_linears = true;
  // Prefill (more than one token) runs the flash attention kernel where it
  // supports the head dim (64, 128, 256); off, the row-wise kernel decode uses
  // (same values up to fp32 summation order; include/nibble/cuda_attention.h).
  bool flash_prefill = true;
  // With flash_prefill: prefill attention on bf16 tensor cores
  // (flash_attention_tc: q, k, v and the probabilities P rounded to bf16,
  // fp32 scores, statistics and sums; what a bf16 inference engine computes)
  // where the head dim is 64 or 128, 4× the fp32 kernel's rate at long
  // prompts. Not with f32_linears, whose yardstick keeps the CPU forward's
  // fp32 attention; off, prefill attention is fp32 as well.
  bool tensor_core_prefill = true;
  // Decode runs no RMSNorm or SiLU kernel between the layers' int4 linears:
  // the o and down GEMVs add to the residual and write the next norm's input,
  // gate|up writes SiLU(gate)·up, each as the next GEMV's prepared input, and
  // the GEMV after a norm applies its 1/rms (GemvFusion). Where a model does
  // not allow it (other formats, biases on o/gate/up/down, an unfused or
  // ragged gate|up) decode keeps the separate kernels. Off: always separate
  // (the same values up to fp32 rounding).
  bool fuse_decode = true;
  // With fuse_decode: the GEMVs between two attention kernels (o, gate|up,
  // down and the next layer's q|k|v; the last layer's o, gate|up, down and
  // the head) run as one persistent launch (LinearKernel::gemv_chain), whose
  // weight stream goes on while each GEMV waits for the one before. The same
  // values as one launch per GEMV (bit-identical where every lone GEMV splits
  // K over 16 warps). Off by default: on the H200 it is still slower than the
  // separate launches (docs/CUDA.md, "GEMV chains").
  bool chain_decode = false;
  // Decode attention from this position on through kv_shared_attention, which
  // reads each kv head's cache rows once for all of its query heads, where the
  // model allows it (head_dim 64 / 128, 1, 2, 4 or 8 query heads per kv head)
  // and the cache is longer; before it, decode_attention. -1: never;
  // kKvSharedAuto: the crossover measured for the cache's element type
  // (kv_shared_crossover). With a graph, the step is captured once per
  // kernel. On the H200 (8B shape), f32 cache: the kv-shared kernel is slower
  // up to ~3000 positions and faster beyond (step 2951 -> 2485 µs at 8000;
  // docs/results/decode-long-context-s17.md); bf16 cache: faster from ~2000
  // (docs/CUDA.md, "A bf16 KV cache").
  static constexpr int64_t kKvSharedAuto = -2;
  int64_t kv_shared_from = kKvSharedAuto;
  // The yardstick's forward (nibble eval --device cuda): every linear runs
  // through cuBLAS in fp32 (no TF32) on f32 inputs with the f32 values the CPU
  // forward computes with, so the logits are the CPU forward's up to fp32
  // summation order. bf16 / fp16 / f32 and int4 matrices stay on the device
  // as stored and are widened (int4: dequantized bit-exactly) into one f32
  // scratch, the size of the largest linear, just before their GEMM: int4_asym
  // with its bf16 pairs, int4_asym_f32 and int4_sym (as int4_sym_as_asym_f32
  // gives it) with fp32 pairs, a rival's linear in whichever of them holds it
  // exactly (ModelSource::exact_format); other formats are dequantized on the
  // host at load and held as f32.
  // Slower than the int4 kernels, and off by default.
  bool f32_linears = false;
  // With f32_linears: every linear's input is rounded to bf16 first, as the
  // CPU forward's bf16_activations (the KL noise floor's second computation).
  // Switchable on a loaded model: GpuModel::set_bf16_inputs.
  bool bf16_inputs = false;
  // The KV cache's element type: F32 (exact), or BF16 (half the bytes: each
  // key and value rounded to the nearest bf16 as it is written, which the
  // CPU forward simulates as `--kv bf16`; kv_device_dtype in
  // include/nibble/kv_quant.h maps a scheme to this). Every attention kernel
  // reads either (src/backend/cuda/kv_cache.cuh).
  DType kv_dtype = DType::F32;
  // With f32_linears and without decode_graph (the yardstick's prefill):
  // every decoder linear's input (not the head's) is fake-quantized by this
  // activation quantizer as the CPU forward does it, before the bf16 rounding
  // of bf16_inputs. The input is copied to the host, quantized by the
  // registry's own function (act_quant.h) and copied back, at the cost of a
  // round trip per input. The quantizer is the CPU's, but its inputs differ
  // from the CPU's in their last bits, so near-tie activations can round one
  // step apart: an equally valid realization (CudaEval tests), not the CPU's
  // numbers to fp32 order.
  const ActQuantSpec* act_quant = nullptr;
};

// GpuOptions::kKvSharedAuto's position for a KV cache of `kv_dtype`.
int64_t kv_shared_crossover(DType kv_dtype);

// Greedy decode's selection, the kernel each decode_greedy step ends with, over `n` floats of device
// memory: the index of the largest, the smallest index on ties; NaN never chosen (all NaN: 0). Also
// checks the kernel's feed of the next step ({id, position + 1}, the host slot) and its ticket's reset.
// Synchronous; for tests.
int32_t device_argmax(const float* logits, int64_t n);
// Sampled decode's draw (nibble/sampler.h, temperature > 0) over `n` floats
// of device memory, by the kernels each decode_sample_run step ends with:
// sample_logits(logits, n, c, draw) bit for bit. Also checks their feed of
// the next step and that the key slots are left zero. `checked` (top-k /
// top-p): whether the draw over every id was kept, so that the filters' radix
// select did not run. Synchronous; for tests.
int32_t device_sample(const float* logits, int64_t n, const SamplerConfig& c, uint64_t draw,
                      bool* checked = nullptr);
// Whether the device draws `s` over `vocab_limit` ids (decode_sample_run, device_sample): temperature
// > 0, and with top-k or top-p at most sample_filter_max_logits() ids. Otherwise draw on the host from
// forward()'s logits (the same ids).
bool samples_on_device(const SamplerConfig& s, int64_t vocab_limit);
// The most ids top-k / top-p take on the device: 4096 per SM, up to 128 SMs (524288 on an H100 or H200).
int64_t sample_filter_max_logits();

// The quantized matrices of `src` (decoder linears and the head) that no
// registered linear kernel takes: GpuModel::load holds them dequantized to
// bf16 and runs them through cuBLAS (2 bytes a weight, a dense GEMV's
// speed). Per format as cpu_dense_fallbacks (nibble/model.h) names them. Host
// only: needs no device.
std::vector<DenseFallback> dense_fallbacks(const ModelSource& src);

class GpuModel {
 public:
  // Loads every weight of `src` onto the GPU with a KV cache of `max_tokens`
  // positions.
  static std::unique_ptr<GpuModel> load(const ModelSource& src, int64_t max_tokens, const GpuOptions& opts = {});
  ~GpuModel();

  const ModelConfig& config() const;
  int64_t size() const;  // positions in the KV cache
  void reset();          // empties the KV cache
  // Runs `tokens` at positions size() .. size()+n-1 and appends them to the
  // cache. Returns logits F32 [n, vocab] (all rows) or [1, vocab] (the last).
  Tensor forward(const std::vector<int32_t>& tokens, bool all_logits = true);
  // One decode step for `token`, then greedy selection on the device: returns
  // the id of the largest logit among ids 0 .. vocab_limit-1 (the smallest id
  // on ties, as argmax over forward()'s logits), copying 4 bytes instead of
  // the logits row.
  int32_t decode_greedy(int32_t token, int64_t vocab_limit);
  // Up to `max_steps` greedy steps: the first runs `token`, each next one the
  // id the step before chose (among 0 .. vocab_limit-1, as decode_greedy).
  // The device runs a few steps ahead of the host, with no copy between
  // steps; `on_token` gets each chosen id in order and returns false to stop
  // (an end-of-sequence id). Returns the number of ids passed to on_token;
  // size() grows by as many (the steps run ahead of a stop are dropped). The
  // same ids as decode_greedy called in a loop.
  int64_t decode_greedy_run(int32_t token, int64_t vocab_limit, int64_t max_steps,
                            const std::function<bool(int32_t)>& on_token);

  // decode_greedy_run with each id drawn instead (nibble/sampler.h's draw at
  // temperature > 0, on the device: the same id as sample_logits over the
  // step's logits), draw numbers first_draw, first_draw + 1, ... (a
  // Sampler's draws()), so a run continues the host's sequence.
  int64_t decode_sample_run(int32_t token, int64_t vocab_limit, int64_t max_steps, const SamplerConfig& s,
                            uint64_t first_draw, const std::function<bool(int32_t)>& on_token);

  bool decode_graph() const;  // decode replays a captured graph
  // Whether decode's head GEMV takes greedy decode's argmax and sampled
  // decode's score keys itself (a packed head with a prepared input, no bias).
  bool keys_in_head() const;
  bool decode_fused() const;    // decode runs through GemvFusion (GpuOptions::fuse_decode)
  bool decode_chained() const;  // ... and its GEMVs in chains (GpuOptions::chain_decode)
  // Device bytes of the embedding table: as stored (f32, bf16 or fp16; other
  // formats as f32), f32 where f32_linears uses it as a tied head.
  size_t embedding_bytes() const;
  size_t cache_bytes() const;  // the KV cache: the keys and values of every layer (kv_dtype), for max_tokens positions
  // Bytes of weights one decode step reads: every linear as stored on the
  // device (packed codes + group parameters, or bf16), biases, norms, the head
  // and one embedding row. The KV cache read grows with the position and is
  // not counted.
  size_t decode_weight_bytes() const;
  // GpuOptions::bf16_inputs on a model loaded with f32_linears (the noise
  // floor reuses the reference's load); a captured decode graph is captured
  // again.
  void set_bf16_inputs(bool on);

 private:
  GpuModel();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace nibble::cuda
