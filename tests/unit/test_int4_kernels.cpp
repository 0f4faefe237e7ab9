// The fast int4_asym GEMV/GEMM kernels (src/backend/cpu/int4_*.cpp) against the
// scalar reference gemm_int4_asym_ref, for every ISA this CPU can run: a worked
// example computed by hand, integer-valued data where every ISA must be bit exact,
// and a sweep over M = 1..16 (and tiles beyond), ragged and odd K, odd N, G = 32/64/128.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <random>
#include <vector>

#include "backend/cpu/kernels.h"
#include "unit/cpu_isas.h"
#include "nibble/dtype.h"
#include "nibble/error.h"

namespace nibble {
namespace {

using cpu::Isa;

using test::isas_to_test;

// One packed matrix [N, K] with group size G, as FORMAT.md §3 stores it, or
// with fp32 scales and mins (§7.8's int4_asym_f32) where scales32 is filled.
struct Packed {
  int64_t N, K;
  int G;
  std::vector<uint8_t> qweight;  // [N, ceil(K/2)]
  std::vector<uint16_t> scales;  // [N, ceil(K/G)] bf16
  std::vector<uint16_t> mins;    // [N, ceil(K/G)] bf16
  std::vector<float> scales32 = {}, mins32 = {};  // [N, ceil(K/G)] fp32, used instead where not empty
  bool f32() const { return !scales32.empty(); }
  int64_t groups() const { return (K + G - 1) / G; }
  int code(int64_t n, int64_t i) const {
    const uint8_t b = qweight[static_cast<size_t>(n * ((K + 1) / 2) + i / 2)];
    return (i & 1) ? b >> 4 : b & 0xF;
  }
  float scale(int64_t n, int64_t i) const {
    const size_t g = static_cast<size_t>(n * groups() + i / G);
    return f32() ? scales32[g] : bf16_to_f32(scales[g]);
  }
  float min(int64_t n, int64_t i) const {
    const size_t g = static_cast<size_t>(n * groups() + i / G);
    return f32() ? mins32[g] : bf16_to_f32(mins[g]);
  }
};

std::vector<float> run(Isa isa, const std::vector<float>& x, int64_t M, const Packed& w) {
  std::vector<float> y(static_cast<size_t>(M * w.N), std::nanf(""));
  if (w.f32())
    cpu::gemm_int4_asym_isa(isa, x.data(), M, w.qweight.data(), w.scales32.data(), w.mins32.data(), w.N, w.K, w.G,
                            y.data());
  else
    cpu::gemm_int4_asym_isa(isa, x.data(), M, w.qweight.data(), w.scales.data(), w.mins.data(), w.N, w.K, w.G,
                            y.data());
  return y;
}

std::vector<float> run_ref(const std::vector<float>& x, int64_t M, const Packed& w) {
  std::vector<float> y(static_cast<size_t>(M * w.N), std::nanf(""));
  if (w.f32())
    cpu::gemm_int4_asym_ref(x.data(), M, w.qweight.data(), w.scales32.data(), w.mins32.data(), w.N, w.K, w.G,
                            y.data());
  else
    cpu::gemm_int4_asym_ref(x.data(), M, w.qweight.data(), w.scales.data(), w.mins.data(), w.N, w.K, w.G, y.data());
  return y;
}

// The dispatching entry point (gemm_int4_asym) on either parameter type.
std::vector<float> run_any(const std::vector<float>& x, int64_t M, const Packed& w) {
  std::vector<float> y(static_cast<size_t>(M * w.N), std::nanf(""));
  if (w.f32())
    cpu::gemm_int4_asym(x.data(), M, w.qweight.data(), w.scales32.data(), w.mins32.data(), w.N, w.K, w.G, y.data());
  else
    cpu::gemm_int4_asym(x.data(), M, w.qweight.data(), w.scales.data(), w.mins.data(), w.N, w.K, w.G, y.data());
  return y;
}

// FORMAT.md's worked example: W = [[-1, 0, 0.5, 2]] packs to qweight [0x50, 0xF7],
// scale 0x3E4D (0.2001953125), min 0xBF80 (-1), and decodes to
// w' = [-1, 0.0009765625, 0.4013671875, 2.0029296875]. Every value below is a
// multiple of 2^-10 well inside fp32's range, so each product and partial sum is
// exact and every ISA must give exactly:
//   x = [1, 2, 3, 4]:    -1 + 0.001953125 + 1.2041015625 + 8.01171875 = 8.2177734375
//   x = [0.5, -1, 0, 2]: -0.5 - 0.0009765625 + 0 + 4.005859375       = 3.5048828125
TEST(Int4Kernel, WorkedExampleByHand) {
  const Packed w{1, 4, 32, {0x50, 0xF7}, {0x3E4D}, {0xBF80}};
  const std::vector<float> x = {1, 2, 3, 4, 0.5f, -1, 0, 2};
  for (Isa isa : isas_to_test()) {
    SCOPED_TRACE(cpu::isa_name(isa));
    const auto y = run(isa, x, 2, w);
    EXPECT_EQ(y[0], 8.2177734375f);
    EXPECT_EQ(y[1], 3.5048828125f);
    const auto y1 = run(isa, x, 1, w);  // the M = 1 (GEMV) path
    EXPECT_EQ(y1[0], 8.2177734375f);
  }
}

// Odd K: with K = 3 the high nibble of the last byte (here 0xF) is padding and
// must be ignored: x = [1, 2, 3] gives -1 + 0.001953125 + 1.2041015625 = 0.2060546875.
TEST(Int4Kernel, WorkedExampleOddKIgnoresPaddingNibble) {
  const Packed w{1, 3, 32, {0x50, 0xF7}, {0x3E4D}, {0xBF80}};
  const std::vector<float> x = {1, 2, 3};
  for (Isa isa : isas_to_test()) {
    SCOPED_TRACE(cpu::isa_name(isa));
    EXPECT_EQ(run(isa, x, 1, w)[0], 0.2060546875f);
  }
}

std::mt19937_64& rng() {
  static std::mt19937_64 r(20240607);
  return r;
}

// Random codes (including the padding nibble of odd rows, which must not matter),
// bf16 scales in [1e-3, 5e-2] and mins around -8·scale (groups straddling zero,
// as RTN makes them), with an occasional positive min.
Packed random_packed(int64_t N, int64_t K, int G) {
  Packed w{N, K, G, {}, {}, {}};
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  w.qweight.resize(static_cast<size_t>(N * ((K + 1) / 2)));
  for (auto& b : w.qweight) b = static_cast<uint8_t>(byte(rng()));
  w.scales.resize(static_cast<size_t>(N * w.groups()));
  w.mins.resize(w.scales.size());
  for (size_t i = 0; i < w.scales.size(); ++i) {
    const float s = 1e-3f + 4.9e-2f * u(rng());
    w.scales[i] = f32_to_bf16(s);
    w.mins[i] = f32_to_bf16(u(rng()) < 0.1f ? s * u(rng()) : -8.0f * s * (0.5f + u(rng())));
  }
  return w;
}

// The same codes with fp32 parameters that bf16 cannot hold: each bf16 scale and
// min times (1 + u·2^-9), u uniform in [0, 1), so their low mantissa bits are set
// and fl(code·s) rounds (the kernels must then not fuse it into an FMA's one rounding).
Packed with_f32_params(Packed w) {
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (size_t i = 0; i < w.scales.size(); ++i) {
    w.scales32.push_back(bf16_to_f32(w.scales[i]) * (1.0f + u(rng()) * 0x1p-9f));
    w.mins32.push_back(bf16_to_f32(w.mins[i]) * (1.0f + u(rng()) * 0x1p-9f));
  }
  return w;
}

// Activations ~ N(0, 1) with a few 30x outliers, as LLM hidden states have.
std::vector<float> random_x(int64_t M, int64_t K) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(M * K));
  for (auto& v : x) v = nd(rng()) * (u(rng()) < 0.01f ? 30.0f : 1.0f);
  return x;
}

