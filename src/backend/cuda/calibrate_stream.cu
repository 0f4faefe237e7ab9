// GpuLayerStream (include/nibble/cuda_calibrate.h): the calibration forward of
// one decoder layer over every sequence, on the GPU.
//
// The computation is src/model/forward.cpp's decoder layer, as GpuModel's
// prefill runs it (the kernels of forward_kernels.cuh): residual stream,
// norms and RoPE in fp32, the linears through cuBLAS with bf16 inputs and bf16
// weights, fp32 accumulation. Attention, for head dims 64 and 128, is the
// tensor-core flash kernel with bf16 q, k, v and P (FlashAttention-2's
// numerics, fp32 softmax statistics), as a bf16 model's calibration forward
// has it in PyTorch; other head dims take the fp32 kernels. The Hessians see
// the bf16 inputs the GEMMs see (the CPU stream taps f32 inputs and
// multiplies in f32).
//
// Sequences run in chunks of whole sequences (kChunkTokens tokens, or one
// sequence when it is longer), so the scratch does not grow with the
// calibration set. Everything runs on the legacy default stream, as the GPU
// GPTQ does, so its Hessians, solve and sweep order with the forward.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <atomic>
#include <future>
#include <thread>

#include "backend/cuda/check.h"
#include "backend/cuda/convert.h"
#include "backend/cuda/forward_kernels.cuh"
#include "backend/cuda/gptq_common.h"
#include "nibble/arch.h"
#include "nibble/cuda.h"
#include "nibble/cuda_attention.h"
#include "nibble/cuda_calibrate.h"

namespace nibble::cuda {
namespace {

constexpr int64_t kChunkTokens = 16384;
constexpr int kThreads = 256;

int64_t pad8(int64_t v) { return (v + 7) / 8 * 8; }  // bf16 rows of 16 bytes (cuBLAS alignment)

// A host tensor of a float dtype as f32 in device memory: uploaded as stored
// (half the bytes for bf16 / fp16), widened on the device (widen_kernel,
// forward_kernels.cuh).
DeviceBuffer upload_f32(const Tensor& t) {
  if (t.dtype() == DType::F32) return upload(t);
  NIBBLE_CHECK(t.dtype() == DType::BF16 || t.dtype() == DType::F16, "GPU calibration: unsupported dtype {}",
               dtype_name(t.dtype()));
  const DeviceBuffer raw = upload(t);
  const int64_t n = t.numel();
  DeviceBuffer out(static_cast<size_t>(n) * 4);
  if (t.dtype() == DType::BF16)
    widen_kernel<<<grid_for(n, kThreads), kThreads>>>(static_cast<const bf16*>(raw.get()), n,
                                                      static_cast<float*>(out.get()));
  else
    widen_kernel<<<grid_for(n, kThreads), kThreads>>>(static_cast<const __half*>(raw.get()), n,
                                                      static_cast<float*>(out.get()));
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  return out;
}

// out = a + b (the residual add that moves the stream).
__global__ void add_kernel(const float* __restrict__ a, const float* __restrict__ b, int64_t n,
                           float* __restrict__ out) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a[i] + b[i];
}

// acc[0] += Σ (q − w)², acc[1] += Σ w², acc[2] (as int bits) = max |q − w|.
__global__ void weight_error_kernel(const float* __restrict__ w, const float* __restrict__ q, int64_t n,
                                    double* __restrict__ acc) {
  __shared__ double s_err[kThreads / 32], s_ref[kThreads / 32];
  __shared__ float s_max[kThreads / 32];
  double err = 0, ref = 0;
  float mx = 0;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const double d = static_cast<double>(q[i]) - w[i];
    err += d * d;
    ref += static_cast<double>(w[i]) * w[i];
    mx = fmaxf(mx, fabsf(q[i] - w[i]));
  }
  for (int o = 16; o > 0; o >>= 1) {
    err += __shfl_down_sync(0xFFFFFFFFu, err, o);
    ref += __shfl_down_sync(0xFFFFFFFFu, ref, o);
    mx = fmaxf(mx, __shfl_down_sync(0xFFFFFFFFu, mx, o));
  }
  const int warp = threadIdx.x / 32;
  if (threadIdx.x % 32 == 0) {
    s_err[warp] = err;
    s_ref[warp] = ref;
    s_max[warp] = mx;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int k = 1; k < kThreads / 32; ++k) {
      err += s_err[k];
      ref += s_ref[k];
      mx = fmaxf(mx, s_max[k]);
    }
    atomicAdd(&acc[0], err);
    atomicAdd(&acc[1], ref);
    atomicMax(reinterpret_cast<unsigned long long*>(&acc[2]),
              static_cast<unsigned long long>(__float_as_uint(mx)));
  }
}

