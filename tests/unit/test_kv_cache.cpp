// KV-cache quantization: the schemes' arithmetic worked by hand, the decode
// rule (each query reads rows below the boundary of a cache of p+1 positions
// quantized) against a scalar reference written here from the definitions,
// and a prefill followed by decode steps against feeding tokens one by one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "nibble/dtype.h"
#include "nibble/kv_quant.h"
#include "nibble/model.h"
#include "test_util.h"

namespace nibble {
namespace {

// ---- the schemes --------------------------------------------------------

TEST(KvQuant, BoundaryRule) {
  // R = 128, G = 32: block b (positions 32b .. 32b+31) is quantized once the
  // cache holds 32(b+1) + 128 positions.
  for (const char* name : {"int8", "int4"}) {
    const KvQuantSpec& s = *find_kv_quant(name);
    EXPECT_EQ(s.residual, 128);
    EXPECT_EQ(s.group, 32);
    const std::vector<std::pair<int64_t, int64_t>> cases = {{0, 0},    {1, 0},    {128, 0},  {159, 0},
                                                            {160, 32}, {191, 32}, {192, 64}, {512, 384}};
    for (auto [T, b] : cases) EXPECT_EQ(s.boundary(T), b) << name << " T=" << T;
  }
  const KvQuantSpec& f = *find_kv_quant("fp8_e4m3");
  for (int64_t T : {0, 1, 5, 512}) EXPECT_EQ(f.boundary(T), T);
  EXPECT_EQ(find_kv_quant("none"), nullptr);
  const std::string e = test::error_of([] { find_kv_quant("int2"); });
  for (const KvQuantSpec& k : kv_quants()) EXPECT_NE(e.find(std::string(k.name)), std::string::npos) << e;
  EXPECT_NE(e.find("int2"), std::string::npos) << e;
}

// bf16: every row of the cache at once, each element to the nearest bf16
// (8 significant bits), ties to even; worked by hand. The one scheme the GPU
// holds for real (device_dtype); the others are refused there by name.
TEST(KvQuant, Bf16RoundsEveryRowToNearestEven) {
  const KvQuantSpec& s = *find_kv_quant("bf16");
  for (int64_t T : {0, 1, 7, 512}) EXPECT_EQ(s.boundary(T), T);
  const KvLayout l{1, 6};
  const float u = std::ldexp(1.0f, -7);  // bf16's step in [1, 2)
  // 1 + u/2: a tie between 1 and 1 + u, to the even 1; 1 + 3u/2: between 1 + u
  // and 1 + 2u, to the even 1 + 2u; 1 + u/2 + 2^-20: above the tie, up; -3 and
  // 0.15625 (binary 0.00101) are bf16 values; 65504 (fp16's largest) has 11
  // significant bits, 1.1111111111 x 2^15, and rounds up to 2^16.
  const std::vector<float> row = {1 + u / 2, 1 + 1.5f * u, 1 + u / 2 + std::ldexp(1.0f, -20), -3.0f, 0.15625f, 65504.0f};
  const std::vector<float> want = {1.0f, 1 + 2 * u, 1 + u, -3.0f, 0.15625f, 65536.0f};
  std::vector<float> keys(row), values(row.rbegin(), row.rend());
  KvCacheRows rows(s);
  rows.update(keys.data(), values.data(), 1, l);
  ASSERT_EQ(rows.quantized(), 1);  // no residual: the newest row is held as bf16 too
  EXPECT_EQ(std::vector<float>(rows.keys(0, l), rows.keys(0, l) + 6), want);
  EXPECT_EQ(std::vector<float>(rows.values(0, l), rows.values(0, l) + 6), std::vector<float>(want.rbegin(), want.rend()));
  EXPECT_EQ(kv_device_dtype(nullptr, "x"), DType::F32);
  EXPECT_EQ(kv_device_dtype(&s, "x"), DType::BF16);
  for (const KvQuantSpec& k : kv_quants()) {
    if (k.name == "bf16") continue;
    const std::string e = test::error_of([&] { kv_device_dtype(&k, "run --device cuda"); });
    EXPECT_NE(e.find("run --device cuda: --kv " + std::string(k.name) + " is simulated on the CPU only"),
              std::string::npos)
        << e;
  }
}

TEST(KvQuant, KiviInt4HandWorked) {
  KvQuantSpec s = *find_kv_quant("int4");
  s.residual = 0;
  s.group = 4;  // one block of 4 positions
  const KvLayout l{1, 3};
  // keys [4 positions, 3 channels]; per channel over the block:
  //   ch0 0, 7.5, 8.5, 15: scale 1, codes 0, 8 (tie, even), 8 (tie, even), 15
  //   ch1 constant 2: scale 0, kept exactly
  //   ch2 -1, 14, 6.5, 5.5: min -1, scale 1, quotients 0, 15, 7.5, 6.5 -> 0, 15, 8, 6
  const std::vector<float> keys = {0, 2, -1, 7.5f, 2, 14, 8.5f, 2, 6.5f, 15, 2, 5.5f};
  const std::vector<float> kq = {0, 2, -1, 8, 2, 14, 8, 2, 7, 15, 2, 5};
  // values: per token over the head's 3 channels (one group shorter than 32):
  //   0, 1.1, 15 -> scale 1 -> 0, 1, 15;   3, 3, 3 -> exact
  //   -15, -7.5, 0 -> scale 1, quotient 7.5 -> 8 -> -7;   10, 10.5, 25 -> 0.5 -> 0 -> 10
  const std::vector<float> values = {0, 1.1f, 15, 3, 3, 3, -15, -7.5f, 0, 10, 10.5f, 25};
  const std::vector<float> vq = {0, 1, 15, 3, 3, 3, -15, -7, 0, 10, 10, 25};
  KvCacheRows rows(s);
  rows.update(keys.data(), values.data(), 3, l);  // a cache of 3 positions: no whole block yet
  EXPECT_EQ(rows.quantized(), 0);
  rows.update(keys.data(), values.data(), 4, l);
  ASSERT_EQ(rows.quantized(), 4);
  EXPECT_EQ(std::vector<float>(rows.keys(0, l), rows.keys(0, l) + 12), kq);
  EXPECT_EQ(std::vector<float>(rows.values(0, l), rows.values(0, l) + 12), vq);
}

TEST(KvQuant, KiviValueGroupsAre32ChannelsOfOneHead) {
  KvQuantSpec s = *find_kv_quant("int4");
  s.residual = 0;
  s.group = 1;
  const KvLayout l{2, 40};  // per head: channels 0..31 and 32..39
  std::vector<float> v(80, 0.0f), k(80, 0.0f);
  // Head 0: channels 0..31 span 0..15 in steps of 0.5 (codes tie on .5),
  // channels 32..39 are 100..106 and 115 (a group of its own: scale 1, exact).
  // Head 1: all 7 except one -8 (min -8, max 7: scale 1, exact). Groups that
  // ran across heads (32..63) would mix 100..115 with -8 and lose exactness.
  for (int c = 0; c < 32; ++c) v[c] = 0.5f * static_cast<float>(c % 31);  // 0 .. 15
  for (int c = 32; c < 39; ++c) v[c] = 100.0f + static_cast<float>(c - 32);
  v[39] = 115.0f;
  for (int c = 40; c < 80; ++c) v[c] = 7.0f;
  v[45] = -8.0f;
  KvCacheRows rows(s);
  rows.update(k.data(), v.data(), 1, l);
  const float* q = rows.values(0, l);
  for (int c = 0; c < 32; ++c) EXPECT_EQ(q[c], std::nearbyint(v[c])) << c;  // scale 15/15 = 1
  for (int c = 32; c < 80; ++c) EXPECT_EQ(q[c], v[c]) << c;
}

TEST(KvQuant, Fp8ScaleIsFixedByTheFirstCall) {
  const KvQuantSpec& s = *find_kv_quant("fp8_e4m3");
  const KvLayout l{1, 2};
  // First call (2 positions): key absmax 448 -> scale 1; value absmax 224 -> scale 0.5.
  std::vector<float> keys = {448, -1, 3, 0.3f, 1000, -600};
  std::vector<float> values = {224, 0.3f, 1, -1, 0, 0};
  KvCacheRows rows(s);
  rows.update(keys.data(), values.data(), 2, l);
  EXPECT_EQ(rows.key_scale(), 1.0f);
  EXPECT_EQ(rows.value_scale(), 0.5f);
  ASSERT_EQ(rows.quantized(), 2);
  // 0.3 -> 0.3125 (E4M3 step 1/32 in [0.25, 0.5)); 0.3 / 0.5 = 0.6 -> 0.625 -> 0.3125.
  EXPECT_EQ(std::vector<float>(rows.keys(0, l), rows.keys(0, l) + 4), (std::vector<float>{448, -1, 3, 0.3125f}));
  EXPECT_EQ(std::vector<float>(rows.values(0, l), rows.values(0, l) + 2), (std::vector<float>{224, 0.3125f}));
  // A later row beyond 448 * scale saturates; the scale does not move.
  rows.update(keys.data(), values.data(), 3, l);
  EXPECT_EQ(rows.key_scale(), 1.0f);
  EXPECT_EQ(rows.keys(2, l)[0], 448.0f);
  EXPECT_EQ(rows.keys(2, l)[1], -448.0f);
  rows.clear();
  EXPECT_EQ(rows.quantized(), 0);
}

// ---- one decoder layer against a scalar reference -------------------------

// A small llama layer with plain weights kept for the reference. exact_linears:
// every weight row has one nonzero ±2^k, so a linear's output does not depend
// on how the GEMM orders its sums (M = 1 GEMV and M > 1 GEMM agree bit for
// bit) and prefill and decode can be compared exactly.
struct TinyLayer {
  ModelConfig c;
  DecoderLayer L;
  std::vector<float> inv_freq;
  std::vector<float> wq, wk, wv, wo, wg, wu, wd, in_norm, post_norm;