// The tolerance, derived. Let u = 2^-24 (fp32 unit roundoff) and γ_n = n·u/(1 - n·u).
// The reference computes Σ_i fl(x_i·w_i) left to right with w_i decoded exactly, so
// |ref - exact| ≤ γ_K·Σ|x_i·w_i| (Higham, Accuracy and Stability, §3.1). The fast
// kernels sum the same products in another order (vector lanes, per-group partial
// sums, a horizontal add of ≤ 16 lanes, ≤ ceil(K/1024) K-block partials), so each
// rounding error is still bounded by u times a partial sum of |terms|, along a chain
// of at most n = K + NG + ceil(K/1024) + 16 additions. The AVX2 M = 1 kernel
// computes s·Σ code_i·x_i + m·Σ x_i per group, i.e. it sums the terms code_i·s·x_i
// and m·x_i separately, whose magnitudes add up to
//   T = Σ_i |x_i|·(|code_i·s| + |m|) ≥ Σ_i |x_i·w_i|   (more when code_i·s and m cancel).
// So for every kernel |kernel - exact| ≤ γ_n·T, and |kernel - ref| ≤ 2·γ_n·T.
// That is a worst-case bound (typical errors are ~√K·u·T); a wrong nibble, group or
// padding shows up far above it for small K, and the integer test below checks
// single elements at every K. abs = 1e-30 only absorbs underflow noise (no value
// here is near the subnormals).
// The AVX2 GEMV (M = 1) computes with x rounded to 24-bit fixed point per
// group, |Δx_i| ≤ max_{j in i's group} |x_j| · 2^-23 (int4_isa.h, QActivations), which
// moves the code term by at most A = Σ_i |code_i·s|·max_group|x|·2^-23; the min term
// uses the exact Σx. Its tolerance is the one above plus A (plus γ·A for the rounding
// of that term itself).
// Per output: the tolerance above, abs + 2·γ·T with T from the decoded parts.
std::vector<double> tolerances(const Packed& w, int64_t M, const std::vector<float>& x, bool act24 = false) {
  std::vector<double> cs(static_cast<size_t>(w.N * w.K)), mn(cs.size());  // |code·s|, |m| per weight
  for (int64_t n = 0; n < w.N; ++n)
    for (int64_t i = 0; i < w.K; ++i) {
      cs[static_cast<size_t>(n * w.K + i)] = std::abs(static_cast<double>(w.code(n, i)) * w.scale(n, i));
      mn[static_cast<size_t>(n * w.K + i)] = std::abs(static_cast<double>(w.min(n, i)));
    }
  const double nu = static_cast<double>(w.K + w.groups() + (w.K + 1023) / 1024 + 16) * 0x1p-24;
  const double rel = 2.0 * nu / (1.0 - nu);
  std::vector<double> tol(static_cast<size_t>(M * w.N));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < w.N; ++n) {
      double t = 0, act = 0;
      for (int64_t i = 0; i < w.K; ++i)
        t += std::abs(static_cast<double>(x[static_cast<size_t>(m * w.K + i)])) *
             (cs[static_cast<size_t>(n * w.K + i)] + mn[static_cast<size_t>(n * w.K + i)]);
      if (act24)
        for (int64_t g = 0; g < w.groups(); ++g) {
          const int64_t i0 = g * w.G, i1 = std::min<int64_t>(w.K, i0 + w.G);
          double amax = 0, c = 0;
          for (int64_t i = i0; i < i1; ++i) {
            amax = std::max(amax, std::abs(static_cast<double>(x[static_cast<size_t>(m * w.K + i)])));
            c += cs[static_cast<size_t>(n * w.K + i)];
          }
          act += c * amax * 0x1p-23;
        }
      tol[static_cast<size_t>(m * w.N + n)] = 1e-30 + rel * t + (1.0 + rel) * act;
    }
  return tol;
}

