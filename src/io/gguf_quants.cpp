// ggml's tensor types: the size table and the reference dequantizers.
//
// Each dequantizer is written from the block layout ggml-common.h defines and
// computes what ggml-quants.c's dequantize_row_* computes, with the same
// float operations in the same order (the build has -ffp-contract=off, so no
// FMA changes a rounding): int codes times an f16 scale, plus (Q4_1, Q5_1) or
// minus (Q4_K, Q5_K) an f16 min, which is what gguf-py's numpy dequantizers
// compute too, so the two agree bit for bit.
//
// Block layouts (all little-endian; "d" and "m"/"dmin" are IEEE f16):
//   Q8_0   34 B / 32: d, int8 q[32]                        x = q·d
//   Q4_0   18 B / 32: d, u8 qs[16]                         x[j] = (lo(qs[j]) − 8)·d, x[j+16] = (hi(qs[j]) − 8)·d
//   Q4_1   20 B / 32: d, m, u8 qs[16]                      x = q·d + m
//   Q5_0   22 B / 32: d, u32 qh, u8 qs[16]                 5th bit of x[j] is bit j of qh; x = (q − 16)·d
//   Q5_1   24 B / 32: d, m, u32 qh, u8 qs[16]              x = q·d + m
//   IQ4_NL 18 B / 32: d, u8 qs[16]                         x = d·kvalues[q] (a fixed non-uniform 16-level grid)
//   Q4_K  144 B / 256: d, dmin, u8 scales[12], u8 qs[128]  8 sub-blocks of 32 with 6-bit scale sc and min mn:
//                                                          x = (d·sc)·q − (dmin·mn)
//   Q5_K  176 B / 256: d, dmin, scales[12], u8 qh[32], qs[128]   as Q4_K with a 5th bit from qh
//   Q6_K  210 B / 256: u8 ql[128], u8 qh[64], int8 scales[16], d  16 sub-blocks of 16: x = (d·sc)·(q − 32)
//   Q2_K   84 B / 256: u8 scales[16], u8 qs[64], d, dmin    16 sub-blocks of 16, 4-bit scale sc and min mn
//                                                          per sub-block: x = (d·sc)·q − dmin·mn, q in 0..3
//   Q3_K  110 B / 256: u8 hmask[32], u8 qs[64], scales[12], d   16 sub-blocks of 16 with 6-bit scales:
//                                                          x = (d·(sc − 32))·q, q = 2 low bits − 4 unless the hmask bit
//   IQ4_XS 136 B / 256: d, u16 scales_h, u8 scales_l[4], qs[128]   8 sub-blocks of 32 with 6-bit scales:
//                                                          x = (d·(sc − 32))·kvalues[q] (IQ4_NL's grid)
//   TQ2_0  66 B / 256: u8 qs[64], d                        x = (q − 1)·d, q in 0..2 (2 bits each)
//   TQ1_0  54 B / 256: u8 qs[48], u8 qh[4], d              the same ternary digits, five (qs) or four (qh) per
//                                                          byte in base 3, scaled to a byte as ⌈v·256 / 243⌉
//   MXFP4  17 B / 32: u8 e (E8M0), u8 qs[16]               x = 2^(e−127) · e2m1[q] (OCP microscaling)
//   NVFP4  36 B / 64: u8 s[4] (UE4M3), u8 qs[32]           4 sub-blocks of 16: x = ue4m3(s)·e2m1[q] (no
//                                                          per-tensor scale in the block)
#include <algorithm>
#include <cmath>
#include <cstring>

#include "nibble/dtype.h"
#include "nibble/error.h"
#include "nibble/gguf.h"

namespace nibble::io {

// Bytes 0-3 hold the low 6 bits of scales 0-3, bytes 4-7 those of mins
// 0-3; for j >= 4 the low 4 bits sit in the nibbles of bytes 8-11 (scale low,
// min high) and the top 2 bits in the spare top bits of bytes 0-7.
void ggml_k_scale_min(int j, const uint8_t* s, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// IQ4_NL's grid (ggml-common.h kvalues_iq4nl): 16 levels fitted to the
// distribution of LLM weights, denser near zero.
const int8_t kGgmlIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

namespace {

constexpr int64_t kQK = 32;    // block size of the legacy types (QK4_0, QK8_0, ...)
constexpr int64_t kQKK = 256;  // super-block size of the K types (QK_K)

inline float f16(const uint8_t* p) { return f16_to_f32(static_cast<uint16_t>(p[0] | (p[1] << 8))); }
inline uint32_t u32le(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

void deq_f32(const uint8_t* b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = u32le(b + 4 * i);
    std::memcpy(&y[i], &bits, 4);
  }
}

void deq_f16(const uint8_t* b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = f16(b + 2 * i);
}

void deq_bf16(const uint8_t* b, int64_t n, float* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_f32(static_cast<uint16_t>(b[2 * i] | (b[2 * i + 1] << 8)));
}

void deq_q8_0(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 34, y += kQK) {
    const float d = f16(b);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
  }
}

void deq_q4_0(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 18, y += kQK) {
    const float d = f16(b);
    const uint8_t* qs = b + 2;
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>((qs[j] & 0x0F) - 8) * d;
      y[j + kQK / 2] = static_cast<float>((qs[j] >> 4) - 8) * d;
    }
  }
}