// GPTQ of w (f32, device) into codes/params, then --refine's passes when
// asked; *dq gets the dequantized values, and the error of dq against w is
// reported (err: 3 doubles of scratch).
quant::GptqResult gptq_with_error(const float* w, int64_t rows, int64_t cols, const GpuPreparedHessian& hessian,
                                  const FormatChoice& format, bool mse, const quant::GptqOptions& options,
                                  DeviceBuffer* dq, double* rel_error, double* max_abs_error, const GpuRefine& refine) {
  quant::GptqResult r = gptq_device(w, rows, cols, hessian, format, mse, options, dq);
  if (refine.passes > 0) {
    NIBBLE_CHECK(refine.objective != nullptr, "refine (cuda): no objective was given");
    const quant::RefineReport rep = refine_device(r, w, static_cast<float*>(dq->get()),
                                                  static_cast<const float*>(refine.objective->get()), hessian, format,
                                                  refine.passes);
    if (refine.report) *refine.report = rep;
  }
  const int64_t nn = rows * cols;
  DeviceBuffer err(3 * sizeof(double));
  NIBBLE_CUDA_CHECK(cudaMemset(err.get(), 0, err.bytes()));
  weight_error_kernel<<<std::min<unsigned>(grid_for(nn, kThreads), 1024), kThreads>>>(
      w, static_cast<const float*>(dq->get()), nn, static_cast<double*>(err.get()));
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  double acc[3];
  NIBBLE_CUDA_CHECK(cudaMemcpy(acc, err.get(), sizeof acc, cudaMemcpyDeviceToHost));
  uint64_t bits = 0;
  std::memcpy(&bits, &acc[2], sizeof bits);
  const auto low = static_cast<uint32_t>(bits);
  float mx = 0;
  std::memcpy(&mx, &low, sizeof mx);
  if (rel_error) *rel_error = acc[1] > 0 ? std::sqrt(acc[0] / acc[1]) : std::sqrt(acc[0]);
  if (max_abs_error) *max_abs_error = mx;
  return r;
}

struct Linear {
  int64_t out = 0, in = 0;
  DeviceBuffer w32, w16, bias;  // f32 and bf16 [out, in]; bias f32 [out] or empty

  // w16 = bf16(w32): what the forward multiplies by.
  void round_to_bf16() {
    const int64_t n = out * in;
    if (w16.bytes() != static_cast<size_t>(n) * 2) w16 = DeviceBuffer(static_cast<size_t>(n) * 2);
    scaled_round_bf16(static_cast<const float*>(w32.get()), n, 1.0f, static_cast<bf16*>(w16.get()), nullptr);
  }
};

}  // namespace

struct GpuLayerStream::State {
  ModelConfig c;
  bool bf16_attention = true;
  std::vector<int64_t> lengths, offsets;  // offsets: first row of each sequence in `hidden`
  int64_t total = 0, ldD = 0, ldQ = 0, ldF = 0;
  DeviceBuffer hidden, inv_freq;  // hidden f32 [total, D]
  // The loaded layer.
  bool loaded = false;
  int64_t window = 0;
  DeviceBuffer input_norm, post_norm, q_norm, k_norm;
  std::array<Linear, 7> lin;  // decoder_linears() order
  // prefetch_layer: layer `staged_layer`'s linears (as load() returns them)
  // in pinned host memory, filled by `staging`.
  int64_t staged_layer = -1;
  std::future<void> staging;
  void* pinned = nullptr;
  size_t pinned_bytes = 0;
  std::array<Tensor, 7> staged;
  ~State() {
    if (staging.valid()) staging.wait();
    if (pinned != nullptr) cudaFreeHost(pinned);
  }
  // Scratch for one chunk of rows.
  int64_t rows = 0;
  DeviceBuffer x, xn, qkv, qf, kc, vc, attn_tc, att, tmp, gu, h;

