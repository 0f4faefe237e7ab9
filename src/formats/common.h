// Pieces the format files share: part checking, bit packing of codes, and the
// scaffolding of an unpacked matrix. Format-neutral: nothing here knows a row.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>
#include <vector>

#include "nibble/dtype.h"
#include "nibble/error.h"
#include "nibble/format.h"

namespace nibble::formats {

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Checks the stored parts against the row's parts() (count, dtype, shape).
inline void check_parts(const FormatSpec& f, const std::vector<Tensor>& in, int64_t rows, int64_t cols, int g) {
  const auto expect = f.parts(rows, cols, g);
  NIBBLE_CHECK(in.size() == expect.size(), "{}: expected {} parts, found {}", f.canonical_name(g), expect.size(),
               in.size());
  for (size_t i = 0; i < expect.size(); ++i) {
    NIBBLE_CHECK(in[i].dtype() == expect[i].dtype && in[i].shape() == expect[i].shape,
                 "{} {}: expected {} {}, found {} {}", f.canonical_name(g), expect[i].suffix,
                 dtype_name(expect[i].dtype), shape_str(expect[i].shape), dtype_name(in[i].dtype()),
                 shape_str(in[i].shape()));
  }
}

// An unpacked matrix of the right sizes, codes and parameters zeroed.
inline QuantizedMatrix empty_matrix(const FormatSpec& f, int64_t rows, int64_t cols, int g) {
  QuantizedMatrix q;
  q.format = &f;
  q.group_size = g;
  q.rows = rows;
  q.cols = cols;
  q.codes.assign(static_cast<size_t>(rows * cols), 0);
  q.params.assign(static_cast<size_t>(rows * q.groups_per_row()), GroupParams{});
  return q;
}

// Bytes per row when each code takes `bits` bits.
inline int64_t packed_row_bytes(int64_t cols, int bits) { return ceil_div(cols * bits, 8); }

// Codes of `bits` bits each, packed per row as a little-endian bit stream:
// code i of a row occupies bits [i·bits, (i+1)·bits) of the row, bit k of the
// row being bit (k mod 8) of byte floor(k / 8). Each row starts on a fresh
// byte; the unused high bits of a row's last byte are 0. For 4-bit codes this
// is "element 2j in the low nibble of byte j"; for 8-bit codes, one byte each.
inline Tensor pack_codes(const QuantizedMatrix& q, int bits, DType dtype = DType::U8) {
  const int64_t bpr = packed_row_bytes(q.cols, bits);
  Tensor t = Tensor::zeros(dtype, {q.rows, bpr});
  uint8_t* out = static_cast<uint8_t*>(t.raw_mut());
  const uint32_t mask = (1u << bits) - 1;
#pragma omp parallel for schedule(static) if (q.rows > 64)
  for (int64_t r = 0; r < q.rows; ++r) {
    const uint8_t* c = q.codes.data() + r * q.cols;
    uint8_t* b = out + r * bpr;
    for (int64_t i = 0; i < q.cols; ++i) {
      const uint32_t v = (c[i] & mask) << ((i * bits) % 8);  // at most 15 bits wide
      const int64_t byte = i * bits / 8;
      b[byte] = static_cast<uint8_t>(b[byte] | (v & 0xFF));
      if (v >> 8) b[byte + 1] = static_cast<uint8_t>(b[byte + 1] | (v >> 8));
    }
  }
  return t;
}

inline void unpack_codes(const Tensor& packed, int bits, QuantizedMatrix& q) {
  const Tensor t = packed.contiguous();
  const int64_t bpr = packed_row_bytes(q.cols, bits);
  const uint8_t* in = static_cast<const uint8_t*>(t.raw());
  const uint32_t mask = (1u << bits) - 1;
#pragma omp parallel for schedule(static) if (q.rows > 64)
  for (int64_t r = 0; r < q.rows; ++r) {
    const uint8_t* b = in + r * bpr;
    uint8_t* c = q.codes.data() + r * q.cols;
    for (int64_t i = 0; i < q.cols; ++i) {
      const int64_t bit = i * bits, byte = bit / 8;
      uint32_t v = b[byte];
      if (bit % 8 + bits > 8) v |= static_cast<uint32_t>(b[byte + 1]) << 8;
      c[i] = static_cast<uint8_t>((v >> (bit % 8)) & mask);
    }
  }
}

// Element i of a stored part as fp32 / as a byte, whatever the part's
// alignment in its file (parts may be views into a mapping at any offset).
inline float part_f32(const Tensor& t, int64_t i) {
  float v;
  std::memcpy(&v, static_cast<const uint8_t*>(t.raw()) + i * 4, 4);
  return v;
}
inline uint16_t part_u16(const Tensor& t, int64_t i) {
  uint16_t v;
  std::memcpy(&v, static_cast<const uint8_t*>(t.raw()) + i * 2, 2);
  return v;
}
inline uint8_t part_u8(const Tensor& t, int64_t i) { return static_cast<const uint8_t*>(t.raw())[i]; }

// One field of every group's parameters as a stored part [rows, groups of a
// row] of dtype F32, F16 or BF16 (rounded to nearest even), and back.
inline Tensor params_part(const QuantizedMatrix& q, float GroupParams::*field, DType dtype) {
  Tensor t = Tensor::zeros(dtype, {q.rows, q.groups_per_row()});
  for (size_t i = 0; i < q.params.size(); ++i) {
    const float v = q.params[i].*field;
    if (dtype == DType::F32)
      t.data_mut<float>()[i] = v;
    else
      t.data_mut<uint16_t>()[i] = dtype == DType::F16 ? f32_to_f16(v) : f32_to_bf16(v);
  }
  return t;
}
inline void params_from_part(const Tensor& part, float GroupParams::*field, QuantizedMatrix& q) {
  const Tensor t = part.contiguous();
  NIBBLE_CHECK(t.dtype() == DType::F32 || t.dtype() == DType::F16 || t.dtype() == DType::BF16,
               "parameter part of dtype {}: expected F32, F16 or BF16", dtype_name(t.dtype()));
  for (size_t i = 0; i < q.params.size(); ++i) {
    const auto k = static_cast<int64_t>(i);
    q.params[i].*field = t.dtype() == DType::F32   ? part_f32(t, k)
                         : t.dtype() == DType::F16 ? f16_to_f32(part_u16(t, k))
                                                   : bf16_to_f32(part_u16(t, k));
  }
}

// Largest |w| of n values.
inline float abs_max(const float* w, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::fabs(w[i]));
  return m;
}

