// The CUDA backend's host-side entry points. Present only in builds with
// NIBBLE_HAVE_CUDA (configure with NIBBLE_CUDA=auto|on and nvcc on PATH).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "nibble/format.h"
#include "nibble/tensor.h"

namespace nibble::cuda {

// True when the CUDA runtime sees at least one device.
bool device_available();
// Waits for all work queued on the device (timings that attribute GPU time to host steps).
void synchronize();

// Dequantizes an int4_asym matrix on the GPU: parts (qweight U8, scales BF16,
// mins BF16, as FORMAT.md stores them) are copied to the device, one kernel
// expands them, and the result comes back as F32 [rows, cols]. Bit-identical
// to the CPU reference (product and sum rounded separately, no FMA).
Tensor dequantize_int4_asym(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size);

// The device's memory read bandwidth in GB/s, measured now: a streaming read
// kernel over `bytes` (far more than the L2 holds), four reads back to back
// per timed pass, median of `passes` passes. The roofline of a memory-bound
// kernel is bytes / this.
double read_bandwidth_gbs(size_t bytes = size_t{1} << 30, int passes = 10);

// Device memory owned by one object (cudaFree on destruction). Every live
// DeviceBuffer counts towards device_bytes_live() and its peak.
struct DeviceBuffer {
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  void* get() const { return ptr_.get(); }
  size_t bytes() const { return bytes_; }