  void reserve(int64_t n) {
    if (n <= rows) return;
    const int64_t H = c.num_heads, KV = c.num_kv_heads, hd = c.head_dim, D = c.hidden_size, F = c.intermediate_size;
    const auto b = [](int64_t elems, size_t size) { return DeviceBuffer(static_cast<size_t>(elems) * size); };
    x = b(n * D, 4);
    xn = b(n * ldD, 2);
    qkv = b(n * (H + 2 * KV) * hd, 4);
    qf = b(n * H * hd, 4);
    kc = b(n * KV * hd, 4);
    vc = b(n * KV * hd, 4);
    AttentionArgs whole;  // flash_attention_tc's bf16 q, k and v of n rows, the most any sequence takes
    whole.n = n;
    whole.heads = H;
    whole.kv_heads = KV;
    whole.head_dim = hd;
    attn_tc = DeviceBuffer(flash_attention_tc_scratch(whole));
    att = b(n * ldQ, 2);
    tmp = b(n * D, 4);
    gu = b(n * 2 * F, 4);
    h = b(n * ldF, 2);
    rows = n;
  }

  static const float* f32(const DeviceBuffer& b) { return b.bytes() ? static_cast<const float*>(b.get()) : nullptr; }

  // y[n, out] (row stride ldy) = x[n, in] (bf16, stride ldx) · Wᵀ + bias.
  void linear(const Linear& l, const void* xin, int64_t n, int64_t ldx, float* y, int64_t ldy) {
    gemm_bf16_cublas(l.w16.get(), l.out, l.in, xin, n, ldx, y, ldy, nullptr, true);
    if (l.bias.bytes()) {
      bias_add_kernel<<<grid_for(n * l.out, kThreads), kThreads>>>(y, ldy, f32(l.bias), n, l.out);
      NIBBLE_CUDA_CHECK(cudaGetLastError());
    }
  }

