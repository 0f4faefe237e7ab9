// The Llama-family forward pass on the GPU (include/nibble/cuda_model.h).
//
// The same computation as src/model/forward.cpp, op for op. The one difference
// is precision: the inputs of the linears are rounded to bf16, which is what
// the W4A16 kernels take (the CPU's bf16_activations mode, the noise floor's
// second computation, does the same). Linear outputs (fp32 accumulation), the
// residual stream, RMSNorm, q/k norms, RoPE, softmax and the KV cache are fp32.
//
// Kernels are plain and one per op (embedding, RMSNorm, q/k norm + RoPE + cache
// write, attention, residual add, SiLU·up, bias). Attention is one block per
// (query, head) over the cached keys, fine for the fixtures and for decode.
// Prefill of long prompts wants a flash-style kernel; CUDA graphs for decode
// are future work (docs/CUDA.md).
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/check.h"
#include "nibble/arch.h"
#include "nibble/cuda.h"
#include "nibble/cuda_model.h"
#include "nibble/dtype.h"
#include "nibble/model.h"

namespace nibble::cuda {
namespace {

using bf16 = __nv_bfloat16;

int64_t pad8(int64_t v) { return (v + 7) / 8 * 8; }  // leading dimensions: the W4A16 kernels read 16-byte rows

// A linear on the device: packed (a registered kernel) or dense bf16 (cuBLAS).
struct GpuLinear {
  int64_t out = 0, in = 0;
  DeviceLinear packed;
  DeviceBuffer dense, bias;  // bias: f32 [out], empty when none
};

GpuLinear load_linear_gpu(const ModelSource& src, const std::string& prefix) {
  const std::string wname = prefix + ".weight";
  const TensorMeta meta = src.meta(wname);
  NIBBLE_CHECK(meta.shape.size() == 2, "{}: expected a matrix, found shape {}", wname, shape_str(meta.shape));
  GpuLinear l;
  l.out = meta.shape[0];
  l.in = meta.shape[1];
  const LinearKernel* k = meta.format ? find_linear_kernel(meta.format->spec->family, meta.format->group_size) : nullptr;
  if (k != nullptr)
    l.packed = k->upload(src.parts(wname), l.out, l.in, meta.format->group_size);
  else
    l.dense = upload_bf16(src.load(wname));  // any other format: dequantized once (the registry's fallback)
  if (src.contains(prefix + ".bias")) l.bias = upload(src.load(prefix + ".bias").to_f32());
  return l;
}

GpuLinear dense_linear(const Tensor& w) {
  GpuLinear l;
  l.out = w.shape()[0];
  l.in = w.shape()[1];
  l.dense = upload_bf16(w);
  return l;
}

__global__ void bias_add_kernel(float* y, const float* bias, int64_t n, int64_t N) {
  const int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (i < n * N) y[i] += bias[i % N];
}

unsigned blocks_of(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

// y[M, out] (f32, dense rows) = x[M, in] (bf16, leading dimension ldx) · Wᵀ + bias.
void linear_forward(const GpuLinear& l, const bf16* x, int64_t M, int64_t ldx, float* y) {
  if (l.packed.kernel != nullptr)
    l.packed.kernel->gemm(l.packed, x, M, ldx, y, l.out, Act::BF16, true, nullptr, false);
  else
    gemm_bf16_cublas(l.dense.get(), l.out, l.in, x, M, ldx, y, l.out, nullptr, true);
  if (l.bias.bytes() > 0) {
    bias_add_kernel<<<blocks_of(M * l.out, 256), 256>>>(y, static_cast<const float*>(l.bias.get()), M, l.out);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
  }
}

// ---- kernels -------------------------------------------------------------------

__device__ float block_sum(float v, float* scratch) {  // blockDim.x a multiple of 32, at most 1024
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) s += scratch[w];
  return s;
}
__device__ float block_max(float v, float* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int w = 0; w < static_cast<int>(blockDim.x >> 5); ++w) m = fmaxf(m, scratch[w]);
  return m;
}

__global__ void embed_kernel(const int32_t* tokens, const float* embed, float* x, int64_t D) {
  const int64_t i = blockIdx.x;
  const float* row = embed + static_cast<int64_t>(tokens[i]) * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) x[i * D + d] = row[d];
}

