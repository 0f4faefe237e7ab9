// dtype names and conversions, each checked against a reference that does not
// share code with the implementation: the compiler's _Float16 (and F16C when
// the CPU has it) for f16, nearest-candidate search in double for bf16, and the
// spec formulas (sign, exponent, mantissa) for decoders.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#include "nibble/dtype.h"
#include "nibble/error.h"

namespace nibble {
namespace {

uint32_t bits(float x) { return std::bit_cast<uint32_t>(x); }
float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

const DType kAllDTypes[] = {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64,     DType::I32,
                            DType::I16, DType::I8,  DType::U8,  DType::Bool, DType::F8_E4M3, DType::F8_E5M2};

// ---------------------------------------------------------------------------
// Sweeps over fp32 bit patterns.
//
// All 2^32 patterns take minutes (on 2 cores, -O3: bf16 40 s, f16 13 min --
// the compiler's _Float16 conversion is a soft-float libgcc call -- and F16C
// 55 s), too slow for every test run. So by
// default the sweep covers a dense sample, and NIBBLE_EXHAUSTIVE=1 in the
// environment makes it go through every pattern. The sample:
//   - for each sign and each of the 256 exponents, mantissas built around
//     every rounding position p (0..22): bits above p+1 all zero / all one /
//     random, the kept lsb at p+1 and the "half" bit at p each 0 or 1, and the
//     bits below p zero / one / all ones -- every tie, near-tie and carry case
//     for any number of dropped bits (which is what f16 subnormals need);
//   - every 4099th pattern of the whole range (a prime stride);
//   - 10^7 random patterns.
//
// Patterns are processed in chunks through the bulk convert_from_f32 (the path
// big tensors take); the scalar function is checked against the bulk result.
// `check(u, got)` returns true when the encoding `got` of pattern u is right.

bool exhaustive_requested() {
  const char* e = std::getenv("NIBBLE_EXHAUSTIVE");
  return e != nullptr && std::string(e) == "1";
}

const std::vector<uint32_t>& sampled_f32_patterns() {
  static const std::vector<uint32_t> sample = [] {
  std::vector<uint32_t> out;
  std::mt19937 rng(20240611);
  for (uint32_t sign = 0; sign < 2; ++sign) {
    for (uint32_t e = 0; e < 256; ++e) {
      for (uint32_t p = 0; p < 23; ++p) {
        const uint32_t above_mask = 0x7FFFFFu & ~((2u << p) - 1u) & ~(1u << (p + 1));
        const uint32_t below_mask = (1u << p) - 1u;
        for (uint32_t above : {0u, 0xFFFFFFFFu, static_cast<uint32_t>(rng())}) {
          for (uint32_t kept = 0; kept < 2; ++kept) {
            for (uint32_t half = 0; half < 2; ++half) {
              for (uint32_t below : {0u, 1u, 0xFFFFFFFFu}) {
                const uint32_t m = (above & above_mask) | ((kept << (p + 1)) & 0x7FFFFFu) | (half << p) |
                                   (below & below_mask);
                out.push_back((sign << 31) | (e << 23) | m);
              }
            }
          }
        }
      }
    }
  }
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += 4099) out.push_back(static_cast<uint32_t>(u));
  for (int i = 0; i < 10'000'000; ++i) out.push_back(static_cast<uint32_t>(rng()));
  return out;
  }();
  return sample;
}

template <typename Check>
void sweep_f32(DType dt, uint16_t (*scalar)(float), Check check) {
  const bool all = exhaustive_requested();
  static const std::vector<uint32_t> kNone;
  const std::vector<uint32_t>& sample = all ? kNone : sampled_f32_patterns();
  const uint64_t count = all ? (uint64_t{1} << 32) : sample.size();
  constexpr uint64_t kChunk = uint64_t{1} << 14;  // below the library's OpenMP threshold
  const int64_t chunks = static_cast<int64_t>((count + kChunk - 1) / kChunk);
  uint64_t mismatches = 0;
  std::string first_failure;
#pragma omp parallel
  {
    std::vector<float> src(kChunk);
    std::vector<uint16_t> dst(kChunk);
    std::vector<uint32_t> pat(kChunk);
#pragma omp for schedule(dynamic, 16) reduction(+ : mismatches)
    for (int64_t c = 0; c < chunks; ++c) {
      const uint64_t base = static_cast<uint64_t>(c) * kChunk;
      const size_t n = static_cast<size_t>(std::min(kChunk, count - base));
      for (size_t i = 0; i < n; ++i) {
        pat[i] = all ? static_cast<uint32_t>(base + i) : sample[base + i];
        src[i] = from_bits(pat[i]);
      }
      convert_from_f32(src.data(), dt, dst.data(), n);
      for (size_t i = 0; i < n; ++i) {
        if (!check(pat[i], dst[i]) || scalar(src[i]) != dst[i]) {
          if (mismatches++ == 0) {
#pragma omp critical
            first_failure = fmt::format("f32 0x{:08X} -> 0x{:04X} (scalar 0x{:04X})", pat[i], dst[i],
                                        scalar(src[i]));
          }
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0u) << "e.g. " << first_failure;
  std::printf("  %s: checked %llu fp32 patterns%s\n", std::string(dtype_name(dt)).c_str(),
              static_cast<unsigned long long>(count), all ? " (all of them)" : " (set NIBBLE_EXHAUSTIVE=1 for all 2^32)");
}

// Nearest bf16 to x by search: the two bf16 values around x (truncation, and
// one step further from zero) are decoded, their distances to x computed in
// double (exact: both are floats a few ulps apart), and the nearer one wins;
// a tie goes to the even mantissa. Beyond bf16 max the "next" value is 2^128,
// the IEEE overflow point, and choosing it means Inf.
uint16_t reference_bf16(uint32_t u) {
  const float x = from_bits(u);
  if (std::isinf(x)) return static_cast<uint16_t>(u >> 16);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);
  const uint16_t hi = static_cast<uint16_t>(lo + 1);
  const double dlo = static_cast<double>(from_bits(static_cast<uint32_t>(lo) << 16));
  const double dhi = (hi & 0x7FFF) == 0x7F80 ? std::copysign(0x1p128, static_cast<double>(x))
                                             : static_cast<double>(from_bits(static_cast<uint32_t>(hi) << 16));
  const double elo = std::fabs(static_cast<double>(x) - dlo);
  const double ehi = std::fabs(dhi - static_cast<double>(x));
  if (elo < ehi) return lo;
  if (ehi < elo) return hi;
  return (lo & 1) ? hi : lo;
}

bool is_nan_f32(uint32_t u) { return (u & 0x7FFFFFFFu) > 0x7F800000u; }
bool is_nan_bf16(uint16_t h) { return (h & 0x7FFF) > 0x7F80; }
bool is_nan_f16(uint16_t h) { return (h & 0x7FFF) > 0x7C00; }
// A NaN must stay a quiet NaN with its sign.
bool nan_ok_bf16(uint32_t u, uint16_t got) {
  return is_nan_bf16(got) && (got & 0x0040) && (got >> 15) == (u >> 31);
}
bool nan_ok_f16(uint32_t u, uint16_t got) { return is_nan_f16(got) && (got & 0x0200) && (got >> 15) == (u >> 31); }

TEST(DType, NamesSizesAndKinds) {
  for (DType dt : kAllDTypes) {
    auto back = dtype_from_name(dtype_name(dt));
    ASSERT_TRUE(back.has_value()) << dtype_name(dt);
    EXPECT_EQ(*back, dt);
  }
  EXPECT_EQ(dtype_name(DType::Bool), "BOOL");
  EXPECT_EQ(dtype_name(DType::F8_E4M3), "F8_E4M3");
  EXPECT_EQ(dtype_name(DType::BF16), "BF16");
  EXPECT_EQ(dtype_from_name("F8_E5M2"), DType::F8_E5M2);
  EXPECT_FALSE(dtype_from_name("bf16").has_value());  // safetensors names are upper case
  EXPECT_FALSE(dtype_from_name("F128").has_value());
  EXPECT_FALSE(dtype_from_name("").has_value());

  EXPECT_EQ(dtype_size(DType::F64), 8u);
  EXPECT_EQ(dtype_size(DType::F32), 4u);
  EXPECT_EQ(dtype_size(DType::F16), 2u);
  EXPECT_EQ(dtype_size(DType::BF16), 2u);
  EXPECT_EQ(dtype_size(DType::I64), 8u);
  EXPECT_EQ(dtype_size(DType::I32), 4u);
  EXPECT_EQ(dtype_size(DType::I16), 2u);
  EXPECT_EQ(dtype_size(DType::I8), 1u);
  EXPECT_EQ(dtype_size(DType::U8), 1u);
  EXPECT_EQ(dtype_size(DType::Bool), 1u);
  EXPECT_EQ(dtype_size(DType::F8_E4M3), 1u);
  EXPECT_EQ(dtype_size(DType::F8_E5M2), 1u);

  for (DType dt : {DType::F64, DType::F32, DType::F16, DType::BF16, DType::F8_E4M3, DType::F8_E5M2})
    EXPECT_TRUE(dtype_is_float(dt)) << dtype_name(dt);
  for (DType dt : {DType::I64, DType::I32, DType::I16, DType::I8, DType::U8, DType::Bool})
    EXPECT_FALSE(dtype_is_float(dt)) << dtype_name(dt);
}

TEST(DType, Bf16WorkedExamples) {
  EXPECT_EQ(f32_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(f32_to_bf16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808000)), 0x3F80);  // tie, 0x3F80 is even: stays
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F818000)), 0x3F82);  // tie, 0x3F81 is odd: up to even
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F808001)), 0x3F81);  // just above the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0x3F807FFF)), 0x3F80);  // just below the tie
  EXPECT_EQ(f32_to_bf16(from_bits(0xBF818000)), 0xBF82);  // negative tie, magnitude to even
  EXPECT_EQ(f32_to_bf16(from_bits(0x3FFF8000)), 0x4000);  // mantissa carry into the exponent
  EXPECT_EQ(f32_to_bf16(from_bits(0x7F7FFFFF)), 0x7F80);  // FLT_MAX rounds to Inf
  EXPECT_EQ(f32_to_bf16(from_bits(0xFF7FFFFF)), 0xFF80);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7F7F7FFF)), 0x7F7F);  // stays bf16 max
  EXPECT_EQ(f32_to_bf16(INFINITY), 0x7F80);
  EXPECT_EQ(f32_to_bf16(-INFINITY), 0xFF80);
  // fp32 subnormals are bf16 subnormals.
  EXPECT_EQ(f32_to_bf16(from_bits(0x00010000)), 0x0001);
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008000)), 0x0000);  // tie to even zero
  EXPECT_EQ(f32_to_bf16(from_bits(0x00018000)), 0x0002);  // tie to even 2
  EXPECT_EQ(f32_to_bf16(from_bits(0x00008001)), 0x0001);
  EXPECT_EQ(f32_to_bf16(from_bits(0x807FFFFF)), 0x8080);  // largest subnormal rounds up to min normal
  // NaNs stay NaN, quiet, sign kept, even with the payload only in the low bits.
  EXPECT_EQ(f32_to_bf16(from_bits(0x7F800001)), 0x7FC0);
  EXPECT_EQ(f32_to_bf16(from_bits(0xFF800001)), 0xFFC0);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7FC00000)), 0x7FC0);
  EXPECT_EQ(f32_to_bf16(from_bits(0x7FFFFFFF)), 0x7FFF);

  EXPECT_EQ(bits(bf16_to_f32(0x3F80)), 0x3F800000u);
  EXPECT_EQ(bits(bf16_to_f32(0xFF80)), 0xFF800000u);
  EXPECT_EQ(bits(round_to_bf16(from_bits(0x3F818000))), 0x3F820000u);
}