  // Rows [r0, r0 + n) (whole sequences first .. last) through the layer.
  void run_chunk(size_t first, size_t last, const std::array<GpuHessian*, 4>& taps, bool advance) {
    const int64_t H = c.num_heads, KV = c.num_kv_heads, hd = c.head_dim, D = c.hidden_size, F = c.intermediate_size;
    const int64_t QKV = (H + 2 * KV) * hd, r0 = offsets[first], n = offsets[last] + lengths[last] - r0;
    const float eps = static_cast<float>(c.rms_norm_eps), scale = 1.0f / std::sqrt(static_cast<float>(hd));
    float* hid = static_cast<float*>(hidden.get()) + r0 * D;
    auto* xw = static_cast<float*>(x.get());
    auto* xnb = static_cast<bf16*>(xn.get());
    auto* q = static_cast<float*>(qkv.get());
    auto* tm = static_cast<float*>(tmp.get());
    auto* g = static_cast<float*>(gu.get());
    auto* hb = static_cast<bf16*>(h.get());
    auto* ab = static_cast<bf16*>(att.get());
    const unsigned un = static_cast<unsigned>(n);
    NIBBLE_CUDA_CHECK(cudaMemcpyAsync(xw, hid, static_cast<size_t>(n * D) * 4, cudaMemcpyDeviceToDevice, nullptr));
    add_rmsnorm_kernel<bf16><<<un, kNormThreads>>>(xw, nullptr, D, f32(input_norm), eps, xnb, ldD);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    if (taps[static_cast<int>(LinearInput::QKV)])
      taps[static_cast<int>(LinearInput::QKV)]->add_device_bf16(xnb, n, ldD);
    linear(lin[0], xnb, n, ldD, q, QKV);                  // q
    linear(lin[1], xnb, n, ldD, q + H * hd, QKV);         // k
    linear(lin[2], xnb, n, ldD, q + (H + KV) * hd, QKV);  // v
    for (size_t s = first; s <= last; ++s) {
      const int64_t o = offsets[s] - r0, len = lengths[s];
      float* qs = q + o * QKV;
      float* qfs = static_cast<float*>(qf.get()) + o * H * hd;
      float* kcs = static_cast<float*>(kc.get()) + o * KV * hd;
      float* vcs = static_cast<float*>(vc.get()) + o * KV * hd;
      qkv_rope_kernel<<<static_cast<unsigned>(len * (H + KV)), 32, hd * 4>>>(
          qs, qs + H * hd, qs + (H + KV) * hd, QKV, f32(q_norm), f32(k_norm), eps, f32(inv_freq), H, KV, hd, 0,
          nullptr, qfs, kcs, vcs);
      NIBBLE_CUDA_CHECK(cudaGetLastError());
      AttentionArgs a;
      a.q = qfs;
      a.k = kcs;
      a.v = vcs;
      a.out = ab + o * ldQ;
      a.ldo = ldQ;
      a.n = len;
      a.p0 = 0;
      a.heads = H;
      a.kv_heads = KV;
      a.head_dim = hd;
      a.window = window;
      a.scale = scale;
      // Tensor cores: q (in log2 units), k and v rounded to bf16, as a bf16
      // model's calibration forward computes attention.
      if (bf16_attention && flash_attention_tc_supported(a))
        flash_attention_tc(a, attn_tc.get(), nullptr);
      else if (flash_attention_supported(hd))
        flash_attention(a, nullptr);
      else
        rowwise_attention(a, nullptr, len, nullptr);
    }
    if (taps[static_cast<int>(LinearInput::O)]) taps[static_cast<int>(LinearInput::O)]->add_device_bf16(ab, n, ldQ);
    linear(lin[3], ab, n, ldQ, tm, D);  // o
    add_rmsnorm_kernel<bf16><<<un, kNormThreads>>>(xw, tm, D, f32(post_norm), eps, xnb, ldD);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    if (taps[static_cast<int>(LinearInput::GateUp)])
      taps[static_cast<int>(LinearInput::GateUp)]->add_device_bf16(xnb, n, ldD);
    linear(lin[4], xnb, n, ldD, g, 2 * F);      // gate
    linear(lin[5], xnb, n, ldD, g + F, 2 * F);  // up
    silu_mul_kernel<bf16><<<grid_for(n * F, kThreads), kThreads>>>(g, g + F, 2 * F, hb, ldF, n, F);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    if (taps[static_cast<int>(LinearInput::Down)])
      taps[static_cast<int>(LinearInput::Down)]->add_device_bf16(hb, n, ldF);
    linear(lin[6], hb, n, ldF, tm, D);  // down
    if (advance) {
      add_kernel<<<grid_for(n * D, kThreads), kThreads>>>(xw, tm, n * D, hid);
      NIBBLE_CUDA_CHECK(cudaGetLastError());
    }
  }
};

GpuLayerStream::GpuLayerStream(const ModelConfig& c, const std::vector<int64_t>& lengths, bool bf16_attention)
    : s_(std::make_unique<State>()) {
  NIBBLE_CHECK(device_available(), "--device cuda: no CUDA device is visible");
  NIBBLE_CHECK(c.head_dim % 4 == 0 && c.num_heads % c.num_kv_heads == 0, "GpuLayerStream: unsupported head layout");
  State& s = *s_;
  s.c = c;
  s.lengths = lengths;
  s.bf16_attention = bf16_attention;
  for (int64_t len : lengths) {
    NIBBLE_CHECK(len > 0, "GpuLayerStream: a sequence is empty");
    s.offsets.push_back(s.total);
    s.total += len;
  }
  s.ldD = pad8(c.hidden_size);
  s.ldQ = pad8(c.num_heads * c.head_dim);
  s.ldF = pad8(c.intermediate_size);
  s.hidden = DeviceBuffer(static_cast<size_t>(s.total * c.hidden_size) * 4);
  NIBBLE_CUDA_CHECK(cudaMemset(s.hidden.get(), 0, s.hidden.bytes()));
  const std::vector<float> inv = rope_inv_freq(c);
  s.inv_freq = upload(inv.data(), inv.size() * 4);
}

GpuLayerStream::~GpuLayerStream() = default;
GpuLayerStream::GpuLayerStream(GpuLayerStream&&) noexcept = default;
GpuLayerStream& GpuLayerStream::operator=(GpuLayerStream&&) noexcept = default;