// out[i] = bf16(x[i] / sqrt(mean(x[i]²) + eps) * w), one block per row.
__global__ void rmsnorm_kernel(const float* x, int64_t D, const float* w, float eps, bf16* out, int64_t ldo) {
  __shared__ float scratch[32];
  const int64_t i = blockIdx.x;
  const float* xr = x + i * D;
  float ss = 0.0f;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) ss += xr[d] * xr[d];
  ss = block_sum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(D) + eps);
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) out[i * ldo + d] = __float2bfloat16_rn(xr[d] * inv * w[d]);
}

// One warp per (token, head): optional per-head RMSNorm (qwen3), RoPE
// (rotate_half), then q to qf (f32) and k, v into the cache rows at p0 + i.
__global__ void qkv_rope_kernel(const float* q, int64_t ldq, const float* k, int64_t ldk, const float* v, int64_t ldv,
                                const float* q_norm, const float* k_norm, float eps, const float* inv_freq, int64_t H,
                                int64_t KV, int64_t hd, int64_t p0, float* qf, float* kc, float* vc) {
  extern __shared__ float buf[];  // [hd]
  const int64_t i = blockIdx.x / (H + KV), hh = blockIdx.x % (H + KV);
  const int lane = threadIdx.x;
  const bool is_q = hh < H;
  const int64_t kvh = hh - H;
  const float* src = is_q ? q + i * ldq + hh * hd : k + i * ldk + kvh * hd;
  const float* nw = is_q ? q_norm : k_norm;
  for (int64_t d = lane; d < hd; d += 32) buf[d] = src[d];
  __syncwarp();
  if (nw != nullptr) {
    float ss = 0.0f;
    for (int64_t d = lane; d < hd; d += 32) ss += buf[d] * buf[d];
    for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = 1.0f / sqrtf(ss / static_cast<float>(hd) + eps);
    __syncwarp();
    for (int64_t d = lane; d < hd; d += 32) buf[d] = buf[d] * inv * nw[d];
    __syncwarp();
  }
  const int64_t half = hd / 2, row = KV * hd;
  float* dst = is_q ? qf + (i * H + hh) * hd : kc + (p0 + i) * row + kvh * hd;
  const float pos = static_cast<float>(p0 + i);
  for (int64_t d = lane; d < half; d += 32) {
    const float angle = pos * inv_freq[d];
    const float c = cosf(angle), s = sinf(angle), a = buf[d], b = buf[d + half];
    dst[d] = a * c - b * s;
    dst[d + half] = b * c + a * s;
  }
  if (!is_q)
    for (int64_t d = lane; d < hd; d += 32) vc[(p0 + i) * row + kvh * hd + d] = v[i * ldv + kvh * hd + d];
}

// One block per (query i, head h): softmax(q·K / sqrt(hd)) · V over the cached
// positions t0 .. p0+i (t0 > 0 under a sliding window).
__global__ void attention_kernel(const float* qf, const float* kc, const float* vc, bf16* out, int64_t ldo, int64_t H,
                                 int64_t KV, int64_t hd, int64_t p0, int64_t window, float scale) {
  extern __shared__ float sm[];  // q [hd], then scores [T - t0]
  __shared__ float scratch[32];
  const int64_t i = blockIdx.x, h = blockIdx.y, kvh = h / (H / KV), row = KV * hd;
  const int64_t T = p0 + i + 1, t0 = (window > 0 && T > window) ? T - window : 0;
  float* qs = sm;
  float* sc = sm + hd;
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = qf[(i * H + h) * hd + d];
  __syncthreads();
  float mx = -INFINITY;
  for (int64_t t = t0 + threadIdx.x; t < T; t += blockDim.x) {
    const float* kt = kc + t * row + kvh * hd;
    float s = 0.0f;
    for (int64_t d = 0; d < hd; ++d) s += qs[d] * kt[d];
    sc[t - t0] = s * scale;
    mx = fmaxf(mx, s * scale);
  }
  mx = block_max(mx, scratch);
  float sum = 0.0f;
  for (int64_t t = t0 + threadIdx.x; t < T; t += blockDim.x) sum += (sc[t - t0] = expf(sc[t - t0] - mx));
  sum = block_sum(sum, scratch);  // its barriers also publish sc
  for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int64_t t = t0; t < T; ++t) o += sc[t - t0] * vc[t * row + kvh * hd + d];
    out[i * ldo + h * hd + d] = __float2bfloat16_rn(o / sum);
  }
}