TEST(DType, Bf16DecodeMatchesFormula) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t s = h >> 15, e = (h >> 7) & 0xFF, m = h & 0x7F;
    const float got = bf16_to_f32(static_cast<uint16_t>(h));
    if (e == 0xFF) {
      EXPECT_TRUE(m == 0 ? std::isinf(got) : std::isnan(got)) << h;
      EXPECT_EQ(std::signbit(got), s == 1) << h;
      continue;
    }
    const double mag = e == 0 ? std::ldexp(m / 128.0, -126) : std::ldexp(1.0 + m / 128.0, static_cast<int>(e) - 127);
    const double want = s ? -mag : mag;
    ASSERT_EQ(static_cast<double>(got), want) << h;
    ASSERT_EQ(std::signbit(got), s == 1) << h;
  }
}

// fp32 patterns (see sweep_f32) against the double-precision nearest-candidate search.
TEST(DType, Bf16SweepMatchesNearestSearch) {
  sweep_f32(DType::BF16, f32_to_bf16, [](uint32_t u, uint16_t got) {
    if (is_nan_f32(u)) return nan_ok_bf16(u, got);
    return got == reference_bf16(u);
  });
}

TEST(DType, F16WorkedExamples) {
  EXPECT_EQ(f32_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(f32_to_f16(-2.0f), 0xC000);
  EXPECT_EQ(f32_to_f16(0.0f), 0x0000);
  EXPECT_EQ(f32_to_f16(-0.0f), 0x8000);
  EXPECT_EQ(f32_to_f16(1.0f + 0x1p-11f), 0x3C00);         // tie, even stays
  EXPECT_EQ(f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3C02);     // tie, odd goes up
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7BFF);                // f16 max
  EXPECT_EQ(f32_to_f16(65519.99f), 0x7BFF);               // just below the overflow midpoint
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);                // midpoint: ties to even = Inf
  EXPECT_EQ(f32_to_f16(-65520.0f), 0xFC00);
  EXPECT_EQ(f32_to_f16(65536.0f), 0x7C00);
  EXPECT_EQ(f32_to_f16(from_bits(0x7F7FFFFF)), 0x7C00);
  EXPECT_EQ(f32_to_f16(INFINITY), 0x7C00);
  EXPECT_EQ(f32_to_f16(-INFINITY), 0xFC00);
  EXPECT_EQ(f32_to_f16(0x1p-14f), 0x0400);                // smallest normal
  EXPECT_EQ(f32_to_f16(5.960464477539063e-8f), 0x0001);   // 2^-24, smallest subnormal
  EXPECT_EQ(f32_to_f16(0x1p-25f), 0x0000);                // half of it: tie to even zero
  EXPECT_EQ(f32_to_f16(-0x1p-25f), 0x8000);               // sign kept on underflow
  EXPECT_EQ(f32_to_f16(3 * 0x1p-26f), 0x0001);            // 0.75 units rounds up
  EXPECT_EQ(f32_to_f16(from_bits(0x33000001)), 0x0001);   // just above 2^-25
  EXPECT_EQ(f32_to_f16(1e-10f), 0x0000);
  EXPECT_EQ(f32_to_f16(-1e-30f), 0x8000);
  EXPECT_EQ(f32_to_f16(from_bits(0x00000001)), 0x0000);   // fp32 subnormal
  EXPECT_EQ(f32_to_f16(1.5f * 0x1p-24f), 0x0002);         // tie between 1 and 2: even
  EXPECT_EQ(f32_to_f16(2.5f * 0x1p-24f), 0x0002);         // tie between 2 and 3: even
  EXPECT_EQ(f32_to_f16(1023.0f * 0x1p-24f), 0x03FF);      // largest subnormal
  EXPECT_EQ(f32_to_f16(1023.5f * 0x1p-24f), 0x0400);      // tie up into the smallest normal
  EXPECT_EQ(f32_to_f16(1023.25f * 0x1p-24f), 0x03FF);
  EXPECT_EQ(f32_to_f16(from_bits(0x7F800001)), 0x7E00);   // payload only in the low bits
  EXPECT_EQ(f32_to_f16(from_bits(0xFF800001)), 0xFE00);
  EXPECT_EQ(f32_to_f16(from_bits(0x7FC00000)), 0x7E00);
  EXPECT_EQ(f32_to_f16(from_bits(0xFFFFE000)), 0xFFFF);   // top payload bits kept

  EXPECT_EQ(bits(f16_to_f32(0x3C00)), bits(1.0f));
  EXPECT_EQ(f16_to_f32(0x7BFF), 65504.0f);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x03FF), 1023.0f * 0x1p-24f);
  EXPECT_EQ(bits(f16_to_f32(0x8000)), 0x80000000u);
  EXPECT_EQ(bits(f16_to_f32(0xFC00)), 0xFF800000u);
  EXPECT_TRUE(std::isnan(f16_to_f32(0x7C01)));
}