// Every supported ISA against the reference on one problem.
void expect_close(const Packed& w, int64_t M, const std::vector<float>& x) {
  const auto ref = run_ref(x, M, w);
  const auto tol32 = tolerances(w, M, x), tol24 = tolerances(w, M, x, /*act24=*/true);
  for (Isa isa : isas_to_test()) {
    const auto got = run(isa, x, M, w);
    const auto& tol = M == 1 && cpu::gemv_is_integer(isa) ? tol24 : tol32;
    for (size_t i = 0; i < ref.size(); ++i)
      ASSERT_LE(std::abs(static_cast<double>(got[i]) - ref[i]), tol[i])
          << cpu::isa_name(isa) << " M=" << M << " N=" << w.N << " K=" << w.K << " G=" << w.G << " at m="
          << static_cast<int64_t>(i) / w.N << " n=" << static_cast<int64_t>(i) % w.N << ": got " << got[i]
          << ", reference " << ref[i];
  }
}

TEST(Int4Kernel, MatchesReferenceSweep) {
  for (int G : {32, 64, 128})
    for (int64_t K : {int64_t{64}, int64_t{172}, int64_t{173}, int64_t{4096}})
      for (int64_t N : {int64_t{1}, int64_t{7}, int64_t{33}}) {
        const Packed w = random_packed(N, K, G);
        for (int64_t M = 1; M <= 16; ++M) {
          expect_close(w, M, random_x(M, K));
        }
      }
}