 private:
  struct Free {
    Free() noexcept : bytes(0) {}
    explicit Free(size_t b) noexcept : bytes(b) {}
    size_t bytes;
    void operator()(void* p) const;
  };
  std::unique_ptr<void, Free> ptr_;
  size_t bytes_ = 0;
};
// Bytes held by live DeviceBuffers in this process (all devices), and the
// most held at once since the start or the last reset: what nibble's own
// buffers take (weights, KV caches, scratch), without the CUDA context and
// libraries' workspaces.
size_t device_bytes_live();
size_t device_bytes_peak();
void reset_device_bytes_peak();
// What the current device has in use now (cudaMemGetInfo: total − free), and
// its total: nibble's buffers plus the CUDA context, library workspaces
// (cuBLAS), memory pools and any other process on the device. Each call also
// raises device_memory_peak(), the most `used` any call has seen.
struct DeviceMemory {
  size_t used = 0, total = 0;
};
DeviceMemory device_memory();
size_t device_memory_peak();

// Host to device copies: raw bytes, a tensor's bytes (made contiguous), and a
// tensor's values converted to bf16 (round to nearest even) on the host.
DeviceBuffer upload(const void* host, size_t bytes);
DeviceBuffer upload(const Tensor& t);
DeviceBuffer upload_bf16(const Tensor& t);

// Activation types of the W4A16 kernels (fp32 accumulation inside): bf16 and
// fp16 for any M; F32 for single-token calls (M = 1) of kernels whose
// `single_token_f32` says so (w4a16_mma with groups of 32, 64 or 128).
enum class Act { BF16, F16, F32 };

// A linear layer's weight resident on the GPU in a kernel's own layout, made
// once at load time from the FORMAT.md parts. docs/CUDA.md describes each layout.
struct DeviceLinear {
  const struct LinearKernel* kernel = nullptr;
  int64_t rows = 0, cols = 0;  // W is [rows = out features, cols = in features]
  int group_size = 0;
  DeviceBuffer a, b;  // the kernel's buffers (w4a16: tiled codes, tiled scale/min pairs)
  // The kernel's workspace (w4a16: the prepared activation of single-token
  // calls), so one DeviceLinear serves one stream at a time.
  DeviceBuffer scratch;
  size_t weight_bytes() const { return a.bytes() + b.bytes(); }
};

// What decode's head GEMV keys (GemvFusion::argmax_draw), in device memory.
struct HeadDraw {
  static constexpr int32_t kGreedy = 0;  // the outputs' own keys (argmax)
  static constexpr int32_t kSample = 1;  // score keys; argmax_keys_kernel feeds the largest's row
  static constexpr int32_t kSampleFiltered = 2;  // score keys left for top-k / top-p (sample_kernels.cuh)
  int32_t limit = 0;  // keys over rows 0 .. limit-1; 0: no keys
  int32_t mode = kGreedy;
  float temperature = 0.0f;
  uint32_t pad = 0;
  uint64_t seed = 0;
  uint64_t draw_base = 0;  // the draw at position p is number draw_base + p (mod 2^64)
};

// Work fused into a single-token GEMV (LinearKernel::gemv_prepared), so that
// GpuModel's decode step needs no RMSNorm or SiLU kernel between its linears.
// An RMSNorm y = x ⊙ w / rms(x) is split in two: the producer writes the
// prepared activation of z = x ⊙ w and the sums of squares of x per 16-row
// tile; the consumer GEMV multiplies its outputs by 1 / rms(x) (a GEMV is
// linear in its input, so this equals the GEMV of y up to fp32 rounding).
struct GemvFusion {
  // Input side: outputs × 1 / sqrt(Σ in_ss[0 .. in_parts) / in_width + eps)
  // (in_parts <= kMaxParts; in_ss null: no scaling).
  static constexpr int kMaxParts = 512;
  const float* in_ss = nullptr;
  int in_parts = 0;
  int64_t in_width = 0;
  float eps = 0.0f;
  // Output side (the GEMV's y is then not written):
  //  * residual (residual set): residual[r] += out[r], then z[r] = residual[r] ·
  //    norm_w[r] becomes `prep_out`, and Σ residual[r]² of each 16-row tile
  //    goes to ss_out[tile] (ceil(rows / 16) floats).
  //  * swiglu: rows [0, F) are gate, [F, 2F) up (F = rows / 2, a multiple of
  //    16); SiLU(gate) · up (width F) becomes `prep_out`.
  // Either way `prep_out` is the next GEMV's prepared activation (groups of
  // prep_group, 32, 64 or 128), `stage` f32 scratch of the output width, and
  // `tickets` ceil(width / 128) counters, zero before the call and after it.
  float* residual = nullptr;
  const float* norm_w = nullptr;
  float* ss_out = nullptr;
  bool swiglu = false;
  void* prep_out = nullptr;
  size_t prep_bytes = 0;
  int prep_group = 0;
  float* stage = nullptr;
  unsigned* tickets = nullptr;
  // Optional, in place of the tickets where every block of the call is
  // resident at once: 8 bytes per output (width), zero before the call and
  // after it. Each 16-row tile's block posts its rows there and the unit's
  // last tile's block prepares the unit once they arrive.
  unsigned long long* mail = nullptr;
  // Decode's draw in the GEMV (a plain f32 output only: no fused output
  // side), as *argmax_draw says, read on the device each call (limit 0:
  // none, the call only writes y). Each block takes the atomic max of its
  // key over y[0 .. limit) into argmax_keys[block % kArgmaxKeys] (zero
  // before the call), NaN never a key: greedy (HeadDraw::kGreedy) the
  // output's own nibble::sampling::key (the value's order bits above the
  // inverted row; sampling::key_row reads the row back), so the largest key
  // over the slots is the largest output at its smallest row, as
  // argmax_kernel chooses; sampled, the key of its score l / T + g
  // (sampling::score, draw number draw_base + *argmax_position), so the
  // largest is the draw over every row (nibble/sampler.h, no top-k / top-p).
  // No key: every output NaN. GpuModel's decode reads the slots back to zero
  // after the head (argmax_keys_kernel). No ticket: a block's exit waits for
  // no round trip.
  static constexpr int kArgmaxKeys = 64;
  const HeadDraw* argmax_draw = nullptr;
  const int32_t* argmax_position = nullptr;  // sampled: the step's position (the draw number's offset)
  unsigned long long* argmax_keys = nullptr;
  bool fuses_output() const { return residual != nullptr || swiglu; }
  bool fuses_argmax() const { return argmax_draw != nullptr; }
};

// One gemv_prepared call of a chain (LinearKernel::gemv_chain).
struct GemvCall {
  const DeviceLinear* w = nullptr;
  const void* prepared = nullptr;  // the call's prepared input, `prepared_bytes` long
  size_t prepared_bytes = 0;
  float* y = nullptr;  // f32 outputs; unused where `fuse` fuses the output
  GemvFusion fuse;     // the work fused around it (default: none)
};
// The most calls of one chain, the counters a chain needs (`sync`), and the
// widest input a chained call may have (its prepared input is staged in
// shared memory).
constexpr int kGemvChainMax = 8;
constexpr int kGemvChainSync = kGemvChainMax + 1;
constexpr int64_t kGemvChainMaxCols = 16384;

// The CUDA kernel registry (DESIGN.md: kernels by format, backend, op): one row
// per (format family, op). A format with no row falls back to "dequantize to
// bf16 once, cuBLAS GEMM" (the reference path).
struct LinearKernel {
  std::string_view format;  // format family, e.g. "int4_asym"
  std::string_view name;    // e.g. "w4a16_mma"
  std::vector<int> group_sizes;
  // Uploads and re-lays out a packed matrix (host parts, as FORMAT.md stores them).
  DeviceLinear (*upload)(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size);
  // y[M, rows] = x[M, cols] · Ŵᵀ; x, y device pointers of `act` type (y f32 with
  // f32_out) with leading dimensions ldx, ldy (elements); ldx a multiple of 8 and
  // x 16-byte aligned. `stream` is a cudaStream_t. With `pdl`, the
  // launch allows programmatic dependent launch: the kernel loads its weights
  // before waiting for the previous kernel in the stream (Hopper).
  void (*gemm)(const DeviceLinear& w, const void* x, int64_t M, int64_t ldx, void* y, int64_t ldy, Act act,
               bool f32_out, void* stream, bool pdl);
  // Whether gemm takes Act::F32 when M = 1 for this uploaded weight; where it
  // does, gemv_prepared serves it too.
  bool (*single_token_f32)(const DeviceLinear& w);
  // y[1, rows] (f32) = one token's activation already in the kernel's prepared
  // form (src/backend/cuda/w4a16_prep.cuh, groups of w.group_size, `bytes`
  // long) · Ŵᵀ. For the CUDA backend's fused producers (GpuModel's decode
  // writes it from the RMSNorm, SiLU and attention kernels, or from the GEMV
  // before through GemvFusion). `deep`: the kernel before
  // in the stream holds almost no SMs (GpuModel's one-block RMSNorm), so the
  // GEMV's blocks are all resident while it runs and may put more of the
  // weight stream in flight before waiting for it.
  // `fuse` (or null): work fused around the GEMV (GemvFusion).
  void (*gemv_prepared)(const DeviceLinear& w, const void* prepared, size_t bytes, void* y, void* stream, bool pdl,
                        bool deep, const GemvFusion* fuse);
  // Writes one token's activation x (w.cols wide, of `act` type) in the
  // prepared form gemv_prepared takes (`bytes` long); null where gemv_prepared is.
  void (*prepare)(const DeviceLinear& w, const void* x, Act act, void* prepared, size_t bytes, void* stream, bool pdl);
  // Up to kGemvChainMax gemv_prepared calls (f32 y) in one persistent launch,
  // in order: each call's outputs (y, or its fused outputs) are complete
  // before the next call reads its prepared input, through counters in
  // `sync` (kGemvChainSync unsigned, zero before the call and after it), while
  // the weights of the later calls already stream in. All weights have this
  // kernel and one group size. Null where the kernel has no chain.
  void (*gemv_chain)(const GemvCall* calls, int count, unsigned* sync, void* stream, bool pdl);
};
const std::vector<const LinearKernel*>& linear_kernel_registry();
// The kernel for a format, or nullptr when the reference path must be used.
const LinearKernel* find_linear_kernel(std::string_view format, int group_size);

// W4A16 numerics (fp32 accumulation always): whether a call of M tokens on w
// with `act` activations uses the exact weights code·scale + min (groups of
// 64 or more: up to 16 tokens always; at 17..24 tokens where the small-M
// kernel takes the call on three token tiles: groups of 128 on the matrices
// w4a16_three_tiles_exact names, and on sm_90 both group sizes where the
// resident-activation kernel applies; the current device decides) or rounds
// each weight once to the activation type, fl16(code·scale + min).
bool w4a16_exact_weights(const DeviceLinear& w, int64_t M, Act act);

// int4_sym's parts (FORMAT.md §7.1: codes, f16 scale) as int4_asym's (§3), which
// is how int4_sym's registry row runs on the w4a16 kernels: the same codes, scale
// = bf16_rne(f16 scale), min = −8·scale (exact). Each weight (c − 8)·s then moves
// by at most 2⁻⁸·|(c − 8)·s|, the bound of rounding the weight itself to bf16
// (what the dense path, dequantize_to_bf16_device, does). Host only.
std::vector<Tensor> int4_sym_as_asym(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size);

// int4_asym_f32's parts (FORMAT.md §7.8: codes, fp32 scale and min) as
// int4_asym's, for its registry row: the same codes, each scale and each min
// rounded once to bf16 (nearest, ties to even). A weight c·s + m then moves by
// at most 2⁻⁸·(c·|s| + |m|) ≤ 2⁻⁸·(15·|s| + |m|). Host only.
std::vector<Tensor> int4_asym_f32_as_asym(const std::vector<Tensor>& parts, int64_t rows, int64_t cols,
                                          int group_size);

// The w4a16 layout built on the host (tests, and what upload does on the device):
// codes [ceil(rows/16)][ceil(cols/64)][32 lanes] × 16 bytes, scale/min pairs
// [ceil(rows/16)][padded groups][8] × 8 bytes. docs/CUDA.md defines both.
struct W4A16HostLayout {
  std::vector<uint8_t> codes, meta;
};
W4A16HostLayout w4a16_layout_host(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size);

// Reference path: Ŵ dequantized to bf16 [rows, cols] on the device, and the
// cuBLAS bf16 GEMM with fp32 accumulation over it; y is bf16, or f32 with f32_out.
DeviceBuffer dequantize_to_bf16_device(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size);
void gemm_bf16_cublas(const void* w_bf16, int64_t rows, int64_t cols, const void* x, int64_t M, int64_t ldx, void* y,
                      int64_t ldy, void* stream, bool f32_out = false);
// y[M, rows] (f32) = x[M, cols] (f32) · W[rows, cols]ᵀ (f32), every product
// and sum in fp32 (no TF32): the yardstick's forward (GpuOptions::f32_linears).
void gemm_f32_cublas(const float* w, int64_t rows, int64_t cols, const float* x, int64_t M, int64_t ldx, float* y,
                     int64_t ldy, void* stream);

}  // namespace nibble::cuda