TEST(DType, F16DecodeMatchesFormulaAndCompiler) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t s = h >> 15, e = (h >> 10) & 0x1F, m = h & 0x3FF;
    const float got = f16_to_f32(static_cast<uint16_t>(h));
    ASSERT_EQ(std::signbit(got), s == 1) << h;
    if (e == 0x1F) {
      ASSERT_TRUE(m == 0 ? std::isinf(got) : std::isnan(got)) << h;
      continue;
    }
    const double mag = e == 0 ? std::ldexp(m / 1024.0, -14) : std::ldexp(1.0 + m / 1024.0, static_cast<int>(e) - 15);
    ASSERT_EQ(static_cast<double>(got), s ? -mag : mag) << h;
#ifdef __FLT16_MAX__
    _Float16 f16;
    const uint16_t h16 = static_cast<uint16_t>(h);
    std::memcpy(&f16, &h16, 2);
    ASSERT_EQ(got, static_cast<float>(f16)) << h;
#endif
  }
}

// fp32 patterns (see sweep_f32) against the compiler's float -> _Float16 conversion
// (correctly rounded, RNE). NaNs are compared by class and sign only: the
// payload the runtime keeps is its own choice.
TEST(DType, F16SweepMatchesCompiler) {
#ifndef __FLT16_MAX__
  GTEST_SKIP() << "this compiler has no _Float16";
#else
  sweep_f32(DType::F16, f32_to_f16, [](uint32_t u, uint16_t got) {
    if (is_nan_f32(u)) return nan_ok_f16(u, got);
    const _Float16 want = static_cast<_Float16>(from_bits(u));
    uint16_t want_bits;
    std::memcpy(&want_bits, &want, 2);
    return got == want_bits;
  });
#endif
}

