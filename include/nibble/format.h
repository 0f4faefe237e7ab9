// The format registry: one row per storage format (DESIGN.md, "A storage format").
//
// A format stores a [rows, cols] weight matrix as integer codes plus per-group
// parameters, with groups of `group_size` consecutive inputs (columns) of one
// output row; the last group of a row is shorter when cols % group_size != 0.
// Group size 0 means one group per row: per-channel formats (one scale per
// output row) and per-tensor formats (whose rows all carry the one set of
// tensor parameters) use it. Parameters that belong to the whole matrix (a
// per-tensor scale, NVFP4's second-level scale) are fitted once per matrix
// (fit_tensor) before the groups, and every group carries a copy of them.
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

// The parameters of one group: w' = decode(code, params). Each format uses
// the fields it needs (docs/FORMAT.md gives each one's arithmetic), always
// holding the exact values its stored parts decode to:
//   int4_asym:               w' = code·scale + min
//   int*_sym, fp*:           w' = value(code)·scale
//   int*_tensor_asym:        w' = (code − zero)·scale
//   nvfp4:                   w' = value(code)·(scale·global)
struct GroupParams {
  float scale = 0.0f;   // the step (integer formats) or the scale of the code's value (float formats)
  float min = 0.0f;     // int4_asym: the value of code 0
  float zero = 0.0f;    // affine integer formats: the integer zero point (held exactly in fp32)
  float global = 0.0f;  // two-level formats (nvfp4): the per-tensor second-level scale
};

// A matrix in unpacked form: one code per weight, one GroupParams per group.
// This is what quantization methods produce and what packing consumes.
struct QuantizedMatrix {
  const struct FormatSpec* format = nullptr;
  int group_size = 0;
  int64_t rows = 0, cols = 0;
  std::vector<uint8_t> codes;       // [rows, cols]
  std::vector<GroupParams> params;  // [rows, groups_per_row]

  // Inputs per group (group_size, or the whole row when group_size is 0).
  int64_t group_len() const { return group_size > 0 ? group_size : cols; }
  int64_t groups_per_row() const { return group_size > 0 ? (cols + group_size - 1) / group_size : 1; }
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
  std::vector<int> group_sizes;  // allowed group sizes, the default last; {0}: one group per row

  // Name with the group size spelled in, e.g. "int4_g128_asym" (the family
  // name itself for formats without a group size choice).
  std::string (*canonical_name)(int group_size);
  // Tensors stored for one [rows, cols] matrix.
  std::vector<PartSpec> (*parts)(int64_t rows, int64_t cols, int group_size);

  // Group primitives (RTN, GPTQ and range search are written against these).
  // fit_tensor (nullptr when the format has no per-matrix parameters): the
  // parameters of the whole [rows, cols] matrix, fitted once before any group.
  // fit_group: parameters for the n values of one group, given the matrix's
  // (`tensor`, default-constructed when there is no fit_tensor); the group's
  // range (min, max) or absolute maximum is first multiplied by `shrink` in
  // (0, 1] (1 = plain round-to-nearest; formats whose every parameter is
  // per-tensor ignore it).
  GroupParams (*fit_tensor)(const float* w, int64_t rows, int64_t cols);
  GroupParams (*fit_group)(const float* w, int64_t n, float shrink, const GroupParams& tensor);
  // The nearest code to w under p (round to nearest even, saturating at the
  // format's range), and the value a code decodes to.
  uint8_t (*encode)(float w, const GroupParams& p);
  float (*decode)(uint8_t code, const GroupParams& p);

  // Packing to the on-disk parts (in the order parts() lists them) and back.
  std::vector<Tensor> (*pack)(const QuantizedMatrix& q);
  QuantizedMatrix (*unpack)(const std::vector<Tensor>& parts, int64_t rows, int64_t cols, int group_size);

  // Optional (nullptr: a refinement keeps the fitted parameters): formats whose
  // group decode is affine in a per-group scale (and min), which GPTQ's
  // --refine refits to a group's chosen codes by least squares.
  const struct AffineParams* affine = nullptr;
};

// decode(c, p) == value(c) · scale(p) + min(p), where value(c) = decode(c, p)
// at scale 1, min 0 (and global 1), and min(p) = p.min where has_min, else 0.
struct AffineParams {
  double (*scale)(const GroupParams& p);  // the scale the codes' values are multiplied by
  bool has_min;
  // The parameters the format stores nearest to a real-valued scale and min
  // (min ignored without has_min), keeping p's per-matrix parts.
  GroupParams (*store)(const GroupParams& p, double scale, double min);
};

// All registered formats, in registry order.
const std::vector<const FormatSpec*>& format_registry();

// A format with its group size chosen.
struct FormatChoice {
  const FormatSpec* spec = nullptr;
  int group_size = 0;
  std::string canonical_name() const { return spec->canonical_name(group_size); }
};

// Finds a format by family ("int4_asym") plus group size (0: the family's
// default, its last listed size), or by canonical name ("int4_g128_asym");
// throws an Error listing the known names otherwise.
FormatChoice find_format(std::string_view name, int group_size = 0);
// Every canonical name, in registry order (for --help and error messages).
std::vector<std::string> format_names();

// The parameters of the whole matrix w[rows, cols] (default-constructed for
// formats without fit_tensor).
GroupParams fit_tensor_params(const FormatSpec& f, const float* w, int64_t rows, int64_t cols);

// Bits per weight of a packed [rows, cols] matrix (all parts, params included).
double bits_per_weight(const FormatChoice& f, int64_t rows, int64_t cols);

// Reference dequantization of an unpacked matrix into out[rows * cols].
void dequantize(const QuantizedMatrix& q, float* out);
// Checks stored parts against f.spec->parts() (count, dtype, shape); throws an
// Error naming the first part that differs.
void check_parts(const FormatChoice& f, const std::vector<Tensor>& parts, int64_t rows, int64_t cols);

// int4_sym's parts (qweight U8, scales F16) as int4_asym_f32's (the same qweight, scales F32, mins F32 = −8·scale):
// the same weights bit for bit, since f16 → f32 is exact and every step of fl(fl(code·s) − 8·s) is too (at most
// 15 significant bits). How the CPU's int4 kernels and the GPU yardstick's int4 dequantization read int4_sym.
std::vector<Tensor> int4_sym_as_asym_f32(const std::vector<Tensor>& parts, int64_t rows, int64_t cols,
                                         int group_size);

// Reference dequantization straight from the stored parts.
Tensor dequantize_parts(const FormatChoice& f, const std::vector<Tensor>& parts, int64_t rows, int64_t cols);

}  // namespace nibble
