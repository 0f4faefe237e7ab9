// The KV-cache schemes of include/nibble/kv_quant.h and the quantized rows
// beside a layer's cache.
#include "nibble/kv_quant.h"

#include <algorithm>
#include <cmath>

#include "nibble/dtype.h"
#include "nibble/error.h"

namespace nibble {
namespace {

// Asymmetric min/max fake quantization of the n values at x[0], x[stride], ...
// into out (same stride): scale = (max - min) / (2^bits - 1), code =
// clamp(round_half_even((x - min) / scale), 0, 2^bits - 1), x' = code * scale + min.
// A constant group (scale 0) comes back exactly.
template <int kBits>
void minmax_group(const float* x, int64_t n, int64_t stride, float* out) {
  constexpr float kLevels = static_cast<float>((1 << kBits) - 1);
  float lo = x[0], hi = x[0];
  for (int64_t i = 1; i < n; ++i) lo = std::min(lo, x[i * stride]), hi = std::max(hi, x[i * stride]);
  const float scale = (hi - lo) / kLevels;
  for (int64_t i = 0; i < n; ++i) {
    if (scale == 0.0f) {
      out[i * stride] = x[i * stride];
      continue;
    }
    const float code = std::clamp(std::nearbyint((x[i * stride] - lo) / scale), 0.0f, kLevels);  // ties to even
    out[i * stride] = code * scale + lo;
  }
}

// KIVI keys: per channel (every element of a row) over each block of G positions.
template <int kBits>
void kivi_keys(const KvQuantSpec& s, const float* rows, int64_t n, const KvLayout& l, float, float* out) {
  const int64_t row = l.row();
  NIBBLE_CHECK(n % s.group == 0, "kv {}: {} key rows are not whole blocks of {}", s.name, n, s.group);
  for (int64_t b = 0; b < n; b += s.group)
    for (int64_t c = 0; c < row; ++c) minmax_group<kBits>(rows + b * row + c, s.group, row, out + b * row + c);
}

// KIVI values: per token over groups of 32 consecutive channels of one head
// (the last group of a head shorter when head_dim is not a multiple of 32).
constexpr int64_t kValueGroup = 32;
template <int kBits>
void kivi_values(const KvQuantSpec&, const float* rows, int64_t n, const KvLayout& l, float, float* out) {
  for (int64_t p = 0; p < n; ++p)
    for (int64_t h = 0; h < l.kv_heads; ++h)
      for (int64_t c0 = 0; c0 < l.head_dim; c0 += kValueGroup) {
        const int64_t off = p * l.row() + h * l.head_dim + c0;
        minmax_group<kBits>(rows + off, std::min(kValueGroup, l.head_dim - c0), 1, out + off);
      }
}

// fp8 E4M3 with one per-tensor scale: absmax / 448 (1 for an all-zero tensor,
// whose zeros any scale keeps).
float fp8_scale(const float* rows, int64_t n, const KvLayout& l) {
  float m = 0.0f;
  for (int64_t i = 0; i < n * l.row(); ++i) m = std::max(m, std::abs(rows[i]));
  return m > 0.0f ? m / 448.0f : 1.0f;
}

// x' = e4m3_value(e4m3_rne_saturating(x / scale)) * scale.
void fp8_rows(const KvQuantSpec&, const float* rows, int64_t n, const KvLayout& l, float scale, float* out) {
  for (int64_t i = 0; i < n * l.row(); ++i) out[i] = f8_e4m3_to_f32(f32_to_f8_e4m3(rows[i] / scale)) * scale;
}

// bf16: every element rounded to the nearest bf16 (ties to even), as the GPU
// forward's bf16 cache stores it (cuda::GpuOptions::kv_dtype).
void bf16_rows(const KvQuantSpec&, const float* rows, int64_t n, const KvLayout& l, float, float* out) {
  for (int64_t i = 0; i < n * l.row(); ++i) out[i] = round_to_bf16(rows[i]);
}

}  // namespace

const std::vector<KvQuantSpec>& kv_quants() {
  static const std::vector<KvQuantSpec> rows = {
      {"int8", "KIVI int8: keys per channel in blocks of 32 positions, values per token in groups of 32 channels, "
               "asymmetric; newest 128..159 positions f32",
       8, 128, 32, nullptr, kivi_keys<8>, kivi_values<8>, std::nullopt},
      {"int4", "KIVI int4: keys per channel in blocks of 32 positions, values per token in groups of 32 channels, "
               "asymmetric; newest 128..159 positions f32",
       4, 128, 32, nullptr, kivi_keys<4>, kivi_values<4>, std::nullopt},
      {"fp8_e4m3", "OCP FP8 E4M3, one scale per layer for K and for V (absmax/448 of the first forward call), "
                   "every position",
       8, 0, 1, fp8_scale, fp8_rows, fp8_rows, std::nullopt},
      {"bf16", "bf16 (round to nearest even), every position: half the bytes of f32; the cache --device cuda "
               "holds natively",
       16, 0, 1, nullptr, bf16_rows, bf16_rows, DType::BF16},
  };
  return rows;
}

std::string kv_quant_names() {
  std::string s;
  for (const KvQuantSpec& k : kv_quants()) s += (s.empty() ? "" : ", ") + std::string(k.name);
  return s;
}

const KvQuantSpec* find_kv_quant(std::string_view name) {
  if (name == "none") return nullptr;
  for (const KvQuantSpec& k : kv_quants())
    if (k.name == name) return &k;
  NIBBLE_FAIL("unknown KV-cache quantization '{}' (known: none, {})", name, kv_quant_names());
}

DType kv_device_dtype(const KvQuantSpec* kv, std::string_view what) {
  if (kv == nullptr) return DType::F32;
  NIBBLE_CHECK(kv->device_dtype.has_value(),
               "{}: --kv {} is simulated on the CPU only; the GPU holds the KV cache as f32 (none) or bf16 (use "
               "--device cpu for {})", what, kv->name, kv->name);
  return *kv->device_dtype;
}

void KvCacheRows::update(const float* keys, const float* values, int64_t T, const KvLayout& l) {
  const KvQuantSpec& s = *spec_;
  if (!started_) {
    started_ = true;
    if (s.tensor_scale) {
      key_scale_ = s.tensor_scale(keys, T, l);
      value_scale_ = s.tensor_scale(values, T, l);
    }
  }
  const int64_t b = s.boundary(T), row = l.row();
  if (b <= quantized_) return;
  k_.resize(static_cast<size_t>(b * row));
  v_.resize(static_cast<size_t>(b * row));
  const int64_t q0 = quantized_;
  s.keys(s, keys + q0 * row, b - q0, l, key_scale_, k_.data() + q0 * row);
  s.values(s, values + q0 * row, b - q0, l, value_scale_, v_.data() + q0 * row);
  quantized_ = b;
}

void KvCacheRows::clear() {
  k_.clear();
  v_.clear();
  quantized_ = 0;
  started_ = false;
  key_scale_ = value_scale_ = 0.0f;
}

}  // namespace nibble