#if defined(__x86_64__)
__attribute__((target("f16c"))) uint16_t f16c_convert(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
#endif

// The F16C instruction, where the CPU has it, fixes the NaN payload too:
// quiet bit set, sign and top 10 payload bits kept. Checked bit for bit over a
// stride of all patterns (every one with NIBBLE_EXHAUSTIVE=1) plus every NaN
// payload prefix.
TEST(DType, F16MatchesF16cHardware) {
#if defined(__x86_64__)
  if (!__builtin_cpu_supports("f16c")) GTEST_SKIP() << "CPU has no F16C";
  const uint64_t stride = exhaustive_requested() ? 1 : 997;
  uint64_t mismatches = 0;
#pragma omp parallel for schedule(static) reduction(+ : mismatches)
  for (uint64_t u = 0; u < (uint64_t{1} << 32); u += stride) {
    const float x = from_bits(static_cast<uint32_t>(u));
    if (f32_to_f16(x) != f16c_convert(x)) ++mismatches;
  }
  for (uint32_t p = 0; p < (1u << 10); ++p) {
    for (uint32_t low : {0u, 1u, 0x1FFFu}) {
      for (uint32_t sign : {0u, 0x80000000u}) {
        const uint32_t u = sign | 0x7F800000u | (p << 13) | low;
        if (!is_nan_f32(u)) continue;
        const float x = from_bits(u);
        if (f32_to_f16(x) != f16c_convert(x)) ++mismatches;
      }
    }
  }
  EXPECT_EQ(mismatches, 0u);
#else
  GTEST_SKIP() << "not x86-64";
#endif
}

TEST(DType, F8E4M3DecodeMatchesFormula) {
  for (uint32_t b = 0; b < 256; ++b) {
    const uint32_t s = b >> 7, e = (b >> 3) & 0xF, m = b & 7;
    const float got = f8_e4m3_to_f32(static_cast<uint8_t>(b));
    ASSERT_EQ(std::signbit(got), s == 1) << b;
    if (e == 15 && m == 7) {  // S.1111.111: the only NaNs, no infinities
      ASSERT_TRUE(std::isnan(got)) << b;
      continue;
    }
    const double mag = e == 0 ? std::ldexp(m / 8.0, -6) : std::ldexp(1.0 + m / 8.0, static_cast<int>(e) - 7);
    ASSERT_EQ(static_cast<double>(got), s ? -mag : mag) << b;
  }
  EXPECT_EQ(f8_e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(f8_e4m3_to_f32(0xFE), -448.0f);
  EXPECT_EQ(f8_e4m3_to_f32(0x01), 0x1p-9f);
  EXPECT_EQ(f8_e4m3_to_f32(0x08), 0x1p-6f);
  EXPECT_EQ(f8_e4m3_to_f32(0x38), 1.0f);
  EXPECT_EQ(f8_e4m3_to_f32(0x78), 256.0f);  // exponent 15 is a normal binade in E4M3FN
  EXPECT_TRUE(std::isnan(f8_e4m3_to_f32(0x7F)));
  EXPECT_TRUE(std::isnan(f8_e4m3_to_f32(0xFF)));
  EXPECT_EQ(bits(f8_e4m3_to_f32(0x80)), 0x80000000u);
}

TEST(DType, F8E5M2DecodeMatchesFormula) {
  for (uint32_t b = 0; b < 256; ++b) {
    const uint32_t s = b >> 7, e = (b >> 2) & 0x1F, m = b & 3;
    const float got = f8_e5m2_to_f32(static_cast<uint8_t>(b));
    ASSERT_EQ(std::signbit(got), s == 1) << b;
    if (e == 31) {
      ASSERT_TRUE(m == 0 ? std::isinf(got) : std::isnan(got)) << b;
      continue;
    }
    const double mag = e == 0 ? std::ldexp(m / 4.0, -14) : std::ldexp(1.0 + m / 4.0, static_cast<int>(e) - 15);
    ASSERT_EQ(static_cast<double>(got), s ? -mag : mag) << b;
  }
  EXPECT_EQ(f8_e5m2_to_f32(0x7B), 57344.0f);
  EXPECT_EQ(f8_e5m2_to_f32(0x7C), INFINITY);
  EXPECT_EQ(f8_e5m2_to_f32(0xFC), -INFINITY);
  EXPECT_TRUE(std::isnan(f8_e5m2_to_f32(0x7D)));
  EXPECT_EQ(f8_e5m2_to_f32(0x01), 0x1p-16f);
  EXPECT_EQ(f8_e5m2_to_f32(0x3C), 1.0f);
}

// Bytes of `values` (of type T) placed at an odd offset, as a tensor inside a
// file mapping can be; the converters must not assume alignment.
template <typename T>
std::vector<unsigned char> misaligned_bytes(const std::vector<T>& values) {
  std::vector<unsigned char> buf(1);
  const auto* bytes = reinterpret_cast<const unsigned char*>(values.data());
  buf.insert(buf.end(), bytes, bytes + values.size() * sizeof(T));
  return buf;
}

template <typename T>
std::vector<float> to_f32(DType dt, const std::vector<T>& values) {
  auto buf = misaligned_bytes(values);
  std::vector<float> out(values.size(), -777.0f);
  convert_to_f32(buf.data() + 1, dt, out.data(), values.size());
  return out;
}

TEST(DType, ConvertToF32FromEveryDType) {
  using V = std::vector<float>;
  EXPECT_EQ(to_f32<double>(DType::F64, {1.0, -2.5, 1.0 / 3.0, 1e300}),
            (V{1.0f, -2.5f, static_cast<float>(1.0 / 3.0), INFINITY}));
  EXPECT_EQ(to_f32<float>(DType::F32, {1.5f, -0.0f, 3e38f}), (V{1.5f, -0.0f, 3e38f}));
  EXPECT_EQ(to_f32<uint16_t>(DType::F16, {0x3C00, 0xC000, 0x0001, 0x7BFF}), (V{1.0f, -2.0f, 0x1p-24f, 65504.0f}));
  EXPECT_EQ(to_f32<uint16_t>(DType::BF16, {0x3F80, 0xC020, 0x7F80}), (V{1.0f, -2.5f, INFINITY}));
  EXPECT_EQ(to_f32<int64_t>(DType::I64, {0, -3, int64_t{1} << 40}), (V{0.0f, -3.0f, 0x1p40f}));
  EXPECT_EQ(to_f32<int32_t>(DType::I32, {7, -2147483647 - 1}), (V{7.0f, -2147483648.0f}));
  EXPECT_EQ(to_f32<int16_t>(DType::I16, {-32768, 32767}), (V{-32768.0f, 32767.0f}));
  EXPECT_EQ(to_f32<int8_t>(DType::I8, {-128, 127, 0}), (V{-128.0f, 127.0f, 0.0f}));
  EXPECT_EQ(to_f32<uint8_t>(DType::U8, {0, 255, 17}), (V{0.0f, 255.0f, 17.0f}));
  EXPECT_EQ(to_f32<uint8_t>(DType::Bool, {0, 1, 2}), (V{0.0f, 1.0f, 1.0f}));
  EXPECT_EQ(to_f32<uint8_t>(DType::F8_E4M3, {0x7E, 0x01, 0xB8}), (V{448.0f, 0x1p-9f, -1.0f}));
  EXPECT_EQ(to_f32<uint8_t>(DType::F8_E5M2, {0x7B, 0x01, 0xBC}), (V{57344.0f, 0x1p-16f, -1.0f}));

  auto nan4 = to_f32<uint8_t>(DType::F8_E4M3, {0x7F});
  EXPECT_TRUE(std::isnan(nan4[0]));

  // The bulk fp8 tables agree with the scalar decoders on every byte.
  std::vector<uint8_t> all(256);
  for (int i = 0; i < 256; ++i) all[static_cast<size_t>(i)] = static_cast<uint8_t>(i);
  auto e4 = to_f32(DType::F8_E4M3, all), e5 = to_f32(DType::F8_E5M2, all);
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(bits(e4[static_cast<size_t>(i)]), bits(f8_e4m3_to_f32(static_cast<uint8_t>(i)))) << i;
    EXPECT_EQ(bits(e5[static_cast<size_t>(i)]), bits(f8_e5m2_to_f32(static_cast<uint8_t>(i)))) << i;
  }

  convert_to_f32(nullptr, DType::F16, nullptr, 0);  // n = 0 is a no-op
}

TEST(DType, ConvertFromF32) {
  // Large enough to take the OpenMP path; random bit patterns cover every class.
  const size_t n = (size_t{1} << 18) + 3;
  std::mt19937 rng(1234);
  std::vector<float> src(n);
  for (auto& x : src) x = from_bits(static_cast<uint32_t>(rng()));

  std::vector<float> f32(n);
  convert_from_f32(src.data(), DType::F32, f32.data(), n);
  EXPECT_EQ(std::memcmp(f32.data(), src.data(), n * 4), 0);

  // Misaligned destination (odd byte offset).
  std::vector<unsigned char> buf(n * 2 + 1);
  for (DType dt : {DType::F16, DType::BF16}) {
    convert_from_f32(src.data(), dt, buf.data() + 1, n);
    size_t bad = 0;
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, buf.data() + 1 + 2 * i, 2);
      const uint16_t want = dt == DType::F16 ? f32_to_f16(src[i]) : f32_to_bf16(src[i]);
      bad += h != want;
    }
    EXPECT_EQ(bad, 0u) << dtype_name(dt);
  }

  for (DType dt : {DType::F64, DType::I8, DType::U8, DType::Bool, DType::F8_E4M3, DType::F8_E5M2, DType::I32})
    EXPECT_THROW(convert_from_f32(src.data(), dt, buf.data(), 1), Error) << dtype_name(dt);
}

}  // namespace
}  // namespace nibble
