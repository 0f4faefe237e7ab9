// The activation quantizers of include/nibble/act_quant.h.
//
//   int8_tensor      scale = absmax(x over the whole [n, dim] matrix) / 127
//   int8_token       scale = absmax(row) / 127, one per token
//   fp8_e4m3_tensor  scale = absmax(x over the whole matrix) / 448
//   llm_int8         bitsandbytes' LLM.int8 (Linear8bitLt, threshold 6): see llm_int8 below
//
//   int8: code = clamp(round_half_even(x / scale), -127, 127), x' = code * scale
//   fp8:  x'   = e4m3_value(e4m3_rne_saturating(x / scale)) * scale
//
// Rounding is half to even because that is what the int8 kernels being
// simulated do: torch.round, CUDA's __float2int_rn and x86's cvtps2dq (default
// MXCSR mode) all round ties to even. Symmetric int8 keeps -128 unused
// (clamp to ±127), as SmoothQuant / vLLM's scaled_int8_quant do, so that the
// scale maps absmax exactly onto ±127. A zero scale (an all-zero matrix or row)
// leaves the zeros as they are. The matrix is the one handed to apply(): one
// linear input of one forward call (all tokens of a prefill at once, one token
// in a decode step).
#include "nibble/act_quant.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "nibble/dtype.h"
#include "nibble/error.h"

namespace nibble {
namespace {

float abs_max(const float* x, int64_t n) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, std::abs(x[i]));
  return m;
}

// code = clamp(rne(x / scale), -127, 127); x = code * scale.
void int8_symmetric(float* x, int64_t n, float amax) {
  if (!(amax > 0.0f)) return;
  const float scale = amax / 127.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float code = std::clamp(std::nearbyint(x[i] / scale), -127.0f, 127.0f);  // default mode: ties to even
    x[i] = code * scale;
  }
}

void int8_tensor(float* x, int64_t n, int64_t dim) { int8_symmetric(x, n * dim, abs_max(x, n * dim)); }

void int8_token(float* x, int64_t n, int64_t dim) {
  for (int64_t i = 0; i < n; ++i) int8_symmetric(x + i * dim, dim, abs_max(x + i * dim, dim));
}

void fp8_e4m3_tensor(float* x, int64_t n, int64_t dim) {
  const float amax = abs_max(x, n * dim);
  if (!(amax > 0.0f)) return;
  const float scale = amax / 448.0f;
  for (int64_t i = 0; i < n * dim; ++i) x[i] = f8_e4m3_to_f32(f32_to_f8_e4m3(x[i] / scale)) * scale;
}

// LLM.int8 as bitsandbytes computes it (int8_vectorwise_quant with threshold
// 6, then int8_mixed_scaled_mm), on x rounded to fp16 as its matmul casts it:
// an input column holding any |x| >= 6 over the call's tokens is an outlier
// column and is multiplied exactly (in the model's dtype, with the weight
// columns dequantized); every other entry is int8 with one scale per token,
// absmax/127 over that token's entries below the threshold (entries of
// outlier columns below it count), code = round_half_even(x · (127/absmax)).
// A token with no such entry keeps zeros (its int8 part is empty).
void llm_int8(float* x, int64_t n, int64_t dim) {
  constexpr float kThreshold = 6.0f;
  std::vector<float> h(static_cast<size_t>(n * dim));
  for (int64_t i = 0; i < n * dim; ++i) h[i] = f16_to_f32(f32_to_f16(x[i]));
  std::vector<char> outlier_col(static_cast<size_t>(dim), 0);
  for (int64_t i = 0; i < n * dim; ++i)
    if (std::abs(h[i]) >= kThreshold) outlier_col[i % dim] = 1;
  for (int64_t r = 0; r < n; ++r) {
    const float* hr = &h[r * dim];
    float* xr = x + r * dim;
    float amax = 0.0f;
    for (int64_t j = 0; j < dim; ++j)
      if (std::abs(hr[j]) < kThreshold) amax = std::max(amax, std::abs(hr[j]));
    const float mul = 127.0f / amax, step = amax / 127.0f;
    for (int64_t j = 0; j < dim; ++j)
      if (!outlier_col[j]) xr[j] = amax > 0.0f ? std::nearbyint(hr[j] * mul) * step : 0.0f;
  }
}

}  // namespace

const std::vector<ActQuantSpec>& act_quants() {
  static const std::vector<ActQuantSpec> rows = {
      {"int8_tensor", "int8, symmetric, one dynamic scale absmax/127 per linear input (all tokens)", 8, int8_tensor},
      {"int8_token", "int8, symmetric, one dynamic scale absmax/127 per token", 8, int8_token},
      {"fp8_e4m3_tensor", "OCP FP8 E4M3, one dynamic scale absmax/448 per linear input (all tokens)", 8,
       fp8_e4m3_tensor},
      {"llm_int8",
       "bitsandbytes' LLM.int8: input columns with any |x| >= 6 exact, the rest int8 per token (absmax/127 over the "
       "entries below 6, on x rounded to fp16)",
       8, llm_int8},
  };
  return rows;
}

std::string act_quant_names() {
  std::string s;
  for (const ActQuantSpec& a : act_quants()) s += (s.empty() ? "" : ", ") + std::string(a.name);
  return s;
}

const ActQuantSpec* find_act_quant(std::string_view name) {
  if (name == "none") return nullptr;
  for (const ActQuantSpec& a : act_quants())
    if (a.name == name) return &a;
  NIBBLE_FAIL("unknown activation quantizer '{}' (known: none, {})", name, act_quant_names());
}

}  // namespace nibble
