// Element types and exact conversions between them.
//
// The fp32 -> f16/bf16 encoders work on the integer bit pattern only, so the
// result does not depend on the compiler, the FPU rounding mode or whether the
// target has F16C/AVX512-FP16. Each converter is a few integer ops and
// selects (no data-dependent branches) so the bulk loops below vectorize.
// tests/unit/test_dtype.cpp checks them against independent references
// (_Float16, F16C, a nearest-value search in double, the spec formulas).
#include "nibble/dtype.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>

#include "nibble/error.h"

namespace nibble {

namespace {

// Bulk conversions split across threads only when the work is large enough to
// pay for waking the OpenMP team (a few microseconds).
constexpr size_t kParallelMin = size_t{1} << 16;

inline uint32_t f32_bits(float x) { return std::bit_cast<uint32_t>(x); }
inline float f32_from_bits(uint32_t u) { return std::bit_cast<float>(u); }

// Loads/stores through memcpy: source buffers may come straight from a file
// mapping at any byte offset, so typed pointers could be misaligned.
template <typename T>
inline T load(const void* base, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const unsigned char*>(base) + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
inline void store(void* base, size_t i, T v) {
  std::memcpy(static_cast<unsigned char*>(base) + i * sizeof(T), &v, sizeof(T));
}

// Branch-free selects. Written with masks rather than `?:` because GCC turns
// a `?:` whose arm holds a float operation into a branch, and with the default
// -ftrapping-math it will not if-convert that branch back, which blocks
// vectorization of the whole loop.
inline uint32_t all_ones_if(bool c) { return 0u - static_cast<uint32_t>(c); }
inline uint32_t select(uint32_t mask, uint32_t a, uint32_t b) { return (a & mask) | (b & ~mask); }

// fp32 -> bf16, round to nearest even.
// bf16 is the top half of an fp32, so rounding is "add 0x7FFF plus the lsb of
// the kept half, then truncate". The carry propagates into the exponent, which
// turns the largest finite values into 0x7F80 (Inf) exactly as IEEE RNE says
// (a value at or beyond the midpoint between bf16 max and 2^128 overflows).
// fp32 subnormals need nothing special: they share the exponent field layout,
// and rounding up from the largest one carries into the smallest normal.
// NaN is handled apart: truncating could clear every payload bit and yield Inf,
// so the quiet bit (0x0040) is forced; sign and top payload bits are kept.
inline uint16_t encode_bf16(uint32_t u) {
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const uint32_t nan = (u >> 16) | 0x0040u;
  const bool is_nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(is_nan ? nan : rounded);
}

inline float decode_bf16(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

// fp32 -> f16 (IEEE binary16), round to nearest even.
//
// |x| (bits a) falls into one of four ranges:
//   NaN                      -> quiet NaN, sign and top 10 payload bits kept
//                               (what F16C's vcvtps2ph produces, too)
//   a >= 65520 (0x477FF000)  -> Inf. 65520 is the midpoint between the f16 max
//                               65504 and 2^16; RNE sends the tie to the even
//                               side, which is the overflow (Inf) side.
//   a >= 2^-14 (0x38800000)  -> normal: rebias the exponent (127 -> 15, i.e.
//                               subtract 112 << 23) and round off 13 bits; a
//                               mantissa carry bumps the exponent correctly.
//   otherwise                -> subnormal or zero: the result counts units of
//                               2^-24. With the implicit bit made explicit,
//                               |x| = mant * 2^(e - 150), so the count is
//                               mant >> (126 - e), rounded to nearest even.
//                               Rounding up from 1023 gives 1024 = 0x400, the
//                               smallest normal, which is the right encoding.
//                               Shifts are clamped to [1, 31]: at 31 every
//                               value (mant < 2^24) rounds to 0, which covers
//                               fp32 subnormals and everything below 2^-25.
inline uint16_t encode_f16(uint32_t u) {
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;

  // Wraps (harmlessly, it is unsigned) when a is below the normal range; the
  // select below does not pick it then.
  const uint32_t normal = (a + 0x0FFFu + ((a >> 13) & 1u) - 0x38000000u) >> 13;

  const int32_t e = static_cast<int32_t>(a >> 23);
  int32_t shift = 126 - e;
  shift = shift < 1 ? 1 : (shift > 31 ? 31 : shift);
  const uint32_t mant = (a & 0x007FFFFFu) | 0x00800000u;
  const uint32_t lsb = (mant >> shift) & 1u;
  const uint32_t subnormal = (mant + (1u << (shift - 1)) - 1u + lsb) >> shift;

  const uint32_t nan = 0x7E00u | ((a >> 13) & 0x03FFu);
  const uint32_t is_normal = all_ones_if(a >= 0x38800000u);
  const uint32_t is_inf = all_ones_if(a >= 0x477FF000u);
  const uint32_t is_nan = all_ones_if(a > 0x7F800000u);
  uint32_t r = select(is_normal, normal, subnormal);
  r = select(is_inf, 0x7C00u, r);
  r = select(is_nan, nan, r);
  return static_cast<uint16_t>(sign | r);
}

// f16 -> fp32, exact. Normals and Inf/NaN are a rebias of the bit fields;
// subnormals m * 2^-24 are computed in float, which is exact (m < 2^10 and the
// scale is a power of two).
inline float decode_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t a = h & 0x7FFFu;
  const uint32_t e = a >> 10;
  const uint32_t normal = (a << 13) + 0x38000000u;
  const uint32_t inf_nan = (a << 13) | 0x7F800000u;
  const uint32_t subnormal = f32_bits(static_cast<float>(a) * 0x1p-24f);
  uint32_t r = select(all_ones_if(e == 0), subnormal, normal);
  r = select(all_ones_if(e == 0x1Fu), inf_nan, r);
  return f32_from_bits(sign | r);
}

// OCP FP8 E4M3 ("fn"): bias 7, no infinities, S.1111.111 is NaN, max 448.
// Subnormals are m/8 * 2^-6 = m * 2^-9.
inline float decode_e4m3(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t e = (b >> 3) & 0x0Fu;
  const uint32_t m = b & 0x07u;
  uint32_t r;
  if ((b & 0x7Fu) == 0x7Fu) {
    r = 0x7FC00000u;
  } else if (e == 0) {
    r = f32_bits(static_cast<float>(m) * 0x1p-9f);
  } else {
    r = ((e - 7u + 127u) << 23) | (m << 20);
  }
  return f32_from_bits(sign | r);
}

// OCP FP8 E5M2 has the layout of the top byte of an IEEE f16 (bias 15,
// Inf and NaN included), so decoding goes through the f16 decoder.
inline float decode_e5m2(uint8_t b) { return decode_f16(static_cast<uint16_t>(b << 8)); }

// fp32 -> a small float format with `ebits` exponent and `mbits` mantissa bits
// (bias `bias`, largest finite magnitude `fmax`), round to nearest even,
// saturating at fmax; the result is the code's bits, sign at bit ebits+mbits.
// |x| is rounded on the grid of its binade: quantum = 2^(e - mbits) with e its
// exponent, clamped below at the smallest normal exponent 1 - bias (the
// subnormal grid). |x| / quantum is an exact fp32 division by a power of two,
// and nearbyint in the default rounding mode rounds it to nearest, ties to an
// even integer, i.e. to the even mantissa; a carry into the next binade gives
// the right value, since 2^(mbits+1) quanta is the next binade's first value.
// NaN is the caller's business.
uint32_t encode_minifloat(float x, int ebits, int mbits, int bias, float fmax) {
  const uint32_t sign = std::signbit(x) ? 1u << (ebits + mbits) : 0u;
  float a = std::fabs(x);
  if (!(a <= fmax)) a = fmax;  // beyond the largest finite value (and inf): saturate
  const int emin = 1 - bias;
  const int e = a > 0.0f ? std::max(std::ilogb(a), emin) : emin;
  const float quantum = std::ldexp(1.0f, e - mbits);
  float v = std::nearbyint(a / quantum) * quantum;
  if (v > fmax) v = fmax;  // rounded up past the largest finite value
  uint32_t exp_field, man;
  if (v < std::ldexp(1.0f, emin)) {  // subnormal (or zero): units of 2^(emin - mbits)
    exp_field = 0;
    man = static_cast<uint32_t>(v / std::ldexp(1.0f, emin - mbits));
  } else {
    const int ev = std::ilogb(v);
    exp_field = static_cast<uint32_t>(ev + bias);
    man = static_cast<uint32_t>(v / std::ldexp(1.0f, ev - mbits)) - (1u << mbits);
  }
  return sign | (exp_field << mbits) | man;
}

// 256-entry decode tables for the bulk fp8 paths.
using F8Table = std::array<float, 256>;
template <float (*Decode)(uint8_t)>
const F8Table& f8_table() {
  static const F8Table table = [] {
    F8Table t{};
    for (int i = 0; i < 256; ++i) t[static_cast<size_t>(i)] = Decode(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

// dst[i] = f(load<T>(src, i)) for i < n, in parallel when n is large.
// Pass f as a lambda, not a function pointer, so it inlines into the loop and
// the loop can vectorize.
template <typename T, typename F>
void convert_loop(const void* src, float* dst, size_t n, F f) {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
  for (size_t i = 0; i < n; ++i) dst[i] = f(load<T>(src, i));
}

// fp32 -> f16 over a block. The subnormal path shifts each element by its own
// amount, which baseline x86-64 (SSE2) has no vector instruction for; AVX2 has
// (vpsrlvd), so on x86-64 an AVX2 clone is built too and picked at load time
// (about 7x faster than the scalar loop). Elsewhere it is the plain loop.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("avx2", "default")))
#endif
void encode_f16_block(const float* src, void* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) store<uint16_t>(dst, i, encode_f16(f32_bits(src[i])));
}

}  // namespace

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::F64: return 8;
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::I64: return 8;
    case DType::I32: return 4;
    case DType::I16: return 2;
    case DType::I8: return 1;
    case DType::U8: return 1;
    case DType::Bool: return 1;
    case DType::F8_E4M3: return 1;
    case DType::F8_E5M2: return 1;
  }
  NIBBLE_FAIL("unknown dtype code {}", static_cast<int>(dt));
}

std::string_view dtype_name(DType dt) {
  switch (dt) {
    case DType::F64: return "F64";
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::Bool: return "BOOL";
    case DType::F8_E4M3: return "F8_E4M3";
    case DType::F8_E5M2: return "F8_E5M2";
  }
  NIBBLE_FAIL("unknown dtype code {}", static_cast<int>(dt));
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (DType dt : {DType::F64, DType::F32, DType::F16, DType::BF16, DType::I64, DType::I32, DType::I16,
                   DType::I8, DType::U8, DType::Bool, DType::F8_E4M3, DType::F8_E5M2}) {
    if (dtype_name(dt) == name) return dt;
  }
  return std::nullopt;
}

bool dtype_is_float(DType dt) {
  switch (dt) {
    case DType::F64:
    case DType::F32:
    case DType::F16:
    case DType::BF16:
    case DType::F8_E4M3:
    case DType::F8_E5M2:
      return true;
    default:
      return false;
  }
}

uint16_t f32_to_bf16(float x) { return encode_bf16(f32_bits(x)); }
float bf16_to_f32(uint16_t h) { return decode_bf16(h); }
uint16_t f32_to_f16(float x) { return encode_f16(f32_bits(x)); }
float f16_to_f32(uint16_t h) { return decode_f16(h); }
float f8_e4m3_to_f32(uint8_t b) { return decode_e4m3(b); }
float f8_e5m2_to_f32(uint8_t b) { return decode_e5m2(b); }

uint8_t f32_to_f8_e4m3(float x) {
  if (std::isnan(x)) return std::signbit(x) ? 0xFF : 0x7F;
  return static_cast<uint8_t>(encode_minifloat(x, 4, 3, 7, 448.0f));
}

uint8_t f32_to_f8_e5m2(float x) {
  if (std::isnan(x)) return std::signbit(x) ? 0xFE : 0x7E;
  if (std::isinf(x)) return x > 0 ? 0x7C : 0xFC;
  return static_cast<uint8_t>(encode_minifloat(x, 5, 2, 15, 57344.0f));
}

float e2m1_to_f32(uint8_t code) {
  // S.EE.M: exponent 0 is the subnormal binade (0, 0.5); otherwise (1 + M/2) * 2^(E-1).
  static constexpr float kMagnitude[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float v = kMagnitude[code & 0x7];
  return (code & 0x8) ? -v : v;
}

uint8_t f32_to_e2m1(float x) {
  NIBBLE_CHECK(!std::isnan(x), "f32_to_e2m1: NaN has no E2M1 code");
  return static_cast<uint8_t>(encode_minifloat(x, 2, 1, 1, 6.0f));
}

float e2m3_to_f32(uint8_t code) {
  const int e = (code >> 3) & 3, m = code & 7;
  const float v = e == 0 ? static_cast<float>(m) / 8.0f : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 1);
  return (code & 0x20) ? -v : v;
}

float e8m0_to_f32(uint8_t b) { return b == 0xFF ? NAN : std::ldexp(1.0f, static_cast<int>(b) - 127); }

void convert_to_f32(const void* src, DType dt, float* dst, size_t n) {
  if (n == 0) return;
  NIBBLE_CHECK(src != nullptr && dst != nullptr, "convert_to_f32: null buffer for {} elements of {}", n,
               dtype_name(dt));
  switch (dt) {
    case DType::F32:
      if (static_cast<const void*>(dst) != src) std::memcpy(dst, src, n * sizeof(float));
      return;
    case DType::F64:
      // Hardware double -> float conversion rounds to nearest even.
      convert_loop<double>(src, dst, n, [](double v) { return static_cast<float>(v); });
      return;
    case DType::F16:
      convert_loop<uint16_t>(src, dst, n, [](uint16_t v) { return decode_f16(v); });
      return;
    case DType::BF16:
      convert_loop<uint16_t>(src, dst, n, [](uint16_t v) { return decode_bf16(v); });
      return;
    case DType::I64:
      convert_loop<int64_t>(src, dst, n, [](int64_t v) { return static_cast<float>(v); });
      return;
    case DType::I32:
      convert_loop<int32_t>(src, dst, n, [](int32_t v) { return static_cast<float>(v); });
      return;
    case DType::I16:
      convert_loop<int16_t>(src, dst, n, [](int16_t v) { return static_cast<float>(v); });
      return;
    case DType::I8:
      convert_loop<int8_t>(src, dst, n, [](int8_t v) { return static_cast<float>(v); });
      return;
    case DType::U8:
      convert_loop<uint8_t>(src, dst, n, [](uint8_t v) { return static_cast<float>(v); });
      return;
    case DType::Bool:
      // Any non-zero byte is true (safetensors writes 0/1, but be lenient).
      convert_loop<uint8_t>(src, dst, n, [](uint8_t v) { return v != 0 ? 1.0f : 0.0f; });
      return;
    case DType::F8_E4M3: {
      const F8Table& t = f8_table<decode_e4m3>();
      convert_loop<uint8_t>(src, dst, n, [&t](uint8_t v) { return t[v]; });
      return;
    }
    case DType::F8_E5M2: {
      const F8Table& t = f8_table<decode_e5m2>();
      convert_loop<uint8_t>(src, dst, n, [&t](uint8_t v) { return t[v]; });
      return;
    }
  }
  NIBBLE_FAIL("convert_to_f32: unknown dtype code {}", static_cast<int>(dt));
}

void convert_from_f32(const float* src, DType dt, void* dst, size_t n) {
  NIBBLE_CHECK(dt == DType::F32 || dt == DType::F16 || dt == DType::BF16,
               "convert_from_f32: cannot convert to {} (supported targets: F32, F16, BF16)", dtype_name(dt));
  if (n == 0) return;
  NIBBLE_CHECK(src != nullptr && dst != nullptr, "convert_from_f32: null buffer for {} elements", n);
  if (dt == DType::F32) {
    if (dst != static_cast<const void*>(src)) std::memcpy(dst, src, n * sizeof(float));
  } else if (dt == DType::F16) {
    // Blocks of 4096 keep each call long enough to amortize the dispatch.
    constexpr size_t kBlock = 4096;
    const size_t blocks = (n + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (size_t b = 0; b < blocks; ++b) {
      const size_t begin = b * kBlock;
      const size_t count = n - begin < kBlock ? n - begin : kBlock;
      encode_f16_block(src + begin, static_cast<unsigned char*>(dst) + begin * sizeof(uint16_t), count);
    }
  } else {
#pragma omp parallel for schedule(static) if (n >= kParallelMin)
    for (size_t i = 0; i < n; ++i) store<uint16_t>(dst, i, encode_bf16(f32_bits(src[i])));
  }
}

}  // namespace nibble