__global__ void add_residual_kernel(float* x, const float* y, int64_t n) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j < n) x[j] += y[j];
}

// h = bf16(SiLU(g) · u), the down projection's input.
__global__ void silu_mul_kernel(const float* g, const float* u, bf16* h, int64_t ldh, int64_t n, int64_t F) {
  const int64_t j = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (j >= n * F) return;
  const float a = g[j];
  h[(j / F) * ldh + j % F] = __float2bfloat16_rn(a / (1.0f + expf(-a)) * u[j]);
}

struct GpuLayer {
  DeviceBuffer input_norm, post_norm, q_norm, k_norm;  // f32 (q/k norms: qwen3 only)
  GpuLinear q, k, v, o, gate, up, down;
  int64_t window = 0;
};

// Device scratch that grows to the largest n seen.
struct Scratch {
  int64_t rows = 0;
  DeviceBuffer tokens, x, xn, q, k, v, qf, att, tmp, g, u, h, logits;
};

}  // namespace

struct GpuModel::Impl {
  ModelConfig c;
  int64_t max_tokens = 0, len = 0;
  int64_t ldD = 0, ldQ = 0, ldF = 0;  // bf16 linear inputs: rows padded to 16 bytes
  DeviceBuffer embed, final_norm, inv_freq;
  GpuLinear head;
  std::vector<GpuLayer> layers;
  std::vector<DeviceBuffer> kcache, vcache;  // per layer, f32 [max_tokens, KV*hd]
  Scratch s;

  void ensure_rows(int64_t n) {
    if (n <= s.rows) return;
    const int64_t H = c.num_heads, hd = c.head_dim;
    s = Scratch{};
    s.rows = n;
    s.tokens = DeviceBuffer(n * 4);
    s.x = DeviceBuffer(n * c.hidden_size * 4);
    const int64_t KV = c.num_kv_heads, D = c.hidden_size, F = c.intermediate_size;
    s.xn = DeviceBuffer(n * ldD * 2);
    s.q = DeviceBuffer(n * H * hd * 4);
    s.k = DeviceBuffer(n * KV * hd * 4);
    s.v = DeviceBuffer(n * KV * hd * 4);
    s.qf = DeviceBuffer(n * H * hd * 4);
    s.att = DeviceBuffer(n * ldQ * 2);
    s.tmp = DeviceBuffer(n * D * 4);
    s.g = DeviceBuffer(n * F * 4);
    s.u = DeviceBuffer(n * F * 4);
    s.h = DeviceBuffer(n * ldF * 2);
    s.logits = DeviceBuffer(n * c.vocab_size * 4);
  }
};

GpuModel::GpuModel() : impl_(std::make_unique<Impl>()) {}
GpuModel::~GpuModel() = default;
const ModelConfig& GpuModel::config() const { return impl_->c; }
int64_t GpuModel::size() const { return impl_->len; }
void GpuModel::reset() { impl_->len = 0; }