void deq_q4_1(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 20, y += kQK) {
    const float d = f16(b), m = f16(b + 2);
    const uint8_t* qs = b + 4;
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = static_cast<float>(qs[j] & 0x0F) * d + m;
      y[j + kQK / 2] = static_cast<float>(qs[j] >> 4) * d + m;
    }
  }
}

// The 5-bit codes of a Q5_0/Q5_1 block: low nibbles from qs, bit j of qh is
// the 5th bit of element j (elements 0..15 take the low nibbles, 16..31 the
// high ones).
inline void q5_codes(const uint8_t* qh_bytes, const uint8_t* qs, int q[kQK]) {
  const uint32_t qh = u32le(qh_bytes);
  for (int j = 0; j < kQK / 2; ++j) {
    q[j] = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    q[j + kQK / 2] = (qs[j] >> 4) | static_cast<int>(((qh >> (j + kQK / 2)) & 1u) << 4);
  }
}

void deq_q5_0(const uint8_t* b, int64_t nb, float* y) {
  int q[kQK];
  for (int64_t i = 0; i < nb; ++i, b += 22, y += kQK) {
    const float d = f16(b);
    q5_codes(b + 2, b + 6, q);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q[j] - 16) * d;
  }
}

void deq_q5_1(const uint8_t* b, int64_t nb, float* y) {
  int q[kQK];
  for (int64_t i = 0; i < nb; ++i, b += 24, y += kQK) {
    const float d = f16(b), m = f16(b + 2);
    q5_codes(b + 4, b + 8, q);
    for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(q[j]) * d + m;
  }
}

void deq_iq4_nl(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 18, y += kQK) {
    const float d = f16(b);
    const uint8_t* qs = b + 2;
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * static_cast<float>(kGgmlIq4nlValues[qs[j] & 0x0F]);
      y[j + kQK / 2] = d * static_cast<float>(kGgmlIq4nlValues[qs[j] >> 4]);
    }
  }
}

// Q4_K and Q5_K share the super-block arithmetic; qh is null for Q4_K.
// Per 64 elements: the first 32 are the low nibbles of 32 qs bytes (sub-block
// 2k), the next 32 the high nibbles (sub-block 2k+1); Q5_K's 5th bit of
// element l of sub-block s is bit s of qh[l].
inline void deq_k_super(const uint8_t* scales, const uint8_t* qh, const uint8_t* qs, float d, float dmin, float* y) {
  for (int k = 0; k < 4; ++k) {
    int sc1, m1, sc2, m2;
    ggml_k_scale_min(2 * k, scales, sc1, m1);
    ggml_k_scale_min(2 * k + 1, scales, sc2, m2);
    const float d1 = d * static_cast<float>(sc1), min1 = dmin * static_cast<float>(m1);
    const float d2 = d * static_cast<float>(sc2), min2 = dmin * static_cast<float>(m2);
    const uint8_t* q = qs + 32 * k;
    for (int l = 0; l < 32; ++l) {
      int lo = q[l] & 0x0F, hi = q[l] >> 4;
      if (qh) {
        lo |= ((qh[l] >> (2 * k)) & 1) << 4;
        hi |= ((qh[l] >> (2 * k + 1)) & 1) << 4;
      }
      y[64 * k + l] = d1 * static_cast<float>(lo) - min1;
      y[64 * k + 32 + l] = d2 * static_cast<float>(hi) - min2;
    }
  }
}

void deq_q4_k(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 144, y += kQKK) deq_k_super(b + 4, nullptr, b + 16, f16(b), f16(b + 2), y);
}

void deq_q5_k(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 176, y += kQKK) deq_k_super(b + 4, b + 16, b + 48, f16(b), f16(b + 2), y);
}

