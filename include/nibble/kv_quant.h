// KV-cache quantization, simulated in the f32 forward (issue 7). The cache
// keeps its f32 rows; a KvCacheRows beside it holds the dequantized form of
// every row a real quantized cache would by now store quantized, and attention
// reads, for each (query, key) pair, exactly what that cache would return.
//
// Which rows are quantized. A scheme keeps its newest positions in full
// precision (the residual R) and quantizes older ones in whole blocks of G
// positions: in a cache holding T positions, rows
//
//     0 .. boundary(T) - 1,   boundary(T) = floor(max(0, T - R) / G) * G
//
// are stored quantized. A row once quantized stays quantized and its value
// never changes (blocks are fixed: block b is positions b*G .. b*G+G-1, and it
// is quantized once T >= (b+1)*G + R, i.e. once R newer positions follow it).
// This is a variant of KIVI's rule: KIVI flushes a full residual of R tokens at
// once; here blocks of G leave it as soon as R newer tokens follow, so between
// R and R+G-1 positions are always full precision (R once T - R is a multiple
// of G).
//
// Decode semantics in a prefill. The eval path runs a whole window as one
// forward call, but a quantized cache only costs anything during decode. So
// the query at position p reads key/value row j quantized iff
// j < boundary(p + 1), the boundary of a cache holding p + 1 positions: what a
// token-by-token decode would see. A prefill followed by decode steps then
// gives what feeding the tokens one at a time gives.
//
// The schemes (rows of kv_quants()):
//   int8, int4 (KIVI, Liu et al. 2024), R = 128, G = 32: asymmetric min/max,
//     keys per channel over each block of 32 positions, values per token over
//     groups of 32 consecutive channels of one head (a head_dim not a multiple
//     of 32 ends in a shorter group: head_dim 8 is one group of 8), codes
//     round-half-even((x - min) / scale), scale = (max - min) / (2^bits - 1).
//   bf16, R = 0, G = 1: every element rounded to the nearest bf16 (ties to
//     even) as it is written; the one scheme the GPU forward holds for real
//     (device_dtype), at half the bytes of the f32 cache.
//   fp8_e4m3, R = 0, G = 1: every row quantized at once; one fp32 scale per
//     layer for K and one for V, scale = absmax / 448 over the rows of the
//     first forward call into an empty cache (the prefill), then fixed: later
//     values beyond 448 * scale saturate. (A prefill of the whole eval window
//     sets the scale from the whole window, a token-by-token decode from the
//     first token alone: the one place where the two differ.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "nibble/dtype.h"

namespace nibble {

struct KvQuantSpec;

// How one layer's cache rows are laid out: [positions, kv_heads * head_dim].
struct KvLayout {
  int64_t kv_heads = 0, head_dim = 0;
  int64_t row() const { return kv_heads * head_dim; }
};

struct KvQuantSpec {
  std::string_view name;         // as written after --kv
  std::string_view description;  // one line for --help and errors
  int bits = 8;                  // code bits per stored element
  int64_t residual = 0;          // R: newest positions kept in full precision
  int64_t group = 1;             // G: positions per block (keys' per-channel groups for KIVI)
  // The fixed per-tensor scale of a scheme that has one, from the rows of the
  // first forward call (rows[n, row]); nullptr for schemes without.
  float (*tensor_scale)(const float* rows, int64_t n, const KvLayout& l) = nullptr;
  // Fake-quantize n cache rows (n a multiple of group, the first at a
  // block start): out[n, row] = dequantize(quantize(rows[n, row])).
  void (*keys)(const KvQuantSpec& s, const float* rows, int64_t n, const KvLayout& l, float scale, float* out) = nullptr;
  void (*values)(const KvQuantSpec& s, const float* rows, int64_t n, const KvLayout& l, float scale,
                 float* out) = nullptr;
  // The element type in which the GPU forward holds a real cache of this
  // scheme (cuda::GpuOptions::kv_dtype); unset: simulated on the CPU only.
  std::optional<DType> device_dtype;

  // Positions stored quantized in a cache of T positions (see above).
  int64_t boundary(int64_t T) const { return T > residual ? (T - residual) / group * group : 0; }
};

// Every KV-cache scheme, in a fixed order.
const std::vector<KvQuantSpec>& kv_quants();
// The scheme called `name`; "none" gives nullptr (an exact f32 cache). Throws
// nibble::Error listing the known names for anything else.
const KvQuantSpec* find_kv_quant(std::string_view name);
// "int8, int4, fp8_e4m3, bf16" (for help texts).
std::string kv_quant_names();
// The GPU cache's element type for `kv`: F32 for none (nullptr), the
// scheme's device_dtype where it has one. Throws nibble::Error naming `what`
// (e.g. "run --device cuda") for a scheme only the CPU simulates.
DType kv_device_dtype(const KvQuantSpec* kv, std::string_view what);

// The quantized side of one layer's cache: the dequantized form of rows
// 0 .. quantized()-1, filled in as the cache grows.
class KvCacheRows {
 public:
  explicit KvCacheRows(const KvQuantSpec& spec) : spec_(&spec) {}
  const KvQuantSpec& spec() const { return *spec_; }
  int64_t quantized() const { return quantized_; }
  // The cache now holds T positions (keys/values: its f32 rows [T, row]):
  // quantizes rows quantized() .. spec.boundary(T)-1. The first call after
  // clear() fixes a per-tensor scale from rows 0 .. T-1.
  void update(const float* keys, const float* values, int64_t T, const KvLayout& l);
  const float* keys(int64_t pos, const KvLayout& l) const { return k_.data() + pos * l.row(); }
  const float* values(int64_t pos, const KvLayout& l) const { return v_.data() + pos * l.row(); }
  float key_scale() const { return key_scale_; }
  float value_scale() const { return value_scale_; }
  void clear();

 private:
  const KvQuantSpec* spec_;
  std::vector<float> k_, v_;  // [quantized, row]
  int64_t quantized_ = 0;
  bool started_ = false;
  float key_scale_ = 0.0f, value_scale_ = 0.0f;
};

}  // namespace nibble