bool GpuLayerStream::supports(const DecoderLayer& L, std::string* why) {
  const char* missing = L.act_quant != nullptr      ? "simulated activation quantizers"
                        : L.bf16_activations        ? "the bf16-activation reference mode"
                        : L.down_rotation != nullptr ? "the online rotation of down_proj's input"
                                                     : nullptr;
  if (missing && why) *why = fmt::format("the GPU calibration forward does not apply {}", missing);
  return missing == nullptr;
}

size_t GpuLayerStream::num_sequences() const { return s_->lengths.size(); }
int64_t GpuLayerStream::length(size_t s) const { return s_->lengths.at(s); }

void GpuLayerStream::upload_hidden(size_t i, const float* host) {
  const State& s = *s_;
  const size_t bytes = static_cast<size_t>(s.lengths.at(i) * s.c.hidden_size) * 4;
  NIBBLE_CUDA_CHECK(cudaMemcpy(static_cast<float*>(s.hidden.get()) + s.offsets[i] * s.c.hidden_size, host, bytes,
                               cudaMemcpyHostToDevice));
}

void GpuLayerStream::download_hidden(size_t i, float* host) const {
  const State& s = *s_;
  const size_t bytes = static_cast<size_t>(s.lengths.at(i) * s.c.hidden_size) * 4;
  NIBBLE_CUDA_CHECK(cudaMemcpy(host, static_cast<const float*>(s.hidden.get()) + s.offsets[i] * s.c.hidden_size, bytes,
                               cudaMemcpyDeviceToHost));
}

void GpuLayerStream::embed(const Tensor& table, const std::vector<std::vector<int32_t>>& sequences) {
  State& s = *s_;
  const int64_t D = s.c.hidden_size;
  NIBBLE_CHECK(table.dim() == 2 && table.size(1) == D, "GpuLayerStream::embed: the table is {}, expected [vocab, {}]",
               shape_str(table.shape()), D);
  NIBBLE_CHECK(sequences.size() == s.lengths.size(), "GpuLayerStream::embed: {} sequences, expected {}",
               sequences.size(), s.lengths.size());
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(s.total));
  for (size_t i = 0; i < sequences.size(); ++i) {
    NIBBLE_CHECK(static_cast<int64_t>(sequences[i].size()) == s.lengths[i],
                 "GpuLayerStream::embed: sequence {} has {} ids, expected {}", i, sequences[i].size(), s.lengths[i]);
    for (int32_t id : sequences[i])
      NIBBLE_CHECK(id >= 0 && id < table.size(0), "GpuLayerStream::embed: token id {} is outside the table", id);
    ids.insert(ids.end(), sequences[i].begin(), sequences[i].end());
  }
  const DType dt = table.dtype();
  NIBBLE_CHECK(dt == DType::BF16 || dt == DType::F16 || dt == DType::F32,
               "GpuLayerStream::embed: unsupported embedding dtype {}", dtype_name(dt));
  const DeviceBuffer d_ids = upload(ids.data(), ids.size() * sizeof(int32_t));
  const DeviceBuffer raw = upload(table);
  // The forward's gather (forward_kernels.cuh): a block per token, widened to f32 as read.
  const auto* d_id = static_cast<const int32_t*>(d_ids.get());
  auto* out = static_cast<float*>(s.hidden.get());
  if (s.total > 0) embed_kernel<<<static_cast<unsigned>(s.total), kThreads>>>(d_id, EmbedTable{raw.get(), dt}, out, D);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  NIBBLE_CUDA_CHECK(cudaDeviceSynchronize());  // the uploads are freed on return
}

void GpuLayerStream::load_layer(const DecoderLayer& L) {
  State& s = *s_;
  std::string why;
  NIBBLE_CHECK(supports(L, &why), "{}", why);
  s.window = L.window;
  s.input_norm = upload(L.input_norm);
  s.post_norm = upload(L.post_norm);
  s.q_norm = L.q_norm.defined() && L.q_norm.numel() ? upload(L.q_norm) : DeviceBuffer();
  s.k_norm = L.k_norm.defined() && L.k_norm.numel() ? upload(L.k_norm) : DeviceBuffer();
  const auto& slots = decoder_linears();
  for (size_t i = 0; i < slots.size(); ++i) {
    const LinearWeight& lw = L.*slots[i].member;
    const Tensor w = lw.dense_weight();
    NIBBLE_CHECK(w.dtype() == DType::F32 && w.dim() == 2, "GpuLayerStream: {} is not a dense f32 matrix",
                 slots[i].name);
    Linear& l = s.lin[i];
    l.out = w.size(0);
    l.in = w.size(1);
    l.w32 = upload(w);
    l.round_to_bf16();
    l.bias = lw.bias.defined() && lw.bias.numel() ? upload(lw.bias.to_f32()) : DeviceBuffer();
  }
  s.loaded = true;
}