  TinyLayer(uint64_t seed, bool exact_linears) {
    c.model_type = "llama";
    c.hidden_size = 32;
    c.intermediate_size = 24;
    c.num_layers = 1;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 40;  // value groups of 32 + 8 channels per head
    c.rms_norm_eps = 1e-5;
    c.rope_theta = 10000.0;
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    const int64_t D = c.hidden_size, F = c.intermediate_size, q = c.num_heads * c.head_dim,
                  kv = c.num_kv_heads * c.head_dim;
    auto matrix = [&](int64_t out, int64_t in, float sd) {
      std::vector<float> w(static_cast<size_t>(out * in), 0.0f);
      for (int64_t r = 0; r < out; ++r) {
        if (exact_linears) {
          const float pow2[] = {0.5f, 1.0f, 2.0f};
          w[r * in + (r * 7 + 3 + static_cast<int64_t>(rng() % 5)) % in] = (rng() % 2 ? 1 : -1) * pow2[rng() % 3];
        } else {
          for (int64_t i = 0; i < in; ++i) w[r * in + i] = sd * nd(rng);
        }
      }
      return w;
    };
    wq = matrix(q, D, 0.25f);
    wk = matrix(kv, D, 0.25f);
    wv = matrix(kv, D, 0.5f);
    wo = matrix(D, q, 0.1f);
    wg = matrix(F, D, 0.3f);
    wu = matrix(F, D, 0.3f);
    wd = matrix(D, F, 0.2f);
    for (int64_t i = 0; i < D; ++i) in_norm.push_back(1.0f + 0.1f * nd(rng));
    for (int64_t i = 0; i < D; ++i) post_norm.push_back(1.0f + 0.1f * nd(rng));
    auto t = [](const std::vector<float>& v, Shape s) {
      Tensor x = Tensor::zeros(DType::F32, s);
      std::copy(v.begin(), v.end(), x.data_mut<float>());
      return x;
    };
    L.input_norm = t(in_norm, {D});
    L.post_norm = t(post_norm, {D});
    L.q = LinearWeight::dense(t(wq, {q, D}));
    L.k = LinearWeight::dense(t(wk, {kv, D}));
    L.v = LinearWeight::dense(t(wv, {kv, D}));
    L.o = LinearWeight::dense(t(wo, {D, q}));
    L.gate = LinearWeight::dense(t(wg, {F, D}));
    L.up = LinearWeight::dense(t(wu, {F, D}));
    L.down = LinearWeight::dense(t(wd, {D, F}));
    inv_freq = rope_inv_freq(c);
  }
  int64_t row() const { return c.num_kv_heads * c.head_dim; }