// Q6_K: two halves of 128. In half h, element l (0..31) of each of the four
// 32-runs takes its low 4 bits from ql (runs 0/1: low nibbles of ql[l] and
// ql[l+32]; runs 2/3: their high nibbles) and its top 2 bits from qh[l]
// (bits 0-1, 2-3, 4-5, 6-7 for runs 0..3). Each 16 elements have an int8
// scale; the product is (d·scale)·(q − 32), as ggml evaluates d * sc[is] * q.
void deq_q6_k(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 210, y += kQKK) {
    const float d = f16(b + 208);
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b + 64 * h;
      const uint8_t* qh = b + 128 + 32 * h;
      const auto* sc = reinterpret_cast<const int8_t*>(b + 192 + 8 * h);
      float* yh = y + 128 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        yh[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
        yh[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
        yh[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
        yh[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

// The 2-bit codes of Q2_K, Q3_K and TQ2_0 (64 bytes per 256 elements): two
// halves of 128; in half h, the four 2-bit fields (shift 0, 2, 4, 6) of
// qs[32h + l] are elements 128h + 32s + l.
inline int two_bit_code(const uint8_t* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * ((e / 32) % 4))) & 3; }

// Q2_K: element e is in sub-block e / 16, whose scales byte holds the scale
// (low nibble) and the min (high nibble).
void deq_q2_k(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 84, y += kQKK) {
    const uint8_t* scales = b;
    const uint8_t* qs = b + 16;
    const float d = f16(b + 80), dmin = f16(b + 82);
    for (int e = 0; e < kQKK; ++e) {
      const uint8_t sc = scales[e / 16];
      const float dl = d * static_cast<float>(sc & 0x0F), ml = dmin * static_cast<float>(sc >> 4);
      y[e] = dl * static_cast<float>(two_bit_code(qs, e)) - ml;
    }
  }
}

// Q3_K: the low 2 bits as Q2_K's; the third from bit e / 32 of hmask[e % 32],
// which when clear subtracts 4. Scale j (0..15, per sub-block of 16): low 4
// bits from the nibble (j / 8) of byte j % 8, high 2 bits from bits
// 2·(j / 4) of byte 8 + j % 4, minus 32.
void deq_q3_k(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 110, y += kQKK) {
    const uint8_t* hmask = b;
    const uint8_t* qs = b + 32;
    const uint8_t* sb = b + 96;
    const float d = f16(b + 108);
    float dl[16];
    for (int j = 0; j < 16; ++j) {
      const int sc = ((sb[j % 8] >> (4 * (j / 8))) & 0x0F) | (((sb[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
      dl[j] = d * static_cast<float>(sc - 32);
    }
    for (int e = 0; e < kQKK; ++e) {
      const int q = two_bit_code(qs, e) - (((hmask[e % 32] >> (e / 32)) & 1) ? 0 : 4);
      y[e] = dl[e / 16] * static_cast<float>(q);
    }
  }
}

// IQ4_XS: sub-block k (32 elements) has scale ((scales_l[k / 2] >> 4(k % 2))
// & 15) | ((scales_h >> 2k) & 3) << 4, minus 32; its elements are the low
// nibbles of qs[16k .. 16k + 15], then the high ones, through IQ4_NL's grid.
void deq_iq4_xs(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 136, y += kQKK) {
    const float d = f16(b);
    const unsigned scales_h = b[2] | (b[3] << 8);
    const uint8_t* scales_l = b + 4;
    const uint8_t* qs = b + 8;
    for (int k = 0; k < kQKK / 32; ++k) {
      const int ls = ((scales_l[k / 2] >> (4 * (k % 2))) & 0x0F) | (((scales_h >> (2 * k)) & 3) << 4);
      const float dl = d * static_cast<float>(ls - 32);
      for (int j = 0; j < 16; ++j) {
        y[32 * k + j] = dl * static_cast<float>(kGgmlIq4nlValues[qs[16 * k + j] & 0x0F]);
        y[32 * k + 16 + j] = dl * static_cast<float>(kGgmlIq4nlValues[qs[16 * k + j] >> 4]);
      }
    }
  }
}

// TQ2_0: the 2-bit code minus 1.
void deq_tq2_0(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 66, y += kQKK) {
    const float d = f16(b + 64);
    for (int e = 0; e < kQKK; ++e) y[e] = static_cast<float>(two_bit_code(b, e) - 1) * d;
  }
}

// TQ1_0: a byte v holding the base-3 digits t0 t1 t2 t3 t4 (t0 most
// significant) as v = ⌈(81 t0 + 27 t1 + 9 t2 + 3 t3 + t4)·256 / 243⌉ gives its
// n-th digit as ((v·3^n mod 256)·3) >> 8. Elements: digit n of qs[l] for the
// first 32 bytes is element 32n + l; of qs[32 + l] (16 bytes) element
// 160 + 16n + l; digit n (0..3) of qh[l] element 240 + 4n + l.
void deq_tq1_0(const uint8_t* b, int64_t nb, float* y) {
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  auto trit = [](uint8_t v, int n) {
    const auto q = static_cast<uint8_t>(v * kPow3[n]);  // mod 256
    return ((static_cast<uint16_t>(q) * 3) >> 8) - 1;
  };
  for (int64_t i = 0; i < nb; ++i, b += 54, y += kQKK) {
    const uint8_t* qs = b;
    const uint8_t* qh = b + 48;
    const float d = f16(b + 52);
    float* o = y;
    for (int n = 0; n < 5; ++n)
      for (int l = 0; l < 32; ++l) *o++ = static_cast<float>(trit(qs[l], n)) * d;
    for (int n = 0; n < 5; ++n)
      for (int l = 0; l < 16; ++l) *o++ = static_cast<float>(trit(qs[32 + l], n)) * d;
    for (int n = 0; n < 4; ++n)
      for (int l = 0; l < 4; ++l) *o++ = static_cast<float>(trit(qh[l], n)) * d;
  }
}

// MXFP4: E2M1 values doubled (integers), times half the E8M0 scale 2^(e−127),
// which is 2^(e−128): the float with exponent field e − 1, or for e < 2 the
// subnormal 2^(e−128) (bit 21 + e of the fraction).
constexpr int8_t kE2m1Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

void deq_mxfp4(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 17, y += kQK) {
    const uint32_t e = b[0];
    const uint32_t bits = e < 2 ? 0x00200000u << e : (e - 1) << 23;
    float d;
    std::memcpy(&d, &bits, 4);
    const uint8_t* qs = b + 1;
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * static_cast<float>(kE2m1Doubled[qs[j] & 0x0F]);
      y[j + kQK / 2] = d * static_cast<float>(kE2m1Doubled[qs[j] >> 4]);
    }
  }
}

// NVFP4: sub-block k (16 elements) takes the UE4M3 scale byte s[k] (4-bit
// exponent, bias 7, 3-bit mantissa; 0x7F, its NaN, reads as 0) and the low
// nibbles of qs[8k .. 8k + 7], then their high nibbles. As MXFP4, the E2M1
// values are doubled integers and the scale is halved. (dtype.h's OCP decoders
// differ at the edges ggml defines its own way: e2m1_to_f32 gives −0 for code 8
// and f8_e4m3_to_f32 NaN for 0x7F, where ggml gives +0 and 0.)
float ue4m3_half(uint8_t x) {
  if (x == 0 || x == 0x7F) return 0.0f;
  const int e = (x >> 3) & 0x0F, m = x & 7;
  const float v = e == 0 ? std::ldexp(static_cast<float>(m), -9) : std::ldexp(1.0f + static_cast<float>(m) / 8.0f, e - 7);
  return v * 0.5f;
}

void deq_nvfp4(const uint8_t* b, int64_t nb, float* y) {
  for (int64_t i = 0; i < nb; ++i, b += 36, y += 64) {
    const uint8_t* qs = b + 4;
    for (int k = 0; k < 4; ++k) {
      const float d = ue4m3_half(b[k]);
      for (int j = 0; j < 8; ++j) {
        y[16 * k + j] = d * static_cast<float>(kE2m1Doubled[qs[8 * k + j] & 0x0F]);
        y[16 * k + 8 + j] = d * static_cast<float>(kE2m1Doubled[qs[8 * k + j] >> 4]);
      }
    }
  }
}

}  // namespace