bool GpuLayerStream::supports(const ModelSource& src, std::string* why) {
  const char* missing = !src.activation_quant().empty()    ? "simulated activation quantizers"
                        : src.down_proj_rotation().has_value() ? "the online rotation of down_proj's input"
                                                               : nullptr;
  if (missing && why) *why = fmt::format("the GPU calibration forward does not apply {}", missing);
  return missing == nullptr;
}

void GpuLayerStream::load_layer(const ModelSource& src, int64_t i) {
  State& s = *s_;
  std::string why;
  NIBBLE_CHECK(supports(src, &why), "{}", why);
  const std::string p = fmt::format("model.layers.{}.", i);
  const bool from_staging = s.staged_layer == i;
  if (s.staging.valid()) s.staging.get();  // rethrows a read error
  s.staged_layer = -1;
  s.window = s.c.window(i);
  s.input_norm = upload(src.load(p + "input_layernorm.weight").to_f32());
  s.post_norm = upload(src.load(p + "post_attention_layernorm.weight").to_f32());
  const bool qk = find_arch(s.c.model_type).qk_norm;
  s.q_norm = qk ? upload(src.load(p + "self_attn.q_norm.weight").to_f32()) : DeviceBuffer();
  s.k_norm = qk ? upload(src.load(p + "self_attn.k_norm.weight").to_f32()) : DeviceBuffer();
  const auto& slots = decoder_linears();
  for (size_t k = 0; k < slots.size(); ++k) {
    const std::string name = p + slots[k].name;
    const TensorMeta meta = src.meta(name + ".weight");
    NIBBLE_CHECK(meta.shape.size() == 2, "{}: not a matrix", name);
    Linear& l = s.lin[k];
    l.out = meta.shape[0];
    l.in = meta.shape[1];
    // A packed source tensor loads dequantized (f32); a plain one as stored.
    l.w32 = upload_f32(from_staging ? s.staged[k] : src.load(name + ".weight"));
    l.round_to_bf16();
    l.bias = src.contains(name + ".bias") ? upload(src.load(name + ".bias").to_f32()) : DeviceBuffer();
  }
  s.loaded = true;
}

void GpuLayerStream::prefetch_layer(const ModelSource& src, int64_t i) {
  State& s = *s_;
  if (s.staging.valid()) s.staging.get();
  s.staged_layer = -1;
  const std::string p = fmt::format("model.layers.{}.", i);
  const auto& slots = decoder_linears();
  std::array<TensorMeta, 7> metas;
  std::array<size_t, 7> offset{};
  size_t bytes = 0;
  for (size_t k = 0; k < slots.size(); ++k) {
    metas[k] = src.meta(p + slots[k].name + ".weight");
    const DType dt = metas[k].format ? DType::F32 : metas[k].dtype;  // packed: load() dequantizes
    offset[k] = bytes;
    bytes += (static_cast<size_t>(shape_numel(metas[k].shape)) * dtype_size(dt) + 255) / 256 * 256;
    s.staged[k] = Tensor();
  }
  if (bytes > s.pinned_bytes) {
    if (s.pinned != nullptr) NIBBLE_CUDA_CHECK(cudaFreeHost(s.pinned));
    s.pinned = nullptr;
    s.pinned_bytes = 0;
    NIBBLE_CUDA_CHECK(cudaMallocHost(&s.pinned, bytes));
    s.pinned_bytes = bytes;
  }
  s.staged_layer = i;
  s.staging = std::async(std::launch::async, [&s, &src, p, offset] {
    const auto& sl = decoder_linears();
    for (size_t k = 0; k < sl.size(); ++k) {
      Tensor t = src.load(p + sl[k].name + ".weight");
      if (!t.is_contiguous()) t = t.contiguous();
      char* dst = static_cast<char*>(s.pinned) + offset[k];
      // In slices on several threads: the first touch of a mapped file's
      // pages (the page faults) is what this copy mostly costs.
      const auto* from = static_cast<const char*>(t.raw());
      const int64_t bytes = static_cast<int64_t>(t.nbytes()), slice = int64_t{8} << 20;
      std::atomic<int64_t> next{0};
      auto copy = [&] {
        for (int64_t o; (o = next.fetch_add(slice)) < bytes;)
          std::memcpy(dst + o, from + o, std::min(slice, bytes - o));
      };
      std::vector<std::thread> helpers;
      for (int h = 0; h < 7; ++h) helpers.emplace_back(copy);
      copy();
      for (std::thread& h : helpers) h.join();
      s.staged[k] = Tensor::view(t.dtype(), t.shape(), dst, nullptr);
    }
  });
}

