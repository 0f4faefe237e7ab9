// The GPU forward's attention kernels (include/nibble/cuda_attention.h)
// against a float64 host reference of causal GQA attention, and GpuModel's
// prefill of long prompts (flash kernel) against the CPU forward. Compiled
// whenever the build has CUDA; skipped without a GPU.
#include <gtest/gtest.h>

#ifdef NIBBLE_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "nibble/cuda.h"
#include "nibble/cuda_attention.h"
#include "nibble/cuda_model.h"
#include "nibble/dtype.h"
#include "nibble/model.h"
#include "nibble/source.h"
#include "test_util.h"

namespace nibble {
namespace {

struct AttnCase {
  int64_t n, p0, heads, kv_heads, head_dim, window;
  float q_gain;     // queries scaled by this: > 1 makes a few keys dominate each row (a lost key shows)
  int check_every;  // reference for every k-th query row only (and the last 64): long cases
};

struct AttnData {
  std::vector<float> q, k, v;  // q [n, H, hd]; k, v [p0+n, KV, hd]
};

AttnData random_attention(const AttnCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  AttnData d;
  const int64_t T = c.p0 + c.n;
  d.q.resize(static_cast<size_t>(c.n * c.heads * c.head_dim));
  d.k.resize(static_cast<size_t>(T * c.kv_heads * c.head_dim));
  d.v.resize(d.k.size());
  for (auto& x : d.q) x = c.q_gain * normal(rng);
  for (auto& x : d.k) x = normal(rng);
  for (auto& x : d.v) x = normal(rng);
  return d;
}

// The caches as a bf16 cache holds them (GpuOptions::kv_dtype): k and v
// rounded to the nearest bf16; q unchanged.
AttnData bf16_cache(AttnData d) {
  for (auto* x : {&d.k, &d.v})
    for (float& e : *x) e = round_to_bf16(e);
  return d;
}

// A host buffer as bf16 bits (the values must be bf16 already, or NaN).
cuda::DeviceBuffer upload_bf16(const std::vector<float>& x) {
  std::vector<uint16_t> b(x.size());
  for (size_t i = 0; i < x.size(); ++i) b[i] = f32_to_bf16(x[i]);
  return cuda::upload(b.data(), b.size() * 2);
}

// Runs `kernel` ("flash", "tc": flash_attention_tc, "rowwise" or "split":
// split_attention, one query, 7 key ranges) and returns the bf16 output as float
// [n, ldo]. The cache has spare rows past p0+n filled with NaN and the output
// starts as NaN (bf16 0xFFFF) with padding columns: the kernel must read no
// key past the last query's position and write nothing outside its columns.
// kv_bf16: the caches are bf16 (d's k and v must hold bf16 values: bf16_cache).
std::vector<float> run_attention(const AttnCase& c, const AttnData& d, const std::string& kernel, int64_t ldo,
                                 bool kv_bf16 = false) {
  const int64_t T = c.p0 + c.n, row = c.kv_heads * c.head_dim, spare = 70;
  std::vector<float> kp(static_cast<size_t>((T + spare) * row), std::nanf("")), vp(kp);
  std::copy(d.k.begin(), d.k.end(), kp.begin());
  std::copy(d.v.begin(), d.v.end(), vp.begin());
  cuda::DeviceBuffer dq = cuda::upload(d.q.data(), d.q.size() * 4), dout(static_cast<size_t>(c.n * ldo) * 2);
  cuda::DeviceBuffer dk = kv_bf16 ? upload_bf16(kp) : cuda::upload(kp.data(), kp.size() * 4);
  cuda::DeviceBuffer dv = kv_bf16 ? upload_bf16(vp) : cuda::upload(vp.data(), vp.size() * 4);
  EXPECT_EQ(cudaMemset(dout.get(), 0xFF, dout.bytes()), cudaSuccess);
  cuda::AttentionArgs a;
  a.q = static_cast<const float*>(dq.get());
  a.k = dk.get();
  a.v = dv.get();
  a.kv_bf16 = kv_bf16;
  a.out = dout.get();
  a.ldo = ldo;
  a.n = c.n;
  a.p0 = c.p0;
  a.heads = c.heads;
  a.kv_heads = c.kv_heads;
  a.head_dim = c.head_dim;
  a.window = c.window;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  cuda::DeviceBuffer scratch(cuda::split_attention_scratch_bytes(c.heads, c.head_dim, 7));
  if (kernel == "shared") {
    scratch = cuda::DeviceBuffer(cuda::kv_shared_attention_scratch_bytes(c.heads, c.kv_heads, c.head_dim));
    EXPECT_EQ(cudaMemset(scratch.get(), 0, scratch.bytes()), cudaSuccess);
  }
  if (kernel == "tc") {
    scratch = cuda::DeviceBuffer(cuda::flash_attention_tc_scratch(a));
    cuda::flash_attention_tc(a, scratch.get(), nullptr);
  } else if (kernel == "flash")
    cuda::flash_attention(a, nullptr);
  else if (kernel == "split")
    cuda::split_attention(a, nullptr, 7, scratch.get(), nullptr);
  else if (kernel == "decode")
    cuda::decode_attention(a, nullptr, T, nullptr);
  else if (kernel == "shared") {
    cuda::kv_shared_attention(a, nullptr, scratch.get(), nullptr);
    cuda::kv_shared_attention(a, nullptr, scratch.get(), nullptr);  // again: the tickets are back at zero
  } else
    cuda::rowwise_attention(a, nullptr, T, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> raw(static_cast<size_t>(c.n * ldo));
  EXPECT_EQ(cudaMemcpy(raw.data(), dout.get(), raw.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
  std::vector<float> out(raw.size());
  for (size_t i = 0; i < raw.size(); ++i) out[i] = raw[i] == 0xFFFF ? std::nanf("") : bf16_to_f32(raw[i]);
  return out;
}

// Checks `got` against attention in float64 on the same fp32 inputs.
//
// Tolerance, per output element: 2^-8·|ref| (the output's rounding to bf16,
// 8 significant bits, round to nearest) plus E·mag, the fp32 error of the
// kernel, where mag = Σ p_t·|v_td| / Σ p_t (the same weighted sum with |v|)
// and, with u = 2^-24 and T the row's key count, to first order:
//   E = u · [ ln2·((hd + 2)·A + R) + 2·T + 8·(T/64 + 2) + 16 ]
// - a score is an fp32 dot product of hd terms (plus the rounding of q·scale):
//   |Δs| ≤ (hd + 2)·u·A, A = max_t Σ_d |q_d k_d|·scale·log2 e (log2 units),
//   and the subtraction s − m adds u·R, R = max_t |s_t − m| (log2 units); a
//   weight 2^(s−m) then moves by ln2·|Δ(s − m)| relative;
// - each exponential (exp2f / expf, ≤ 2 ulp = 4u) and each rescale of the
//   running sums by 2^(m_old − m_new) (an exponential and a multiply per key
//   tile of 64, or the row-wise kernel's block reductions): 8u per tile;
// - numerator and denominator sums over T keys: T·u each (worst-case order);
// - the final division and the rest: 16u.
// The bound is worst-case (linear in T and hd), so it never fails on a
// correct kernel; a key lost or added moves a row by ~p_t·|v_t − o|, which the
// q_gain > 1 cases make O(1) for the rows that key dominates.
//
// bf16_kernel: flash_attention_bf16's inputs and its one extra rounding. q is
// already in log2 units (scores q·k·ln 2 in natural units, and no rounding of
// q·scale: hd instead of hd + 2 in E); P is rounded to bf16 (8 significant
// bits) for the P·V product while the row sum stays fp32, which moves the
// output by at most 2^-8·mag more.
void check_attention(const AttnCase& c, const AttnData& d, const std::vector<float>& got, int64_t ldo,
                     const std::string& what, bool bf16_kernel = false) {
  const int64_t H = c.heads, KV = c.kv_heads, hd = c.head_dim, row = KV * hd;
  const double log2e = 1.4426950408889634;
  const double scale = bf16_kernel ? 1.0 / log2e : 1.0 / std::sqrt(static_cast<double>(static_cast<float>(hd)));
  const double q_rounding = bf16_kernel ? 0 : 2, p_rounding = bf16_kernel ? std::ldexp(1.0, -8) : 0;
  const double u = std::ldexp(1.0, -24);
  int bad = 0;
  double worst = 0;  // max |Δ| / tol
  std::vector<double> s(static_cast<size_t>(c.p0 + c.n)), o(static_cast<size_t>(hd)), mag(o.size());
  for (int64_t i = 0; i < c.n && bad < 8; ++i) {
    // The long cases check every k-th row, the last tile's rows and the padding of all.
    for (int64_t col = H * hd; col < ldo; ++col)
      if (!std::isnan(got[i * ldo + col]) && bad++ < 8) ADD_FAILURE() << what << ": wrote padding column " << col;
    if (c.check_every > 1 && i % c.check_every != 0 && i < c.n - 64) continue;
    const int64_t pos = c.p0 + i, T = pos + 1, t0 = c.window > 0 ? std::max<int64_t>(0, T - c.window) : 0;
    for (int64_t h = 0; h < H && bad < 8; ++h) {
      const int64_t kvh = h / (H / KV);
      const float* qi = &d.q[static_cast<size_t>((i * H + h) * hd)];
      double mx = -INFINITY, A = 0;
      for (int64_t t = t0; t < T; ++t) {
        const float* kt = &d.k[static_cast<size_t>(t * row + kvh * hd)];
        double dot = 0, abs_dot = 0;
        for (int64_t e = 0; e < hd; ++e) {
          dot += static_cast<double>(qi[e]) * kt[e];
          abs_dot += std::fabs(static_cast<double>(qi[e]) * kt[e]);
        }
        s[t] = dot * scale;
        mx = std::max(mx, s[t]);
        A = std::max(A, abs_dot * scale * log2e);
      }
      double sum = 0, R = 0;
      for (int64_t t = t0; t < T; ++t) {
        R = std::max(R, (mx - s[t]) * log2e);
        sum += (s[t] = std::exp(s[t] - mx));
      }
      std::fill(o.begin(), o.end(), 0.0);
      std::fill(mag.begin(), mag.end(), 0.0);
      for (int64_t t = t0; t < T; ++t) {
        const float* vt = &d.v[static_cast<size_t>(t * row + kvh * hd)];
        for (int64_t e = 0; e < hd; ++e) {
          o[e] += s[t] * vt[e];
          mag[e] += s[t] * std::fabs(static_cast<double>(vt[e]));
        }
      }
      const double keys = static_cast<double>(T - t0);
      const double E = u * (std::log(2.0) * ((hd + q_rounding) * A + R) + 2 * keys + 8 * (keys / 64 + 2) + 16);
      for (int64_t e = 0; e < hd; ++e) {
        const double ref = o[e] / sum, tol = std::ldexp(std::fabs(ref), -8) + (p_rounding + 1.01 * E) * mag[e] / sum;
        const double v = got[i * ldo + h * hd + e];
        worst = std::max(worst, std::fabs(v - ref) / tol);
        if (!(std::fabs(v - ref) <= tol) && bad++ < 8)
          ADD_FAILURE() << what << ": out[" << i << ", h" << h << ", " << e << "] = " << v << ", ref " << ref
                        << ", tol " << tol;
      }
    }
  }
  std::printf("[attention] %s: worst |Δ|/tol %.3f\n", what.c_str(), worst);
}

std::string describe(const AttnCase& c) {
  return "n=" + std::to_string(c.n) + " p0=" + std::to_string(c.p0) + " H=" + std::to_string(c.heads) +
         " KV=" + std::to_string(c.kv_heads) + " hd=" + std::to_string(c.head_dim) +
         (c.window ? " window=" + std::to_string(c.window) : "") + " gain=" + std::to_string(c.q_gain);
}

// Every kernel that takes case c (flash and row-wise; split, cluster decode
// and kv-shared for one query, where they support the shape) on d, each
// checked against the float64 reference.
void check_every_kernel(const AttnCase& c, const AttnData& d, bool kv_bf16) {
  const int64_t ldo = c.heads * c.head_dim + 6;  // padded rows, as the forward's ldQ can be
  for (const char* kernel : {"flash", "rowwise", "split", "decode", "shared"}) {
    const std::string k = kernel;
    if (k == "flash" && !cuda::flash_attention_supported(c.head_dim)) continue;
    if ((k == "split" || k == "decode" || k == "shared") && c.n != 1) continue;  // decode only
    if (k == "decode" && !cuda::decode_attention_supported(c.head_dim)) continue;
    if (k == "shared" && !cuda::kv_shared_attention_supported(c.head_dim, c.heads, c.kv_heads)) continue;
    const auto got = run_attention(c, d, kernel, ldo, kv_bf16);
    check_attention(c, d, got, ldo, k + (kv_bf16 ? " bf16 cache " : " ") + describe(c));
  }
}

// Shapes: one query; exact tiles; ragged lengths (not multiples of 64) at
// p0 = 0 and p0 > 0 (chunked prefill, a cache longer than the prompt); MHA
// and GQA ratios 2, 3, 4, 8; head dims 64, 128, 256; a sliding window; peaked
// softmax (gain 4). Both kernels against the same reference and bound.
TEST(Cuda, FlashAttentionMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<AttnCase> cases = {
      {1, 0, 4, 2, 64, 0, 1.0f, 1},        {1, 130, 8, 2, 128, 0, 1.0f, 1},    {64, 0, 4, 4, 64, 0, 1.0f, 1},
      {100, 0, 8, 2, 64, 0, 4.0f, 1},      {129, 37, 6, 3, 128, 0, 1.0f, 1},   {77, 300, 32, 8, 128, 0, 4.0f, 1},
      {200, 5, 4, 1, 256, 0, 1.0f, 1},     {191, 0, 8, 8, 128, 0, 4.0f, 1},    {150, 20, 6, 3, 128, 50, 1.0f, 1},
      {130, 100, 4, 2, 64, 64, 4.0f, 1},   {65, 63, 2, 1, 64, 0, 1.0f, 1},
  };
  uint32_t seed = 100;
  for (const AttnCase& c : cases) check_every_kernel(c, random_attention(c, seed++), false);
}

// Every kernel on a bf16 cache (GpuOptions::kv_dtype) against the same
// float64 reference and bound, on the cache's values (k and v rounded to
// bf16): the kernels widen the cache exactly, so only the reads change. The
// prefill shapes above, long decode caches (the split and cluster kernels'
// ranges, the kv-shared kernel's prefetch of 64-element lines) and a sliding
// window.
TEST(Cuda, AttentionOnABf16CacheMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<AttnCase> cases = {
      {1, 0, 4, 2, 64, 0, 1.0f, 1},      {1, 130, 8, 2, 128, 0, 4.0f, 1},   {129, 37, 6, 3, 128, 0, 1.0f, 1},
      {77, 300, 32, 8, 128, 0, 4.0f, 1}, {200, 5, 4, 1, 256, 0, 1.0f, 1},   {130, 100, 4, 2, 64, 64, 4.0f, 1},
      {1, 2999, 32, 8, 128, 0, 4.0f, 1}, {1, 4000, 6, 3, 128, 100, 1.0f, 1}, {1, 777, 4, 1, 256, 0, 4.0f, 1},
      {1, 5000, 8, 2, 64, 0, 4.0f, 1},   {1, 9, 4, 4, 32, 0, 1.0f, 1},
  };
  uint32_t seed = 500;
  for (const AttnCase& c : cases) check_every_kernel(c, bf16_cache(random_attention(c, seed++)), true);
}

// A long prefill from position 0: 3000 queries (47 tiles, the last ragged),
// both plain and peaked scores. Every 7th row is checked, and the last 64.
TEST(Cuda, FlashAttentionLongSequence) {
  SKIP_WITHOUT_DEVICE();
  for (const AttnCase& c : {AttnCase{3000, 0, 4, 2, 128, 0, 1.0f, 7}, AttnCase{3000, 0, 4, 1, 64, 0, 4.0f, 7}}) {
    const AttnData d = random_attention(c, 7);
    const int64_t ldo = c.heads * c.head_dim;
    check_attention(c, d, run_attention(c, d, "flash", ldo), ldo, "flash " + describe(c));
  }
}

// A cache longer than the row-wise kernel's shared memory allows (one
// query's 60000 scores): the flash kernel's shared memory does not depend on
// the length. 100 queries after 59900 cached positions.
TEST(Cuda, FlashAttentionBeyondRowwiseLimit) {
  SKIP_WITHOUT_DEVICE();
  const AttnCase c{100, 59900, 2, 1, 64, 0, 4.0f, 1};
  ASSERT_GT(cuda::rowwise_attention_smem(c.head_dim, c.p0 + c.n), cuda::rowwise_attention_smem_limit());
  const AttnData d = random_attention(c, 9);
  const int64_t ldo = c.heads * c.head_dim;
  check_attention(c, d, run_attention(c, d, "flash", ldo), ldo, "flash " + describe(c));
}

// Decode attention split over the keys: one query at the shapes above plus a
// sliding window, a cache shorter than the number of ranges (empty ranges),
// and a cache far beyond the row-wise kernel's limit (70000 positions).
TEST(Cuda, SplitDecodeAttentionMatchesReference) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<AttnCase> cases = {
      {1, 0, 4, 2, 64, 0, 1.0f, 1},      {1, 3, 8, 2, 128, 0, 4.0f, 1},    {1, 130, 8, 2, 128, 0, 1.0f, 1},
      {1, 2999, 32, 8, 128, 0, 4.0f, 1}, {1, 4000, 6, 3, 128, 100, 1.0f, 1}, {1, 777, 4, 1, 256, 0, 4.0f, 1},
      {1, 69999, 4, 2, 128, 0, 4.0f, 1},
  };
  ASSERT_GT(cuda::rowwise_attention_smem(128, 70000), cuda::rowwise_attention_smem_limit());
  uint32_t seed = 300;
  for (const AttnCase& c : cases) {
    const AttnData d = random_attention(c, seed++);
    const int64_t ldo = c.heads * c.head_dim;
    check_attention(c, d, run_attention(c, d, "split", ldo), ldo, "split " + describe(c));
    // The cluster kernel on the same cases (ranges of a quarter of the keys, some empty at p0 = 0 and 3; its
    // shared memory does not depend on the length, so 70000 positions as well).
    if (cuda::decode_attention_supported(c.head_dim))
      check_attention(c, d, run_attention(c, d, "decode", ldo), ldo, "decode " + describe(c));
    // The kv-shared kernel (a range per SM over the kv heads: empty ranges at short lengths).
    if (cuda::kv_shared_attention_supported(c.head_dim, c.heads, c.kv_heads))
      check_attention(c, d, run_attention(c, d, "shared", ldo), ldo, "shared " + describe(c));
  }
}

// The decode step's fused RoPE (AttentionArgs::rope_qkv): decode_attention
// against rowwise_attention on the same qkv row, q/k norm weights, positions
// and caches: the k and v rows each writes at p0 (one writer block per kv
// head in decode_attention) and the f32 outputs. The two compute the same
// expressions; the scores' summation order and the per-range softmax differ,
// so the outputs agree to fp32 rounding (1e-5 of the largest |out|), the rows
// to 1e-6. On a bf16 cache as well: there each kernel rounds the new key and
// value as it writes them and attends with the rounded row (the row-wise
// kernel reads it back from the cache), so the outputs agree as closely
// (a kernel attending with the unrounded key would be ~1e-3 off at short
// lengths), the value rows are equal and the key rows within a bf16 step.
TEST(Cuda, DecodeAttentionRopeMatchesRowwise) {
  SKIP_WITHOUT_DEVICE();
  if (!cuda::decode_attention_supported(128)) GTEST_SKIP() << "decode_attention needs sm_90";
  struct Case {
    int64_t p0, heads, kv_heads, hd, window;
    bool norms;
  };
  for (const bool bf : {false, true})
  for (const Case c : {Case{0, 8, 2, 128, 0, true}, Case{5, 32, 8, 128, 0, false}, Case{300, 16, 8, 64, 0, true},
                       Case{1000, 4, 4, 256, 0, true}, Case{777, 8, 2, 128, 100, false}, Case{2, 6, 2, 32, 0, true}}) {
    std::mt19937 rng(static_cast<uint32_t>(c.p0 + c.hd));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int64_t H = c.heads, KV = c.kv_heads, hd = c.hd, row = KV * hd, P = c.p0 + 1 + 9;  // spare rows
    std::vector<float> qkv(static_cast<size_t>((H + 2 * KV) * hd)), cache(static_cast<size_t>(P * row));
    std::vector<float> qn(static_cast<size_t>(hd)), kn(qn.size()), inv(static_cast<size_t>(hd / 2));
    for (auto& x : qkv) x = normal(rng);
    for (auto& x : cache) x = bf ? round_to_bf16(normal(rng)) : normal(rng);
    for (auto& x : qn) x = 0.5f + std::fabs(normal(rng));
    for (auto& x : kn) x = 0.5f + std::fabs(normal(rng));
    for (int64_t i = 0; i < hd / 2; ++i)
      inv[static_cast<size_t>(i)] = std::pow(10000.0f, -2.0f * static_cast<float>(i) / static_cast<float>(hd));
    cuda::DeviceBuffer dqkv = cuda::upload(qkv.data(), qkv.size() * 4), dqn = cuda::upload(qn.data(), qn.size() * 4),
                       dkn = cuda::upload(kn.data(), kn.size() * 4), dinv = cuda::upload(inv.data(), inv.size() * 4);
    std::vector<float> out[3], krow[3], vrow[3];
    const bool shared = cuda::kv_shared_attention_supported(hd, H, KV);
    for (int kernel = 0; kernel < (shared ? 3 : 2); ++kernel) {
      std::vector<float> vcache(cache.rbegin(), cache.rend());
      cuda::DeviceBuffer dk = bf ? upload_bf16(cache) : cuda::upload(cache.data(), cache.size() * 4);
      cuda::DeviceBuffer dv = bf ? upload_bf16(vcache) : cuda::upload(vcache.data(), vcache.size() * 4);
      cuda::DeviceBuffer dout(static_cast<size_t>(H * hd) * 4);
      cuda::AttentionArgs a;
      a.k = dk.get();
      a.v = dv.get();
      a.kv_bf16 = bf;
      a.out = dout.get();
      a.out_f32 = true;
      a.rope_qkv = static_cast<const float*>(dqkv.get());
      a.rope_q_norm = c.norms ? static_cast<const float*>(dqn.get()) : nullptr;
      a.rope_k_norm = c.norms ? static_cast<const float*>(dkn.get()) : nullptr;
      a.rope_inv_freq = static_cast<const float*>(dinv.get());
      a.rope_eps = 1e-6f;
      a.ldo = H * hd;
      a.n = 1;
      a.p0 = c.p0;
      a.heads = H;
      a.kv_heads = KV;
      a.head_dim = hd;
      a.window = c.window;
      a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
      cuda::DeviceBuffer scratch(cuda::kv_shared_attention_scratch_bytes(H, KV, hd));
      ASSERT_EQ(cudaMemset(scratch.get(), 0, scratch.bytes()), cudaSuccess);
      if (kernel == 0)
        cuda::rowwise_attention(a, nullptr, P, nullptr);
      else if (kernel == 1)
        cuda::decode_attention(a, nullptr, P, nullptr);
      else
        cuda::kv_shared_attention(a, nullptr, scratch.get(), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      out[kernel].resize(static_cast<size_t>(H * hd));
      ASSERT_EQ(cudaMemcpy(out[kernel].data(), dout.get(), out[kernel].size() * 4, cudaMemcpyDeviceToHost),
                cudaSuccess);
      auto download = [&](const cuda::DeviceBuffer& b) {
        std::vector<float> x(cache.size());
        if (bf) {
          std::vector<uint16_t> raw(x.size());
          EXPECT_EQ(cudaMemcpy(raw.data(), b.get(), raw.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);
          for (size_t i = 0; i < x.size(); ++i) x[i] = bf16_to_f32(raw[i]);
        } else {
          EXPECT_EQ(cudaMemcpy(x.data(), b.get(), x.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
        }
        return x;
      };
      const std::vector<float> kc = download(dk), vc = download(dv);
      // Nothing but row p0 changes.
      for (int64_t t = 0; t < P; ++t)
        if (t != c.p0)
          for (int64_t e = 0; e < row; ++e) {
            ASSERT_EQ(kc[static_cast<size_t>(t * row + e)], cache[static_cast<size_t>(t * row + e)]) << t;
            ASSERT_EQ(vc[static_cast<size_t>(t * row + e)], vcache[static_cast<size_t>(t * row + e)]) << t;
          }
      krow[kernel].assign(kc.begin() + c.p0 * row, kc.begin() + (c.p0 + 1) * row);
      vrow[kernel].assign(vc.begin() + c.p0 * row, vc.begin() + (c.p0 + 1) * row);
    }
    // The value row is the qkv row's v, as the cache holds it.
    for (size_t i = 0; i < vrow[0].size(); ++i) {
      const float v = qkv[static_cast<size_t>((H + KV) * hd) + i];
      ASSERT_EQ(vrow[0][i], bf ? round_to_bf16(v) : v) << i;
    }
    for (int kernel = 1; kernel < (shared ? 3 : 2); ++kernel) {
      double scale = 0, diff = 0, rdiff = 0;
      for (size_t i = 0; i < out[0].size(); ++i) {
        ASSERT_TRUE(std::isfinite(out[kernel][i])) << i;
        scale = std::max(scale, std::fabs(static_cast<double>(out[0][i])));
        diff = std::max(diff, std::fabs(static_cast<double>(out[0][i]) - out[kernel][i]));
      }
      for (size_t i = 0; i < krow[0].size(); ++i) {
        rdiff = std::max(rdiff, std::fabs(static_cast<double>(krow[0][i]) - krow[kernel][i]) /
                                    std::max(1.0, std::fabs(static_cast<double>(krow[0][i]))));
        EXPECT_EQ(vrow[0][i], vrow[kernel][i]) << i;
      }
      const char* name = kernel == 1 ? "decode" : "kv-shared";
      EXPECT_LE(diff, 1e-5 * scale) << name << " p0 " << c.p0 << " hd " << hd << (bf ? " bf16" : "");
      EXPECT_LE(rdiff, bf ? 1.0 / 128 : 1e-6) << name << " p0 " << c.p0 << " hd " << hd << (bf ? " bf16" : "");
      std::printf("[%s attention rope%s] p0 %lld H %lld KV %lld hd %lld: max |Δout| %.3g of %.3g, k row %.3g\n",
                  name, bf ? ", bf16 cache" : "", static_cast<long long>(c.p0), static_cast<long long>(H),
                  static_cast<long long>(KV), static_cast<long long>(hd), diff, scale, rdiff);
    }
  }
}

// flash_attention_bf16 (the calibration forward's tensor-core kernel) against
// float64 attention on the same bf16 inputs: q (already in log2 units, as the
// kernel takes it), k and v rounded to bf16 by the test. Prefill from
// position 0; MHA and GQA; head dims 64 and 128; ragged lengths; a sliding
// window; peaked scores (gain 4). The key and value buffers have NaN rows
// past n and the output NaN padding columns: nothing past the last query's
// key is read, nothing outside the heads' columns written.
//
// Tolerance: check_attention's with bf16_kernel, i.e. 2^-8·|ref| +
// (2^-8 + 1.01·E)·mag, mag = Σ p_t·|v_td| / Σ p_t, E without the rounding of
// q·scale (the test rounds q·scale·log2 e to bf16 itself).
TEST(Cuda, FlashAttentionBf16MatchesReference) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<AttnCase> cases = {
      {1, 0, 4, 2, 64, 0, 1.0f, 1},    {64, 0, 4, 4, 64, 0, 1.0f, 1},     {100, 0, 8, 2, 64, 0, 4.0f, 1},
      {129, 0, 6, 3, 128, 0, 1.0f, 1}, {191, 0, 8, 8, 128, 0, 4.0f, 1},   {150, 0, 6, 3, 128, 50, 1.0f, 1},
      {130, 0, 4, 2, 64, 64, 4.0f, 1}, {2049, 0, 4, 1, 128, 0, 4.0f, 5},  {700, 0, 32, 8, 128, 0, 1.0f, 3},
  };
  uint32_t seed = 500;
  for (const AttnCase& c : cases) {
    const int64_t H = c.heads, KV = c.kv_heads, hd = c.head_dim, row = KV * hd, spare = 70;
    const int64_t ldo = H * hd + 6;
    AttnData d = random_attention(c, seed++);
    const float qs = static_cast<float>(1.4426950408889634 / std::sqrt(static_cast<double>(hd)));
    std::vector<uint16_t> qb(d.q.size()), kb(static_cast<size_t>((c.n + spare) * row), 0xFFFF), vb(kb);
    for (size_t i = 0; i < d.q.size(); ++i) d.q[i] = bf16_to_f32(qb[i] = f32_to_bf16(d.q[i] * qs));
    for (size_t i = 0; i < d.k.size(); ++i) d.k[i] = bf16_to_f32(kb[i] = f32_to_bf16(d.k[i]));
    for (size_t i = 0; i < d.v.size(); ++i) d.v[i] = bf16_to_f32(vb[i] = f32_to_bf16(d.v[i]));
    cuda::DeviceBuffer dq = cuda::upload(qb.data(), qb.size() * 2), dk = cuda::upload(kb.data(), kb.size() * 2),
                       dv = cuda::upload(vb.data(), vb.size() * 2), dout(static_cast<size_t>(c.n * ldo) * 2);
    ASSERT_EQ(cudaMemset(dout.get(), 0xFF, dout.bytes()), cudaSuccess);
    cuda::AttentionBf16Args a;
    a.q = dq.get();
    a.k = dk.get();
    a.v = dv.get();
    a.out = dout.get();
    a.ldo = ldo;
    a.n = c.n;
    a.heads = H;
    a.kv_heads = KV;
    a.head_dim = hd;
    a.window = c.window;
    cuda::flash_attention_bf16(a, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> raw(static_cast<size_t>(c.n * ldo));
    ASSERT_EQ(cudaMemcpy(raw.data(), dout.get(), raw.size() * 2, cudaMemcpyDeviceToHost), cudaSuccess);

    // Padding columns keep the exact 0xFFFF they started as (check_attention
    // sees NaN, which any NaN the kernel wrote would look like).
    for (int64_t i = 0; i < c.n; ++i)
      for (int64_t col = H * hd; col < ldo; ++col)
        ASSERT_EQ(raw[i * ldo + col], 0xFFFF) << describe(c) << ": wrote padding column " << col << " of row " << i;
    std::vector<float> got(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) got[i] = raw[i] == 0xFFFF ? std::nanf("") : bf16_to_f32(raw[i]);
    check_attention(c, d, got, ldo, "flash bf16 " + describe(c), /*bf16_kernel=*/true);
  }
}

// The forward's prefill on tensor cores (flash_attention_tc, GpuOptions::
// tensor_core_prefill): from f32 q and an f32 or bf16 cache, at p0 = 0 and
// after cached positions (chunked prefill), GQA, sliding windows, hd 64 and
// 128, plain and peaked scores. The reference is float64 attention on the
// values the kernel computes with: q·scale·log2(e) (fp32 product) and the
// cache rounded to bf16, as flash_attention_tc rounds them; the bound is
// FlashAttentionBf16MatchesReference's. Cache rows past p0+n are NaN and the
// output's padding columns must stay NaN.
TEST(Cuda, FlashAttentionTensorCoresMatchReference) {
  SKIP_WITHOUT_DEVICE();
  const std::vector<AttnCase> cases = {
      {2, 0, 4, 2, 64, 0, 1.0f, 1},       {64, 0, 4, 4, 64, 0, 1.0f, 1},     {129, 37, 6, 3, 128, 0, 1.0f, 1},
      {77, 300, 32, 8, 128, 0, 4.0f, 1},  {191, 0, 8, 8, 128, 0, 4.0f, 1},   {150, 20, 6, 3, 128, 50, 1.0f, 1},
      {130, 100, 4, 2, 64, 64, 4.0f, 1},  {65, 63, 2, 1, 64, 0, 1.0f, 1},    {700, 1500, 32, 8, 128, 0, 1.0f, 3},
      {1100, 0, 4, 1, 128, 0, 4.0f, 5},
  };
  uint32_t seed = 900;
  for (const AttnCase& c : cases) {
    const int64_t ldo = c.heads * c.head_dim + 6;
    const AttnData d = random_attention(c, seed++);
    AttnData ref = bf16_cache(d);
    const float qs = (1.0f / std::sqrt(static_cast<float>(c.head_dim))) * 1.4426950408889634f;
    for (float& x : ref.q) x = round_to_bf16(x * qs);
    for (const bool kv_bf16 : {false, true}) {
      const auto got = run_attention(c, kv_bf16 ? bf16_cache(d) : d, "tc", ldo, kv_bf16);
      check_attention(c, ref, got, ldo, std::string("tc ") + (kv_bf16 ? "bf16 cache " : "f32 cache ") + describe(c),
                      /*bf16_kernel=*/true);
    }
  }
  // Only a bf16 output, head dims 64 and 128, and no RoPE step or prepared output.
  cuda::AttentionArgs a;
  a.head_dim = 128;
  EXPECT_TRUE(cuda::flash_attention_tc_supported(a));
  a.out_f32 = true;
  EXPECT_FALSE(cuda::flash_attention_tc_supported(a));
  a.out_f32 = false;
  a.head_dim = 256;
  EXPECT_FALSE(cuda::flash_attention_tc_supported(a));
}

// Argument checks come before any CUDA call: this runs without a device too.
TEST(Cuda, FlashAttentionRejectsUnsupportedHeadDim) {
  EXPECT_TRUE(cuda::flash_attention_supported(128));
  EXPECT_FALSE(cuda::flash_attention_supported(8));
  cuda::AttentionArgs a;
  a.n = 4;
  a.heads = a.kv_heads = 1;
  a.head_dim = 96;
  a.ldo = 96;
  EXPECT_NE(test::error_of([&] { cuda::flash_attention(a, nullptr); }).find("head_dim 96"), std::string::npos);
  EXPECT_TRUE(cuda::flash_attention_bf16_supported(64));
  EXPECT_FALSE(cuda::flash_attention_bf16_supported(256));
  cuda::AttentionBf16Args b;
  b.n = 4;
  b.heads = b.kv_heads = 1;
  b.head_dim = 96;
  b.ldo = 96;
  EXPECT_NE(test::error_of([&] { cuda::flash_attention_bf16(b, nullptr); }).find("head_dim 96"), std::string::npos);
}

// Per row: max |Δlogit| and the row's max |logit| (the Cuda.GpuForward* measure).
struct LogitDiff {
  double worst = 0;  // max over rows of max|Δ| / max|logit|
  int agree = 0, rows = 0;
};
void compare_logits(const Tensor& ref, const Tensor& got, double bound, LogitDiff& d, const std::string& what) {
  ASSERT_EQ(ref.shape(), got.shape()) << what;
  const int64_t V = ref.shape()[1];
  for (int64_t r = 0; r < ref.shape()[0]; ++r) {
    const float* x = ref.data<float>() + r * V;
    const float* y = got.data<float>() + r * V;
    double scale = 0, diff = 0;
    for (int64_t j = 0; j < V; ++j) {
      ASSERT_TRUE(std::isfinite(y[j])) << what << " row " << r;
      scale = std::max(scale, std::fabs(static_cast<double>(x[j])));
      diff = std::max(diff, std::fabs(static_cast<double>(x[j]) - y[j]));
    }
    d.worst = std::max(d.worst, diff / scale);
    EXPECT_LE(diff, bound * scale) << what << " row " << r;
    d.agree += std::max_element(x, x + V) - x == std::max_element(y, y + V) - y;
    ++d.rows;
  }
}

// GpuModel prefill of a 1000-token prompt (qwen3-26M: head_dim 64, the flash
// kernel on tensor cores, GpuOptions::tensor_core_prefill; max_position_
// embeddings 1024) against the CPU forward: every position's logits in one
// prefill, then the same tokens as two chunks (600 + 400: the second chunk's
// queries attend to a cache the first wrote), then 8 greedy decode steps
// (decode attention over the flash-prefilled cache). Bounds as
// Cuda.GpuForward*: bf16 linear inputs, so max |Δ| within 3 % of the row's
// largest |logit| and top-1 at >= 97 % of rows; the fp32 flash kernel
// (tensor_core_prefill off) to the same bounds. fp32 flash against row-wise
// prefill on the GPU: the same fp32 attention summed in another order, then
// rounded to bf16 for o_proj; 1 % (as fused vs separate linears in
// Cuda.DecodeGraph*) is far above that and far below a wrong key.
TEST(Cuda, FlashAttentionGpuModelLongPromptMatchesCpu) {
  SKIP_WITHOUT_DEVICE();
  const auto dir = test::model_dir("qwen3-26M-linux");
  auto src = CheckpointDir::open(dir);
  auto cpu = Model::load(*src);
  const ModelConfig& c = cpu->config();
  ASSERT_TRUE(cuda::flash_attention_supported(c.head_dim));
  const int n = 1000, steps = 8;
  std::mt19937 rng(21);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(c.vocab_size) - 1);
  std::vector<int32_t> prompt(n);
  for (auto& t : prompt) t = tok(rng);
  prompt[0] = 1;
  const std::vector<int32_t> first(prompt.begin(), prompt.begin() + 600), second(prompt.begin() + 600, prompt.end());

  ASSERT_TRUE(cuda::flash_attention_bf16_supported(c.head_dim));
  auto gpu = cuda::GpuModel::load(*src, n + steps);
  cuda::GpuOptions fp32_opts, rowwise_opts;
  fp32_opts.tensor_core_prefill = false;
  rowwise_opts.flash_prefill = false;
  auto fp32 = cuda::GpuModel::load(*src, n + steps, fp32_opts);
  auto rowwise = cuda::GpuModel::load(*src, n + steps, rowwise_opts);
  KVCache cache(c, n + steps);
  const Tensor ref = cpu->forward(prompt, cache, true);
  LogitDiff whole, whole_fp32, chunked, vs_rowwise, decode;
  const Tensor got = gpu->forward(prompt, true), got_fp32 = fp32->forward(prompt, true);
  compare_logits(ref, got, 0.03, whole, "prefill 1000");
  compare_logits(ref, got_fp32, 0.03, whole_fp32, "prefill 1000, fp32 flash");
  compare_logits(rowwise->forward(prompt, true), got_fp32, 0.01, vs_rowwise, "fp32 flash vs row-wise prefill");

  gpu->reset();
  cache = KVCache(c, n + steps);
  compare_logits(cpu->forward(first, cache, true), gpu->forward(first, true), 0.03, chunked, "chunk 1 (600)");
  Tensor lc = cpu->forward(second, cache, true), lg = gpu->forward(second, true);
  compare_logits(lc, lg, 0.03, chunked, "chunk 2 (400 after 600)");
  const int64_t V = c.vocab_size;
  for (int step = 0; step < steps; ++step) {
    const float* last = lc.data<float>() + (lc.shape()[0] - 1) * V;
    const auto next = static_cast<int32_t>(std::max_element(last, last + V) - last);
    lc = cpu->forward({next}, cache, false);
    lg = gpu->forward({next}, false);
    compare_logits(lc, lg, 0.03, decode, "decode step " + std::to_string(step));
  }
  EXPECT_GE(whole.agree, whole.rows * 97 / 100);
  EXPECT_GE(whole_fp32.agree, whole_fp32.rows * 97 / 100);
  EXPECT_GE(chunked.agree, chunked.rows * 97 / 100);
  EXPECT_GE(decode.agree, decode.rows * 3 / 4);
  std::printf("[flash prefill] %s n=%d: tensor cores vs CPU worst %.4f top-1 %d/%d (fp32 flash: %.4f, %d/%d); "
              "chunked 600+400 worst %.4f top-1 %d/%d; decode after it worst %.4f top-1 %d/%d; fp32 flash vs "
              "row-wise worst %.2g top-1 %d/%d\n",
              dir.filename().c_str(), n, whole.worst, whole.agree, whole.rows, whole_fp32.worst, whole_fp32.agree,
              whole_fp32.rows, chunked.worst, chunked.agree, chunked.rows, decode.worst, decode.agree, decode.rows,
              vs_rowwise.worst, vs_rowwise.agree, vs_rowwise.rows);
}

}  // namespace
}  // namespace nibble
#endif
