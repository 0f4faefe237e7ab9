// Element types and exact conversions between them.
//
// The names are safetensors' dtype names (F32, BF16, ...). fp32 -> bf16 and
// fp32 -> f16 round to nearest, ties to even; NaN stays NaN (quiet, sign kept);
// overflow goes to infinity as IEEE rounding says. Decoding is exact.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace nibble {

enum class DType : uint8_t {
  F64, F32, F16, BF16, I64, I32, I16, I8, U8, Bool, F8_E4M3, F8_E5M2,
};

// Bytes per element.
size_t dtype_size(DType dt);
// The safetensors spelling ("F32", "BF16", "F8_E4M3", ...).
std::string_view dtype_name(DType dt);
// Parses a safetensors dtype name; nullopt when unknown.
std::optional<DType> dtype_from_name(std::string_view name);
// Floating-point types (can hold weights to be quantized or dequantized).
bool dtype_is_float(DType dt);

// Scalar conversions (bit patterns in, bit patterns out).
uint16_t f32_to_bf16(float x);
float bf16_to_f32(uint16_t h);
uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t h);
float f8_e4m3_to_f32(uint8_t b);  // OCP E4M3 (fn): no infinities, S.1111.111 is NaN
float f8_e5m2_to_f32(uint8_t b);  // OCP E5M2: IEEE-like, with infinities

// fp32 -> OCP FP8, round to nearest even, saturating: a finite value beyond the
// largest finite one (E4M3 448, E5M2 57344) becomes that value, with its sign.
// E4M3 has no infinities: ±inf saturates too, NaN becomes S.1111.111. E5M2
// keeps ±inf as ±inf and NaN as S.11111.10. Every finite code round-trips:
// f32_to_f8_*(f8_*_to_f32(b)) == b.
uint8_t f32_to_f8_e4m3(float x);
uint8_t f32_to_f8_e5m2(float x);
// OCP FP4 E2M1 (the MX element type): S.EE.M in the low 4 bits, bias 1, values
// ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}, no infinities or NaN.
float e2m1_to_f32(uint8_t code);  // bits above the low 4 are ignored
// Round to nearest even, saturating to ±6 (±inf too); NaN has no E2M1 code and is an error.
uint8_t f32_to_e2m1(float x);
// OCP FP6 E2M3 (MXFP6's element type): S.EE.MMM in the low 6 bits, bias 1,
// magnitudes M/8 (E = 0) and (1 + M/8) · 2^(E-1), largest 7.5, no infinities or NaN.
float e2m3_to_f32(uint8_t code);  // bits above the low 6 are ignored
// OCP E8M0 (the MX shared scale): 2^(b - 127), b = 0xFF is NaN.
float e8m0_to_f32(uint8_t b);

// Rounds x to the nearest bf16 value and returns it as float (RNE).
inline float round_to_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// Converts n elements of any dtype to fp32 (integers and bools by value).
void convert_to_f32(const void* src, DType dt, float* dst, size_t n);
// Converts n fp32 values to F32, F16 or BF16 (round to nearest even).
void convert_from_f32(const float* src, DType dt, void* dst, size_t n);

}  // namespace nibble