std::unique_ptr<GpuModel> GpuModel::load(const ModelSource& src, int64_t max_tokens) {
  NIBBLE_CHECK(device_available(), "--device cuda: no CUDA device is visible");
  NIBBLE_CHECK(max_tokens > 0, "GpuModel: the KV cache needs at least one position");
  src.validate_against_config();
  NIBBLE_CHECK(!src.down_proj_rotation(),
               "--device cuda: {} rotates down_proj's input online (--method rotate+...), which the GPU forward does "
               "not do yet; run it on the CPU",
               src.describe());
  std::unique_ptr<GpuModel> model(new GpuModel());
  Impl& m = *model->impl_;
  m.c = src.config();
  const ModelConfig& c = m.c;
  NIBBLE_CHECK(c.head_dim % 2 == 0 && c.num_heads % c.num_kv_heads == 0, "GpuModel: unsupported head layout");
  m.max_tokens = max_tokens;
  m.ldD = pad8(c.hidden_size);
  m.ldQ = pad8(c.num_heads * c.head_dim);
  m.ldF = pad8(c.intermediate_size);
  const Tensor embed = src.load("model.embed_tokens.weight").to_f32();
  m.embed = upload(embed);
  m.final_norm = upload(src.load("model.norm.weight").to_f32());
  m.head = c.tie_word_embeddings ? dense_linear(embed) : load_linear_gpu(src, "lm_head");
  const bool qk_norm = find_arch(c.model_type).qk_norm;
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    GpuLayer L;
    L.window = c.window(i);
    L.input_norm = upload(src.load(p + "input_layernorm.weight").to_f32());
    L.post_norm = upload(src.load(p + "post_attention_layernorm.weight").to_f32());
    if (qk_norm) {
      L.q_norm = upload(src.load(p + "self_attn.q_norm.weight").to_f32());
      L.k_norm = upload(src.load(p + "self_attn.k_norm.weight").to_f32());
    }
    L.q = load_linear_gpu(src, p + "self_attn.q_proj");
    L.k = load_linear_gpu(src, p + "self_attn.k_proj");
    L.v = load_linear_gpu(src, p + "self_attn.v_proj");
    L.o = load_linear_gpu(src, p + "self_attn.o_proj");
    L.gate = load_linear_gpu(src, p + "mlp.gate_proj");
    L.up = load_linear_gpu(src, p + "mlp.up_proj");
    L.down = load_linear_gpu(src, p + "mlp.down_proj");
    m.layers.push_back(std::move(L));
    const size_t cache_bytes = static_cast<size_t>(max_tokens * c.num_kv_heads * c.head_dim) * 4;
    m.kcache.emplace_back(cache_bytes);
    m.vcache.emplace_back(cache_bytes);
  }
  const std::vector<float> inv = rope_inv_freq(c);
  m.inv_freq = upload(inv.data(), inv.size() * 4);
  // Attention keeps q and the scores of one query in shared memory.
  const size_t att_smem = static_cast<size_t>(c.head_dim + max_tokens) * 4;
  NIBBLE_CHECK(att_smem <= 200u << 10, "GpuModel: a KV cache of {} positions is more than the attention kernel's "
               "shared memory holds", max_tokens);
  NIBBLE_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(att_smem)));
  NIBBLE_CUDA_CHECK(cudaDeviceSynchronize());
  return model;
}