void GpuLayerStream::apply(const std::array<GpuHessian*, 4>& taps, bool advance) {
  State& s = *s_;
  NIBBLE_CHECK(s.loaded, "GpuLayerStream::apply: no layer is loaded");
  for (size_t first = 0; first < s.lengths.size();) {
    size_t last = first;
    int64_t n = s.lengths[first];
    while (last + 1 < s.lengths.size() && n + s.lengths[last + 1] <= kChunkTokens) n += s.lengths[++last];
    s.reserve(n);
    s.run_chunk(first, last, taps, advance);
    first = last + 1;
  }
}

quant::GptqResult GpuLayerStream::quantize_linear(size_t slot, const GpuPreparedHessian& hessian,
                                                  const FormatChoice& format, bool mse,
                                                  const quant::GptqOptions& options, double* rel_error,
                                                  double* max_abs_error, const GpuRefine& refine) {
  State& s = *s_;
  NIBBLE_CHECK(s.loaded && slot < s.lin.size(), "GpuLayerStream::quantize_linear: no such linear");
  Linear& l = s.lin[slot];
  DeviceBuffer dq;
  quant::GptqResult r = gptq_with_error(static_cast<const float*>(l.w32.get()), l.out, l.in, hessian, format, mse,
                                        options, &dq, rel_error, max_abs_error, refine);
  // The layer now holds the quantized weights (nothing reads the original again).
  l.w32 = std::move(dq);
  l.round_to_bf16();
  return r;
}

quant::GptqResult gptq_matrix(const Tensor& w, const GpuPreparedHessian& hessian, const FormatChoice& format, bool mse,
                              const quant::GptqOptions& options, double* rel_error, double* max_abs_error,
                              const GpuRefine& refine) {
  NIBBLE_CHECK(w.dim() == 2, "gptq (cuda): expected a matrix, found {}", shape_str(w.shape()));
  const DeviceBuffer w32 = upload_f32(w.is_contiguous() ? w : w.contiguous());
  DeviceBuffer dq;
  return gptq_with_error(static_cast<const float*>(w32.get()), w.size(0), w.size(1), hessian, format, mse, options,
                         &dq, rel_error, max_abs_error, refine);
}

void GpuLayerStream::add_final_normed(const Tensor& final_norm, GpuHessian& hess) const {
  const State& s = *s_;
  const int64_t D = s.c.hidden_size;
  const DeviceBuffer w = upload(final_norm.to_f32());
  const int64_t chunk = std::min(s.total, kChunkTokens);
  DeviceBuffer out(static_cast<size_t>(chunk * D) * 4);
  for (int64_t r0 = 0; r0 < s.total; r0 += chunk) {
    const int64_t n = std::min(chunk, s.total - r0);
    // y = nullptr: x is only read.
    add_rmsnorm_kernel<float><<<static_cast<unsigned>(n), kNormThreads>>>(
        static_cast<float*>(s.hidden.get()) + r0 * D, nullptr, D, static_cast<const float*>(w.get()),
        static_cast<float>(s.c.rms_norm_eps), static_cast<float*>(out.get()), D);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    hess.add_device(static_cast<const float*>(out.get()), n, D);
  }
}

}  // namespace nibble::cuda
