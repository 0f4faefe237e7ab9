// Causal attention of the GPU forward on device buffers (CUDA builds only):
// the forward (src/backend/cuda/forward.cu) calls it, and so do the tests and
// bench/bench_attention.cu. docs/CUDA.md, "Flash prefill attention", describes
// the two kernels.
//
// Semantics (src/model/forward.cpp's attention): query i of n sits at position
// p0 + i and attends to the cached keys t0 .. p0+i (t0 = 0, or p0+i+1-window
// under a sliding window), head h to kv head h / (heads / kv_heads) (GQA),
// out = softmax(q·Kᵀ · scale) · V.
#pragma once

#include <cstddef>
#include <cstdint>

namespace nibble::cuda {

struct AttentionArgs {
  const float* q = nullptr;  // f32 [n, heads, head_dim], contiguous (RoPE applied)
  const void* k = nullptr;  // [positions, kv_heads, head_dim], the key cache, rows 0 .. p0+n-1 filled
  const void* v = nullptr;  // same layout: the value cache
  bool kv_bf16 = false;     // the caches' elements are bf16 (GpuOptions::kv_dtype), else f32
  void* out = nullptr;       // bf16 [n, ldo]: head h at columns h*head_dim .. (h+1)*head_dim-1
  bool out_f32 = false;      // out is f32 instead (ldo a multiple of 4 for the flash kernel)
  // Row-wise kernel, one query, head_dim a multiple of 128: instead of `out`,
  // write the output as the single-token W4A16 GEMV's prepared activation
  // (src/backend/cuda/w4a16_prep.cuh) with this group size (32, 64 or 128).
  void* prepared = nullptr;
  int prep_group = 0;
  // Row-wise kernel, one query, head_dim <= 256: q, k and v of the new
  // position come un-rotated in this qkv projection row ([q heads | k heads |
  // v heads], f32) and the kernel first does the RoPE step itself: q/k RMS
  // norms where set (qwen3), RoPE at p0, the k and v rows written into the
  // caches k and v (which must then be writable; a bf16 cache gets them
  // rounded, and the kernel uses the rounded key and value). q is then unused.
  const float* rope_qkv = nullptr;
  const float *rope_q_norm = nullptr, *rope_k_norm = nullptr, *rope_inv_freq = nullptr;
  float rope_eps = 0.0f;
  int64_t ldo = 0;           // elements, even
  int64_t n = 0, p0 = 0;     // queries at positions p0 .. p0+n-1
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  int64_t window = 0;  // > 0: sliding window (keys with position - t < window only)
  float scale = 0.0f;  // usually 1/sqrt(head_dim)
};

// Flash-style prefill kernel: online softmax over key tiles of 64, fp32
// throughout, shared memory independent of the length. Head dims 64, 128, 256.
bool flash_attention_supported(int64_t head_dim);
// Enqueues the flash kernel on `stream` (a cudaStream_t; nullptr: the legacy
// stream). Throws nibble::Error for an unsupported head dim or bad arguments.
void flash_attention(const AttentionArgs& a, void* stream);

// Tensor-core flash prefill in bf16 (the calibration forward's, and the
// GPU forward's prefill through flash_attention_tc below): mma.m16n8k16 with
// bf16 inputs and fp32 accumulation, the softmax statistics in fp32, P rounded
// to bf16 for the P·V product (FlashAttention-2's numerics). Head dims 64 and
// 128.
struct AttentionBf16Args {
  const void* q = nullptr;  // bf16 [n, heads, head_dim], multiplied by scale · log2(e) (scores in log2 units)
  const void* k = nullptr;  // bf16 [p0 + n, kv_heads, head_dim], the keys of positions 0 .. p0+n-1
  const void* v = nullptr;  // bf16, same layout: the values
  void* out = nullptr;      // bf16 [n, ldo]: head h at columns h*head_dim .. (h+1)*head_dim-1
  int64_t ldo = 0;          // elements, even
  int64_t n = 0, p0 = 0;    // queries at positions p0 .. p0+n-1
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  int64_t window = 0;  // > 0: sliding window
};
bool flash_attention_bf16_supported(int64_t head_dim);
void flash_attention_bf16(const AttentionBf16Args& a, void* stream);

// The forward's prefill attention on tensor cores (GpuOptions::
// tensor_core_prefill): the flash kernel's arguments (f32 q with RoPE applied,
// the f32 or bf16 cache, bf16 output), computed as flash_attention_bf16 does
// after q·scale·log2(e) and an f32 cache's rows 0 .. p0+n-1 are rounded to
// bf16 into `scratch` (at least flash_attention_tc_scratch(a) bytes; a bf16
// cache is read where it is). The numbers of a bf16 inference engine's
// attention, not the CPU forward's fp32 ones. Head dims 64 and 128, bf16 out.
bool flash_attention_tc_supported(const AttentionArgs& a);
size_t flash_attention_tc_scratch(const AttentionArgs& a);
void flash_attention_tc(const AttentionArgs& a, void* scratch, void* stream);

// The one-block-per-(query, head) kernel (decode, and prefill of head dims the
// flash kernel lacks): keeps one query's scores in shared memory, sized for
// `max_positions` keys (the grid does not depend on the length, so a captured
// decode step serves every position). `p0_dev`, when set, is a device int read
// instead of a.p0. Raising the kernel's shared-memory limit happens here, the
// first time a size is needed: call it once outside graph capture with the
// largest max_positions before capturing.
size_t rowwise_attention_smem(int64_t head_dim, int64_t max_positions);
size_t rowwise_attention_smem_limit();  // the most it may use (200 KiB)
void rowwise_attention(const AttentionArgs& a, const int32_t* p0_dev, int64_t max_positions, void* stream);

// Decode attention for one query (n = 1) on a cluster of blocks per head
// (sm_90 and later): each block takes a quarter of the keys with its own
// softmax statistics and the first block combines them through distributed
// shared memory, so a head's work spreads over four SMs; the RoPE step
// (rope_qkv) and the prepared output as the row-wise kernel. Reads the
// position from `p0_dev` (when set) before waiting for the previous kernel:
// the decode step's first kernel must be launched without programmatic
// dependence (GpuModel's is). Shared memory does not grow with the length;
// max_positions only bounds a.p0 when p0_dev is null. head_dim: 32, 64, 128
// or 256.
bool decode_attention_supported(int64_t head_dim);
void decode_attention(const AttentionArgs& a, const int32_t* p0_dev, int64_t max_positions, void* stream);

// Decode attention for one query (n = 1) with each kv head's keys and values
// read once for all of its query heads (GQA): block (kv head, r) takes the
// r-th of R equal key ranges (R = SMs / kv_heads, at most 64) for every query
// head of the kv head, and the last block of each kv head (a ticket) combines
// the ranges in a fixed order. The RoPE step (rope_qkv), the outputs (out,
// out_f32) and the prepared output as decode_attention; p0_dev read before
// the wait, as there. Any sm; head_dim 64 or 128; heads / kv_heads 1, 2, 4 or
// 8. `scratch`: kv_shared_attention_scratch_bytes(...) bytes, zero before the
// first call (the tickets; each call leaves them at zero).
bool kv_shared_attention_supported(int64_t head_dim, int64_t heads, int64_t kv_heads);
size_t kv_shared_attention_scratch_bytes(int64_t heads, int64_t kv_heads, int64_t head_dim);
void kv_shared_attention(const AttentionArgs& a, const int32_t* p0_dev, void* scratch, void* stream);

// Decode attention split over the keys ("flash-decoding"): one query (n = 1)
// at position p0 (or *p0_dev, as rowwise_attention reads it); the keys are
// cut into `splits` equal ranges, each handled by one block with its own
// online softmax, and a second kernel combines them. Neither the grid nor the
// shared memory depends on the length, so a captured decode step serves every
// position and the cache has no length cap. head_dim: a multiple of 32, at
// most 256; splits 1..256. Writes out (bf16, or f32 with out_f32) or the
// prepared activation (a.prepared, head_dim a multiple of 128). `scratch`:
// split_attention_scratch_bytes(...) bytes of device memory.
size_t split_attention_scratch_bytes(int64_t heads, int64_t head_dim, int splits);
void split_attention(const AttentionArgs& a, const int32_t* p0_dev, int splits, void* scratch, void* stream);

}  // namespace nibble::cuda