const std::vector<GgmlTypeTraits>& ggml_type_table() {
  using T = GgmlType;
  // Sizes as ggml.c's type_traits (QK_K = 256). Types without a dequantizer
  // are listed so files holding them open and are bounds-checked.
  static const std::vector<GgmlTypeTraits> rows = {
      {T::F32, "F32", 1, 4, deq_f32},
      {T::F16, "F16", 1, 2, deq_f16},
      {T::BF16, "BF16", 1, 2, deq_bf16},
      {T::Q8_0, "Q8_0", kQK, 34, deq_q8_0},
      {T::Q4_0, "Q4_0", kQK, 18, deq_q4_0},
      {T::Q4_1, "Q4_1", kQK, 20, deq_q4_1},
      {T::Q5_0, "Q5_0", kQK, 22, deq_q5_0},
      {T::Q5_1, "Q5_1", kQK, 24, deq_q5_1},
      {T::IQ4_NL, "IQ4_NL", kQK, 18, deq_iq4_nl},
      {T::Q4_K, "Q4_K", kQKK, 144, deq_q4_k},
      {T::Q5_K, "Q5_K", kQKK, 176, deq_q5_k},
      {T::Q6_K, "Q6_K", kQKK, 210, deq_q6_k},
      {T::Q8_1, "Q8_1", kQK, 40, nullptr},
      {T::Q2_K, "Q2_K", kQKK, 84, deq_q2_k},
      {T::Q3_K, "Q3_K", kQKK, 110, deq_q3_k},
      {T::Q8_K, "Q8_K", kQKK, 292, nullptr},
      {T::IQ2_XXS, "IQ2_XXS", kQKK, 66, nullptr},
      {T::IQ2_XS, "IQ2_XS", kQKK, 74, nullptr},
      {T::IQ3_XXS, "IQ3_XXS", kQKK, 98, nullptr},
      {T::IQ1_S, "IQ1_S", kQKK, 50, nullptr},
      {T::IQ3_S, "IQ3_S", kQKK, 110, nullptr},
      {T::IQ2_S, "IQ2_S", kQKK, 82, nullptr},
      {T::IQ4_XS, "IQ4_XS", kQKK, 136, deq_iq4_xs},
      {T::I8, "I8", 1, 1, nullptr},
      {T::I16, "I16", 1, 2, nullptr},
      {T::I32, "I32", 1, 4, nullptr},
      {T::I64, "I64", 1, 8, nullptr},
      {T::F64, "F64", 1, 8, nullptr},
      {T::IQ1_M, "IQ1_M", kQKK, 56, nullptr},
      {T::TQ1_0, "TQ1_0", kQKK, 54, deq_tq1_0},
      {T::TQ2_0, "TQ2_0", kQKK, 66, deq_tq2_0},
      {T::MXFP4, "MXFP4", kQK, 17, deq_mxfp4},
      {T::NVFP4, "NVFP4", 64, 36, deq_nvfp4},
      {T::Q1_0, "Q1_0", 128, 18, nullptr},
  };
  return rows;
}