// fp32 parameters (int4_asym_f32; int4_sym once prepared): the same kernels against the same reference.
TEST(Int4Kernel, MatchesReferenceSweepWithF32Params) {
  for (int G : {32, 64, 128})
    for (int64_t K : {int64_t{64}, int64_t{173}, int64_t{4096}})
      for (int64_t N : {int64_t{7}, int64_t{33}}) {
        const Packed w = with_f32_params(random_packed(N, K, G));
        for (int64_t M : {1, 2, 3, 4, 5, 8, 13}) expect_close(w, M, random_x(M, K));
      }
  struct Case {
    int64_t M, N, K;
    int G;
  };
  for (const Case& c : {Case{1, 515, 9000, 128}, Case{17, 66, 300, 32}, Case{40, 37, 515, 64}})
    expect_close(with_f32_params(random_packed(c.N, c.K, c.G)), c.M, random_x(c.M, c.K));
}

// Shapes that exercise the driver: several K blocks (M = 1 blocks K by 4096, M > 1
// by 1024), many rows split into tasks with a short last one, M in tiles of 4 with
// every remainder, and prefill-sized M.
TEST(Int4Kernel, MatchesReferenceBlockedAndTiled) {
  struct Case {
    int64_t M, N, K;
    int G;
  };
  for (const Case& c : {Case{1, 515, 9000, 128}, Case{3, 258, 1100, 64}, Case{16, 130, 1537, 32},
                        Case{17, 66, 300, 128}, Case{31, 45, 2100, 64}, Case{32, 9, 97, 32}, Case{33, 70, 173, 32},
                        Case{40, 37, 515, 64}, Case{64, 40, 4096, 128}})
    expect_close(random_packed(c.N, c.K, c.G), c.M, random_x(c.M, c.K));
}

// From 64 rows on, gemm_int4_asym decodes W and runs the dense GEMM: the bits of gemm_f32 on the dequantized matrix
// (decoded here by FORMAT.md's formula), including N past one slice of decoded rows (K = 65536: 256 rows a slice)
// and a ragged last group; within the fp32 tolerance of the reference. Below 64 rows it is the int4 kernel.
TEST(Int4Kernel, ManyRowsRunTheDenseGemmOnTheDecodedWeights) {
  struct Case {
    int64_t M, N, K;
    int G;
    bool f32 = false;  // fp32 parameters
  };
  for (const Case& c : {Case{64, 300, 173, 32}, Case{300, 257, 1100, 128}, Case{70, 600, 65536, 64},
                        Case{100, 130, 1100, 32, true}}) {
    SCOPED_TRACE("M=" + std::to_string(c.M) + " N=" + std::to_string(c.N) + " K=" + std::to_string(c.K) +
                 (c.f32 ? " f32" : ""));
    const int64_t M = c.M;
    const Packed w = c.f32 ? with_f32_params(random_packed(c.N, c.K, c.G)) : random_packed(c.N, c.K, c.G);
    const std::vector<float> x = random_x(M, c.K);
    std::vector<float> dense(static_cast<size_t>(c.N * c.K)), want(static_cast<size_t>(M * c.N)),
        got(want.size(), std::nanf(""));
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t i = 0; i < c.K; ++i)
        dense[static_cast<size_t>(n * c.K + i)] = static_cast<float>(w.code(n, i)) * w.scale(n, i) + w.min(n, i);
    cpu::gemm_f32(x.data(), M, dense.data(), c.N, c.K, want.data());
    got = run_any(x, M, w);
    EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0);
    if (c.K <= 2048) {
      const auto ref = run_ref(x, M, w);
      const auto tol = tolerances(w, M, x);
      for (size_t i = 0; i < ref.size(); ++i) ASSERT_LE(std::abs(static_cast<double>(got[i]) - ref[i]), tol[i]) << i;
    }
  }
}