// A symmetric format's scale stored in f16 (int4_sym, int8_sym): f16(amax / max_code), rounded before any code is
// chosen, so codes are picked against the scale the dequantizer will read; `family` names the format in the error
// for a scale beyond the f16 range.
inline float f16_absmax_scale(float amax, float max_code, std::string_view family) {
  const float s = f16_to_f32(f32_to_f16(amax / max_code));
  NIBBLE_CHECK(std::isfinite(s), "{}: group absmax {} gives a scale beyond the f16 range", family, amax);
  return s;
}

// The affine view of a format whose one parameter is that f16 scale (no min): GPTQ's and refine's refits store the
// nearest f16.
inline double stored_scale(const GroupParams& p) { return p.scale; }
inline GroupParams store_f16_scale(const GroupParams&, double scale, double) {
  GroupParams p;
  p.scale = f16_to_f32(f32_to_f16(static_cast<float>(scale)));
  return p;
}
inline constexpr AffineParams kF16ScaleAffine{stored_scale, false, store_f16_scale};

// Symmetric int8 codes held in a byte as two's complement, for any scale (int8_channel_sym, int8_sym):
// clamp(round_half_even(w / scale), −127, 127), 0 when the scale is 0; the value is code · scale.
inline uint8_t encode_int8_sym(float w, const GroupParams& p) {
  if (p.scale == 0.0f) return 0;
  const float q = std::clamp(std::nearbyint(w / p.scale), -127.0f, 127.0f);
  return static_cast<uint8_t>(static_cast<int8_t>(q));
}
inline float decode_int8_sym(uint8_t code, const GroupParams& p) {
  return static_cast<float>(static_cast<int8_t>(code)) * p.scale;
}

}  // namespace nibble::formats