  std::vector<float> input(int64_t T, uint64_t seed) const {
    std::mt19937 rng(static_cast<uint32_t>(seed));
    std::normal_distribution<float> nd(0.0f, 1.0f);
    std::vector<float> x(static_cast<size_t>(T * c.hidden_size));
    for (auto& v : x) v = nd(rng);
    return x;
  }

  // decoder_layer_forward over x[T, D] in calls of the given sizes (summing to
  // T) through one cache; the cache's f32 rows are returned in keys/values.
  std::vector<float> forward(std::vector<float> x, const KvQuantSpec* kv, const std::vector<int64_t>& calls,
                             std::vector<float>* keys = nullptr, std::vector<float>* values = nullptr) const {
    const int64_t T = static_cast<int64_t>(x.size()) / c.hidden_size;
    std::vector<float> k(static_cast<size_t>(T * row())), v(k.size());
    std::optional<KvCacheRows> rows;
    if (kv) rows.emplace(*kv);
    int64_t p0 = 0;
    for (int64_t n : calls) {
      decoder_layer_forward(c, L, inv_freq, x.data() + p0 * c.hidden_size, n, p0, k.data(), v.data(), nullptr,
                            rows ? &*rows : nullptr);
      p0 += n;
    }
    EXPECT_EQ(p0, T);
    if (keys) *keys = k;
    if (values) *values = v;
    return x;
  }
};

// What the reference quantizes: a scheme described independently of the
// library's rows.
struct RefScheme {
  enum Kind { None, Kivi, Fp8 } kind = None;
  int bits = 0;
  int64_t R = 0, G = 1;
};

// Asymmetric min/max fake quantization of one value of a group [lo, hi].
float minmax_fq(float x, float lo, float hi, int bits) {
  const float levels = static_cast<float>((1 << bits) - 1), scale = (hi - lo) / levels;
  if (scale == 0.0f) return x;
  return std::clamp(std::nearbyint((x - lo) / scale), 0.0f, levels) * scale + lo;
}

// The reference layer, in plain loops from the definitions. keys/values are
// the forward's own f32 cache rows (checked against the reference's own
// projections first), so that both sides quantize the same numbers.
std::vector<float> reference_layer(const TinyLayer& t, std::vector<float> x, const std::vector<float>& K,
                                   const std::vector<float>& V, const RefScheme& s) {
  const ModelConfig& c = t.c;
  const int64_t D = c.hidden_size, F = c.intermediate_size, H = c.num_heads, KV = c.num_kv_heads, hd = c.head_dim,
                row = t.row(), T = static_cast<int64_t>(x.size()) / D, half = hd / 2;
  auto rms = [&](const float* in, const std::vector<float>& w, float* out) {
    double ss = 0;
    for (int64_t j = 0; j < D; ++j) ss += static_cast<double>(in[j]) * in[j];
    const double inv = 1.0 / std::sqrt(ss / D + c.rms_norm_eps);
    for (int64_t j = 0; j < D; ++j) out[j] = static_cast<float>(w[j] * (in[j] * inv));
  };
  auto matvec = [](const std::vector<float>& w, const float* in, int64_t out_n, int64_t in_n, float* out) {
    for (int64_t r = 0; r < out_n; ++r) {
      double a = 0;
      for (int64_t i = 0; i < in_n; ++i) a += static_cast<double>(w[r * in_n + i]) * in[i];
      out[r] = static_cast<float>(a);
    }
  };
  auto rope = [&](float* h, int64_t p) {
    for (int64_t i = 0; i < half; ++i) {
      const float inv = static_cast<float>(1.0 / std::pow(c.rope_theta, 2.0 * i / hd));
      const double a = static_cast<double>(static_cast<float>(p) * inv);
      const double x0 = h[i], x1 = h[i + half];
      h[i] = static_cast<float>(x0 * std::cos(a) - x1 * std::sin(a));
      h[i + half] = static_cast<float>(x1 * std::cos(a) + x0 * std::sin(a));
    }
  };
  std::vector<float> xn(D), q(static_cast<size_t>(T * H * hd)), kk(row), vv(row);
  for (int64_t p = 0; p < T; ++p) {
    rms(&x[p * D], t.in_norm, xn.data());
    matvec(t.wq, xn.data(), H * hd, D, &q[p * H * hd]);
    matvec(t.wk, xn.data(), row, D, kk.data());
    matvec(t.wv, xn.data(), row, D, vv.data());
    for (int64_t h = 0; h < H; ++h) rope(&q[(p * H + h) * hd], p);
    for (int64_t h = 0; h < KV; ++h) rope(&kk[h * hd], p);
    for (int64_t j = 0; j < row; ++j) {
      EXPECT_NEAR(kk[j], K[p * row + j], 1e-5 + 1e-5 * std::abs(kk[j])) << "key row " << p;
      EXPECT_NEAR(vv[j], V[p * row + j], 1e-5 + 1e-5 * std::abs(vv[j])) << "value row " << p;
    }
  }
  // fp8: one scale per tensor from the rows of the first (here: the only) call.
  float k_scale = 1, v_scale = 1;
  if (s.kind == RefScheme::Fp8) {
    float km = 0, vm = 0;
    for (int64_t i = 0; i < T * row; ++i) km = std::max(km, std::abs(K[i])), vm = std::max(vm, std::abs(V[i]));
    k_scale = km / 448.0f;
    v_scale = vm / 448.0f;
  }
  std::vector<float> out = x, att(static_cast<size_t>(H * hd)), o(D), g(F), u(F), dn(D);
  std::vector<float> Kp(static_cast<size_t>(T * row)), Vp(Kp.size());
  for (int64_t p = 0; p < T; ++p) {
    // What the query at p reads: a cache of p + 1 positions quantizes rows
    // below floor(max(0, p + 1 - R) / G) * G, computed afresh for every query.
    const int64_t B = s.kind == RefScheme::None ? 0 : std::max<int64_t>(0, p + 1 - s.R) / s.G * s.G;
    for (int64_t j = 0; j <= p; ++j)
      for (int64_t e = 0; e < row; ++e) {
        float kq = K[j * row + e], vq = V[j * row + e];
        if (j < B && s.kind == RefScheme::Kivi) {
          const int64_t b0 = j / s.G * s.G;  // the key's block of G positions, this channel
          float lo = K[b0 * row + e], hi = lo;
          for (int64_t jj = b0; jj < b0 + s.G; ++jj) lo = std::min(lo, K[jj * row + e]), hi = std::max(hi, K[jj * row + e]);
          kq = minmax_fq(kq, lo, hi, s.bits);
          const int64_t head0 = e / hd * hd, c0 = head0 + (e - head0) / 32 * 32,
                        c1 = std::min(c0 + 32, head0 + hd);  // the value's group of channels
          lo = hi = V[j * row + c0];
          for (int64_t cc = c0; cc < c1; ++cc) lo = std::min(lo, V[j * row + cc]), hi = std::max(hi, V[j * row + cc]);
          vq = minmax_fq(vq, lo, hi, s.bits);
        } else if (j < B && s.kind == RefScheme::Fp8) {
          kq = f8_e4m3_to_f32(f32_to_f8_e4m3(kq / k_scale)) * k_scale;
          vq = f8_e4m3_to_f32(f32_to_f8_e4m3(vq / v_scale)) * v_scale;
        }
        Kp[j * row + e] = kq;
        Vp[j * row + e] = vq;
      }
    for (int64_t h = 0; h < H; ++h) {
      const int64_t kvh = h / (H / KV);
      std::vector<double> w(static_cast<size_t>(p + 1));
      double mx = -1e300, sum = 0;
      for (int64_t j = 0; j <= p; ++j) {
        double d = 0;
        for (int64_t e = 0; e < hd; ++e) d += static_cast<double>(q[(p * H + h) * hd + e]) * Kp[j * row + kvh * hd + e];
        w[j] = d / std::sqrt(static_cast<double>(hd));
        mx = std::max(mx, w[j]);
      }
      for (int64_t j = 0; j <= p; ++j) sum += (w[j] = std::exp(w[j] - mx));
      for (int64_t e = 0; e < hd; ++e) {
        double a = 0;
        for (int64_t j = 0; j <= p; ++j) a += w[j] / sum * Vp[j * row + kvh * hd + e];
        att[h * hd + e] = static_cast<float>(a);
      }
    }
    float* xp = &out[p * D];
    matvec(t.wo, att.data(), D, H * hd, o.data());
    for (int64_t j = 0; j < D; ++j) xp[j] += o[j];
    rms(xp, t.post_norm, xn.data());
    matvec(t.wg, xn.data(), F, D, g.data());
    matvec(t.wu, xn.data(), F, D, u.data());
    for (int64_t j = 0; j < F; ++j) g[j] = static_cast<float>(g[j] / (1.0 + std::exp(-static_cast<double>(g[j]))) * u[j]);
    matvec(t.wd, g.data(), D, F, dn.data());
    for (int64_t j = 0; j < D; ++j) xp[j] += dn[j];
  }
  return out;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b, int64_t from = 0) {
  double m = 0;
  for (size_t i = static_cast<size_t>(from); i < a.size(); ++i) m = std::max(m, std::abs(static_cast<double>(a[i]) - b[i]));
  return m;
}

struct RefCase {
  const char* name;
  KvQuantSpec spec;
  RefScheme ref;
  int64_t T;
};

std::vector<RefCase> reference_cases() {
  KvQuantSpec small = *find_kv_quant("int4");  // the rule with R = 16, G = 8 on a short sequence
  small.residual = 16;
  small.group = 8;
  return {
      {"int4", *find_kv_quant("int4"), {RefScheme::Kivi, 4, 128, 32}, 230},
      {"int8", *find_kv_quant("int8"), {RefScheme::Kivi, 8, 128, 32}, 230},
      {"int4_R16_G8", small, {RefScheme::Kivi, 4, 16, 8}, 70},
      {"fp8_e4m3", *find_kv_quant("fp8_e4m3"), {RefScheme::Fp8, 8, 0, 1}, 70},
  };
}

TEST(KvQuantLayer, MatchesTheScalarReference) {
  const TinyLayer t(11, false);
  for (const RefCase& rc : reference_cases()) {
    SCOPED_TRACE(rc.name);
    const std::vector<float> x = t.input(rc.T, 5);
    std::vector<float> K, V;
    const std::vector<float> got = t.forward(x, &rc.spec, {rc.T}, &K, &V);
    const std::vector<float> want = reference_layer(t, x, K, V, rc.ref);
    const std::vector<float> exact = reference_layer(t, x, K, V, RefScheme{});
    // 2e-5: fp32 forward vs a reference accumulating in double, on outputs of
    // magnitude ~3 (the unquantized layer agrees to ~2e-6).
    EXPECT_LT(max_abs_diff(got, want), 2e-5);
    // Not vacuous: the quantized cache moved the outputs well past that.
    EXPECT_GT(max_abs_diff(want, exact), 2e-4);
    // The positions whose queries read no quantized row are untouched.
    const int64_t first = rc.ref.kind == RefScheme::Fp8 ? 0 : rc.ref.R + rc.ref.G - 1;
    EXPECT_LT(max_abs_diff(std::vector<float>(got.begin(), got.begin() + first * t.c.hidden_size),
                           std::vector<float>(exact.begin(), exact.begin() + first * t.c.hidden_size)),
              2e-5);
  }
}

TEST(KvQuantLayer, PrefillThenDecodeEqualsTokenByToken) {
  const TinyLayer t(3, /*exact_linears=*/true);
  KvQuantSpec small = *find_kv_quant("int4");
  small.residual = 16;
  small.group = 8;
  const int64_t T = 200;
  const std::vector<float> x = t.input(T, 9);
  for (const KvQuantSpec* s : {find_kv_quant("int4"), find_kv_quant("int8"), static_cast<const KvQuantSpec*>(&small),
                               static_cast<const KvQuantSpec*>(nullptr)}) {
    SCOPED_TRACE(s ? s->name : "none");
    const std::vector<float> prefill = t.forward(x, s, {T});
    std::vector<int64_t> ones(T, 1), mixed = {150};
    for (int i = 0; i < 50; ++i) mixed.push_back(1);
    std::vector<int64_t> chunks = {37, 29, 29, 29, 29, 29, 18};
    EXPECT_EQ(t.forward(x, s, ones), prefill);
    EXPECT_EQ(t.forward(x, s, mixed), prefill);
    EXPECT_EQ(t.forward(x, s, chunks), prefill);
  }
  // The comparison sees quantization: int4 rows moved positions past the residual.
  EXPECT_GT(max_abs_diff(t.forward(x, find_kv_quant("int4"), {T}), t.forward(x, nullptr, {T})), 1e-4);
  // fp8 fixes its scale at the first call: equal whenever the first call is.
  const KvQuantSpec* f = find_kv_quant("fp8_e4m3");
  std::vector<int64_t> after10 = {10};
  for (int i = 0; i < 190; ++i) after10.push_back(1);
  EXPECT_EQ(t.forward(x, f, {10, 90, 100}), t.forward(x, f, after10));
}

TEST(KvQuantLayer, TheResidualWindowIsExact) {
  const TinyLayer t(21, false);
  for (const char* name : {"int8", "int4"}) {
    SCOPED_TRACE(name);
    const KvQuantSpec* s = find_kv_quant(name);
    // Up to 159 positions no block has 128 newer positions after it: bit for bit the exact cache.
    for (int64_t T : {1, 100, 128, 159}) {
      const std::vector<float> x = t.input(T, 4);
      EXPECT_EQ(t.forward(x, s, {T}), t.forward(x, nullptr, {T})) << T;
    }
    // At 160 the query at 159 is the first to read block 0 quantized.
    const std::vector<float> x = t.input(160, 4);
    const std::vector<float> a = t.forward(x, s, {160}), b = t.forward(x, nullptr, {160});
    const int64_t D = t.c.hidden_size;
    EXPECT_TRUE(std::equal(a.begin(), a.begin() + 159 * D, b.begin()));
    EXPECT_GT(max_abs_diff(a, b, 159 * D), 0.0);
  }
}

TEST(KvQuantLayer, Int8ErrorIsFarBelowInt4) {
  const TinyLayer t(17, false);
  const int64_t T = 400;
  const std::vector<float> x = t.input(T, 8);
  const std::vector<float> exact = t.forward(x, nullptr, {T});
  auto err = [&](const char* name) {
    const std::vector<float> y = t.forward(x, find_kv_quant(name), {T});
    double e = 0, r = 0;
    for (size_t i = 0; i < y.size(); ++i) e += (y[i] - exact[i]) * (y[i] - exact[i]), r += (exact[i] - x[i]) * (exact[i] - x[i]);
    return e / r;  // relative to what the layer adds
  };
  const double e8 = err("int8"), e4 = err("int4"), ef = err("fp8_e4m3");
  EXPECT_GT(e8, 0.0);
  // 4 more bits: 16x finer steps, ~256x less squared error; ask for 50x.
  EXPECT_LT(e8 * 50, e4);
  EXPECT_GT(ef, 0.0);
}

// ---- the whole model ----------------------------------------------------

TEST(KvQuantModel, PrefillThenDecodeMatchesTokenByTokenOnStories260K) {
  auto model = Model::load(*CheckpointDir::open(test::model_dir("stories260K")));
  std::vector<int32_t> ids;
  for (int i = 0; i < 300; ++i) ids.push_back(static_cast<int32_t>(1 + (i * 37 + i / 7) % 500));
  const int64_t V = model->config().vocab_size, T = static_cast<int64_t>(ids.size());
  for (const char* name : {"int4", "int8"}) {
    SCOPED_TRACE(name);
    KVCache prefill_cache(model->config(), T, find_kv_quant(name)), step_cache(model->config(), T, find_kv_quant(name));
    // Prefill 250 positions, then 50 decode steps; against 300 single steps.
    std::vector<float> a;
    const Tensor p = model->forward(std::vector<int32_t>(ids.begin(), ids.begin() + 250), prefill_cache);
    a.assign(p.data<float>(), p.data<float>() + p.numel());
    for (int64_t i = 250; i < T; ++i) {
      const Tensor r = model->forward({ids[i]}, prefill_cache);
      a.insert(a.end(), r.data<float>(), r.data<float>() + V);
    }
    std::vector<float> b;
    for (int64_t i = 0; i < T; ++i) {
      const Tensor r = model->forward({ids[i]}, step_cache);
      b.insert(b.end(), r.data<float>(), r.data<float>() + V);
    }
    // 1e-4 as the exact cache's prefill-vs-steps test (tests/golden): GEMV and
    // GEMM round differently, nothing else differs.
    EXPECT_LT(max_abs_diff(a, b), 1e-4);
    // and the quantized cache changed the logits of the late positions
    KVCache exact(model->config(), T);
    const Tensor e = model->forward(ids, exact);
    EXPECT_GT(max_abs_diff(a, std::vector<float>(e.data<float>(), e.data<float>() + e.numel())), 1e-3);
    // clear() empties the quantized rows too: the same prompt gives the same logits.
    prefill_cache.clear();
    const Tensor again = model->forward(std::vector<int32_t>(ids.begin(), ids.begin() + 250), prefill_cache);
    EXPECT_TRUE(std::equal(p.data<float>(), p.data<float>() + p.numel(), again.data<float>()));
  }
}

}  // namespace
}  // namespace nibble