// Every supported ISA equals `ref` bit for bit on one problem.
void expect_every_isa_bit_exact(const std::vector<float>& x, int64_t M, const Packed& w, const std::vector<float>& ref) {
  for (Isa isa : isas_to_test()) {
    const auto got = run(isa, x, M, w);
    for (size_t i = 0; i < ref.size(); ++i)
      ASSERT_EQ(got[i], ref[i]) << cpu::isa_name(isa) << " M=" << M << " K=" << w.K << " G=" << w.G << " i=" << i;
  }
}

// Integer-valued data: x_i ∈ [-8, 8], scales powers of two, mins small integers.
// Then every decoded weight, product and partial sum is an integer (or a multiple of
// 1/4) far below 2^24, so fp32 arithmetic is exact in any order and every ISA must
// equal the reference bit for bit — a missing or misplaced single weight (padding
// nibble, ragged group, tail chunk) cannot hide inside a tolerance.
TEST(Int4Kernel, BitExactOnIntegerValuedData) {
  std::uniform_int_distribution<int> small(-8, 8), pow2(-2, 1), mn(-8, 0);
  for (int G : {32, 64, 128}) {
    for (int64_t K : {int64_t{1}, int64_t{31}, int64_t{33}, int64_t{173}, int64_t{300}, int64_t{4096}}) {
      for (int64_t M : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{16}, int64_t{19}, int64_t{40}}) {
        Packed w = random_packed(9, K, G);
        for (auto& s : w.scales) s = f32_to_bf16(std::ldexp(1.0f, pow2(rng())));
        for (auto& m : w.mins) m = f32_to_bf16(static_cast<float>(mn(rng())));
        std::vector<float> x(static_cast<size_t>(M * K));
        for (auto& v : x) v = static_cast<float>(small(rng()));
        const auto ref = run_ref(x, M, w);
        ASSERT_NO_FATAL_FAILURE(expect_every_isa_bit_exact(x, M, w, ref));
      }
    }
  }
}

// The same with fp32 scales of 9 significant bits (257/256 and 257/128, which bf16
// cannot hold) and K ≤ 300: each decoded weight is a multiple of 2^-8 below 24 in
// magnitude, each product and partial sum a multiple of 2^-8 below 2^16, so fp32
// still holds every step exactly, and fl(code·s) (exact) needs no rounding.
TEST(Int4Kernel, BitExactOnIntegerValuedDataWithF32Params) {
  std::uniform_int_distribution<int> small(-8, 8), pick(0, 1), mn(-8, 0);
  for (int G : {32, 64, 128})
    for (int64_t K : {int64_t{1}, int64_t{33}, int64_t{173}, int64_t{300}})
      for (int64_t M : {int64_t{1}, int64_t{2}, int64_t{5}, int64_t{16}, int64_t{19}, int64_t{70}}) {
        Packed w = random_packed(9, K, G);
        for (size_t i = 0; i < w.scales.size(); ++i) {
          w.scales32.push_back(pick(rng()) ? 257.0f / 256.0f : 257.0f / 128.0f);
          w.mins32.push_back(static_cast<float>(mn(rng())));
        }
        ASSERT_NE(bf16_to_f32(f32_to_bf16(w.scales32[0])), w.scales32[0]);
        std::vector<float> x(static_cast<size_t>(M * K));
        for (auto& v : x) v = static_cast<float>(small(rng()));
        const auto ref = run_ref(x, M, w);
        ASSERT_NO_FATAL_FAILURE(expect_every_isa_bit_exact(x, M, w, ref));
        EXPECT_EQ(run_any(x, M, w), ref) << "M=" << M << " K=" << K << " G=" << G;
      }
}

