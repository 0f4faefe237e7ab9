// The format registry: one row per storage format (DESIGN.md, "A storage format").
//
// A format stores a [rows, cols] weight matrix as integer codes plus per-group
// parameters, with groups of `group_size` consecutive inputs (columns) of one
// output row; the last group of a row is shorter when cols % group_size != 0.
// Everything format-specific is reached through the row's function pointers:
// ask the registry, never switch on a format name elsewhere.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "nibble/tensor.h"

namespace nibble {

// The parameters of one group: w' = decode(code, params).
// For int4_asym: w' = code * scale + min (both bf16 values held in fp32).
struct GroupParams {
  float scale = 0.0f;
  float min = 0.0f;
};

// A matrix in unpacked form: one code per weight, one GroupParams per group.
// This is what quantization methods produce and what packing consumes.
struct QuantizedMatrix {
  const struct FormatSpec* format = nullptr;
  int group_size = 0;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;       // [rows, cols]
  std::vector<GroupParams> params;  // [rows, groups_per_row]

  int64_t groups_per_row() const { return (cols + group_size - 1) / group_size; }
  const GroupParams& group(int64_t row, int64_t g) const { return params[row * groups_per_row() + g]; }
  std::string canonical_name() const;
};

// One stored tensor of a packed matrix: "X.<suffix>" for a linear "X.weight".
struct PartSpec {
  std::string suffix;  // "qweight", "scales", "mins"
  DType dtype;
  Shape shape;
};

struct FormatSpec {
  std::string_view family;       // registry key, e.g. "int4_asym"
  std::string_view description;  // one line for --help and inspect
  int code_bits;                 // bits per code (4)
  std::vector<int> group_sizes;  // allowed group sizes

  // Name with the group size spelled in, e.g. "int4_g128_asym".
  std::string (*canonical_name)(int group_size);
  // Tensors stored for one [rows, cols] matrix.
  std::vector<PartSpec> (*parts)(int64_t rows, int64_t cols, int group_size);

  // Group primitives (RTN, GPTQ and range search are written against these).
  // fit: parameters for the n values of one group, the range (min, max) first
  // multiplied by `shrink` in (0, 1] (1 = plain round-to-nearest).
  GroupParams (*fit_group)(const float* w, int64_t n, float shrink);
  uint8_t (*encode)(float w, const GroupParams& p);
  float (*decode)(uint8_t code, const GroupParams& p);

  // Packing to the on-disk parts (in the order parts() lists them) and back.
  std::vector<Tensor> (*pack)(const QuantizedMatrix& q);
  QuantizedMatrix (*unpack)(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size);
};

// All registered formats, in registry order.
const std::vector<const FormatSpec*>& format_registry();

// A format with its group size chosen.
struct FormatChoice {
  const FormatSpec* spec = nullptr;
  int group_size = 0;
  std::string canonical_name() const { return spec->canonical_name(group_size); }
};

// Finds a format by family ("int4_asym") plus group size, or by canonical name
// ("int4_g128_asym"); throws an Error listing the known names otherwise.
FormatChoice find_format(std::string_view name, int group_size = 0);

// Bits per weight of a packed [rows, cols] matrix (all parts, params included).
double bits_per_weight(const FormatChoice& f, int64_t rows, int64_t cols);

// Reference dequantization of an unpacked matrix into out[rows * cols].
void dequantize(const QuantizedMatrix& q, float* out);
// Reference dequantization straight from the stored parts.
Tensor dequantize_parts(const FormatChoice& f, const std::vector<Tensor>& parts, int64_t rows, int64_t cols);

}  // namespace nibble