const GgmlTypeTraits* ggml_type_traits(uint32_t type_id) {
  for (const GgmlTypeTraits& t : ggml_type_table())
    if (static_cast<uint32_t>(t.type) == type_id) return &t;
  return nullptr;
}

std::string ggml_type_name(uint32_t type_id) {
  const GgmlTypeTraits* t = ggml_type_traits(type_id);
  return t ? std::string(t->name) : fmt::format("unknown type {}", type_id);
}

std::string ggml_dequantizable_types() {
  std::string out;
  for (const GgmlTypeTraits& t : ggml_type_table()) {
    if (!t.dequantize) continue;
    if (!out.empty()) out += ", ";
    out += t.name;
  }
  return out;
}

void ggml_dequantize(uint32_t type_id, const uint8_t* src, size_t src_bytes, float* dst, int64_t n) {
  const GgmlTypeTraits* t = ggml_type_traits(type_id);
  NIBBLE_CHECK(t, "ggml {} cannot be dequantized (supported: {})", ggml_type_name(type_id),
               ggml_dequantizable_types());
  NIBBLE_CHECK(t->dequantize, "ggml type {} is not supported by nibble's dequantizer (supported: {})", t->name,
               ggml_dequantizable_types());
  NIBBLE_CHECK(n >= 0 && n % t->block_size == 0, "ggml type {}: {} elements are not a whole number of {}-blocks",
               t->name, n, t->block_size);
  const int64_t blocks = n / t->block_size;
  NIBBLE_CHECK(src_bytes == static_cast<size_t>(blocks * t->type_size),
               "ggml type {}: {} elements need {} bytes, found {}", t->name, n, blocks * t->type_size, src_bytes);
  // Blocks are independent: split them over threads in runs big enough that
  // a small tensor is not worth waking the pool for.
  constexpr int64_t kRun = 4096;
  const int64_t runs = (blocks + kRun - 1) / kRun;
#pragma omp parallel for schedule(static) if (runs > 1)
  for (int64_t r = 0; r < runs; ++r) {
    const int64_t b0 = r * kRun, nb = std::min(kRun, blocks - b0);
    t->dequantize(src + b0 * t->type_size, nb, dst + b0 * t->block_size);
  }
}

}  // namespace nibble::io