Tensor GpuModel::forward(const std::vector<int32_t>& tokens, bool all_logits) {
  Impl& m = *impl_;
  const ModelConfig& c = m.c;
  const int64_t n = static_cast<int64_t>(tokens.size()), p0 = m.len;
  const int64_t D = c.hidden_size, H = c.num_heads, KV = c.num_kv_heads, hd = c.head_dim, F = c.intermediate_size,
                V = c.vocab_size;
  NIBBLE_CHECK(n > 0, "forward: no tokens");
  NIBBLE_CHECK(p0 + n <= m.max_tokens, "forward: {} + {} tokens exceed the cache of {} positions", p0, n,
               m.max_tokens);
  for (int32_t t : tokens)
    NIBBLE_CHECK(t >= 0 && t < V, "forward: token id {} is outside the vocabulary (size {})", t, V);
  m.ensure_rows(n);
  Scratch& s = m.s;
  NIBBLE_CUDA_CHECK(cudaMemcpy(s.tokens.get(), tokens.data(), n * 4, cudaMemcpyHostToDevice));
  auto* x = static_cast<float*>(s.x.get());
  auto* xn = static_cast<bf16*>(s.xn.get());
  auto* q = static_cast<float*>(s.q.get());
  auto* k = static_cast<float*>(s.k.get());
  auto* v = static_cast<float*>(s.v.get());
  auto* att = static_cast<bf16*>(s.att.get());
  auto* tmp = static_cast<float*>(s.tmp.get());
  auto* g = static_cast<float*>(s.g.get());
  auto* u = static_cast<float*>(s.u.get());
  auto* h = static_cast<bf16*>(s.h.get());
  const float eps = static_cast<float>(c.rms_norm_eps), scale = 1.0f / std::sqrt(static_cast<float>(hd));
  auto f32p = [](const DeviceBuffer& b) { return b.bytes() ? static_cast<const float*>(b.get()) : nullptr; };

  embed_kernel<<<static_cast<unsigned>(n), 256>>>(static_cast<const int32_t*>(s.tokens.get()),
                                                 static_cast<const float*>(m.embed.get()), x, D);
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const GpuLayer& L = m.layers[l];
    rmsnorm_kernel<<<static_cast<unsigned>(n), 256>>>(x, D, f32p(L.input_norm), eps, xn, m.ldD);
    linear_forward(L.q, xn, n, m.ldD, q);
    linear_forward(L.k, xn, n, m.ldD, k);
    linear_forward(L.v, xn, n, m.ldD, v);
    auto* kc = static_cast<float*>(m.kcache[l].get());
    auto* vc = static_cast<float*>(m.vcache[l].get());
    qkv_rope_kernel<<<static_cast<unsigned>(n * (H + KV)), 32, hd * 4>>>(
        q, H * hd, k, KV * hd, v, KV * hd, f32p(L.q_norm), f32p(L.k_norm), eps, f32p(m.inv_freq), H, KV, hd, p0,
        static_cast<float*>(s.qf.get()), kc, vc);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    attention_kernel<<<dim3(static_cast<unsigned>(n), static_cast<unsigned>(H)), 128,
                       static_cast<size_t>(hd + p0 + n) * 4>>>(static_cast<const float*>(s.qf.get()), kc, vc, att,
                                                               m.ldQ, H, KV, hd, p0, L.window, scale);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
    linear_forward(L.o, att, n, m.ldQ, tmp);
    add_residual_kernel<<<blocks_of(n * D, 256), 256>>>(x, tmp, n * D);
    rmsnorm_kernel<<<static_cast<unsigned>(n), 256>>>(x, D, f32p(L.post_norm), eps, xn, m.ldD);
    linear_forward(L.gate, xn, n, m.ldD, g);
    linear_forward(L.up, xn, n, m.ldD, u);
    silu_mul_kernel<<<blocks_of(n * F, 256), 256>>>(g, u, h, m.ldF, n, F);
    linear_forward(L.down, h, n, m.ldF, tmp);
    add_residual_kernel<<<blocks_of(n * D, 256), 256>>>(x, tmp, n * D);
    NIBBLE_CUDA_CHECK(cudaGetLastError());
  }
  m.len += n;
  const int64_t rows = all_logits ? n : 1;
  rmsnorm_kernel<<<static_cast<unsigned>(rows), 256>>>(x + (n - rows) * D, D, f32p(m.final_norm), eps, xn, m.ldD);
  linear_forward(m.head, xn, rows, m.ldD, static_cast<float*>(s.logits.get()));
  NIBBLE_CUDA_CHECK(cudaGetLastError());
  Tensor logits = Tensor::zeros(DType::F32, {rows, V});
  NIBBLE_CUDA_CHECK(cudaMemcpy(logits.raw_mut(), s.logits.get(), logits.nbytes(), cudaMemcpyDeviceToHost));
  return logits;
}

}  // namespace nibble::cuda