// The AVX2 GEMV's fixed-point step d_g = 2^e follows each group's largest |x|:
// groups of tiny (down to subnormal) and huge values, and a group whose values span
// 2^40, must stay within the derived bound; an all-zero group contributes only m·0.
TEST(Int4Kernel, GemvHandlesExtremeActivationScales) {
  for (int G : {32, 128}) {
    const int64_t K = 4 * 128 + 40;
    const Packed w = random_packed(11, K, G);
    std::vector<float> x = random_x(1, K);
    for (int64_t i = 0; i < K; ++i) {
      const int64_t g = i / G;
      if (g % 4 == 0) x[i] *= 1e-39f;               // subnormal
      if (g % 4 == 1) x[i] *= 1e30f;                // huge
      if (g % 4 == 2) x[i] = (i % 7 == 0) ? 0.0f : x[i] * std::ldexp(1.0f, static_cast<int>(i % 41) - 20);
    }
    for (int64_t i = 3 * G; i < std::min<int64_t>(K, 4 * G); ++i) x[i] = 0.0f;  // an all-zero group
    expect_close(w, 1, x);
    expect_close(with_f32_params(w), 1, x);  // the same with fp32 pairs
  }
}

TEST(Int4Kernel, GemvRejectsNonFiniteActivations) {
  const Packed w = random_packed(3, 300, 64);
  for (float bad : {std::nanf(""), INFINITY}) {
    std::vector<float> x = random_x(1, 300);
    x[150] = bad;
    std::vector<float> y(3);
    for (Isa isa : isas_to_test())
      if (cpu::gemv_is_integer(isa)) {
        EXPECT_THROW(cpu::gemm_int4_asym_isa(isa, x.data(), 1, w.qweight.data(), w.scales.data(), w.mins.data(), 3,
                                             300, 64, y.data()),
                     Error)
            << cpu::isa_name(isa);
      }
  }
}

TEST(Int4Kernel, DispatchUsesASupportedIsa) {
  EXPECT_TRUE(cpu::isa_supported(cpu::best_isa()));
  EXPECT_TRUE(cpu::isa_supported(Isa::Scalar));
  if (cpu::isa_supported(Isa::Avx512)) {
    EXPECT_EQ(cpu::best_isa(), Isa::Avx512);
  }
  std::printf("[          ] int4 kernels tested here:");
  for (Isa isa : isas_to_test()) std::printf(" %s", cpu::isa_name(isa));
  std::printf(" (best: %s)\n", cpu::isa_name(cpu::best_isa()));
  // gemm_int4_asym is the dispatching entry point: same result as forcing best_isa().
  const Packed w = random_packed(5, 100, 32);
  const auto x = random_x(2, 100);
  std::vector<float> y(10);
  cpu::gemm_int4_asym(x.data(), 2, w.qweight.data(), w.scales.data(), w.mins.data(), 5, 100, 32, y.data());
  EXPECT_EQ(y, run(cpu::best_isa(), x, 2, w));
}

TEST(Int4Kernel, RejectsBadArguments) {
  const Packed w{1, 4, 32, {0x50, 0xF7}, {0x3E4D}, {0xBF80}};
  const std::vector<float> x = {1, 2, 3, 4};
  std::vector<float> y(1);
  EXPECT_THROW(cpu::gemm_int4_asym(x.data(), 1, w.qweight.data(), w.scales.data(), w.mins.data(), 1, 4, 16, y.data()),
               Error);
  EXPECT_THROW(cpu::gemm_int4_asym(x.data(), 1, w.qweight.data(), w.scales.data(), w.mins.data(), 1, 0, 32, y.data()),
               Error);
  for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
    if (cpu::isa_supported(isa)) continue;
    EXPECT_THROW(cpu::gemm_int4_asym_isa(isa, x.data(), 1, w.qweight.data(), w.scales.data(), w.mins.data(), 1, 4, 32,
                                         y.data()),
                 Error);
  }
  // M = 0 or N = 0: nothing to do, nothing written.
  cpu::gemm_int4_asym(x.data(), 0, w.qweight.data(), w.scales.data(), w.mins.data(), 1, 4, 32, y.data());
}

}  // namespace
}  // namespace nibble
