// The format registry table and the format-generic helpers around it.
#include <algorithm>

#include "formats/common.h"
#include "formats/registry_rows.h"
#include "nibble/error.h"
#include "nibble/format.h"

namespace nibble {

const std::vector<const FormatSpec*>& format_registry() {
  static const std::vector<const FormatSpec*> rows = [] {
    std::vector<const FormatSpec*> r = {&formats::kInt4Asym, &formats::kInt4Sym, &formats::kInt4AsymF32,
                                          &formats::kInt8ChannelSym, &formats::kInt8Sym, &formats::kInt8AsymF32};
    for (const FormatSpec& f : formats::kIntTensorAsym) r.push_back(&f);
    for (const FormatSpec* f : {&formats::kFp8E4m3Tensor, &formats::kFp8E4m3Channel, &formats::kFp8E5m2Tensor,
                                &formats::kFp8E5m2Channel, &formats::kFp4E2m1, &formats::kMxfp4, &formats::kNvfp4})
      r.push_back(f);
    return r;
  }();
  return rows;
}

std::string QuantizedMatrix::canonical_name() const { return format->canonical_name(group_size); }

std::vector<std::string> format_names() {
  std::vector<std::string> names;
  for (const FormatSpec* f : format_registry())
    for (int g : f->group_sizes) names.push_back(f->canonical_name(g));
  return names;
}

GroupParams fit_tensor_params(const FormatSpec& f, const float* w, int64_t rows, int64_t cols) {
  return f.fit_tensor ? f.fit_tensor(w, rows, cols) : GroupParams{};
}

FormatChoice find_format(std::string_view name, int group_size) {
  for (const FormatSpec* f : format_registry()) {
    if (f->family == name) {
      const int g = group_size ? group_size : f->group_sizes.back();
      NIBBLE_CHECK(f->group_sizes != std::vector<int>{0} || g == 0,
                   "format {} has per-channel or per-tensor parameters and no group size, but group size {} was asked",
                   name, g);
      NIBBLE_CHECK(std::find(f->group_sizes.begin(), f->group_sizes.end(), g) != f->group_sizes.end(),
                   "format {}: group size {} is not supported (supported: {})", name, g,
                   fmt::join(f->group_sizes, ", "));
      return {f, g};
    }
    for (int g : f->group_sizes) {
      if (f->canonical_name(g) == name) {
        NIBBLE_CHECK(group_size == 0 || group_size == g, "format {} has group size {}, but group size {} was asked",
                     name, g, group_size);
        return {f, g};
      }
    }
  }
  NIBBLE_FAIL("unknown format '{}' (known: {})", name, fmt::join(format_names(), ", "));
}

double bits_per_weight(const FormatChoice& f, int64_t rows, int64_t cols) {
  double bits = 0;
  for (const PartSpec& p : f.spec->parts(rows, cols, f.group_size))
    bits += 8.0 * static_cast<double>(shape_numel(p.shape) * static_cast<int64_t>(dtype_size(p.dtype)));
  return bits / static_cast<double>(rows * cols);
}

void dequantize(const QuantizedMatrix& q, float* out) {
  const FormatSpec& f = *q.format;
  const int64_t gpr = q.groups_per_row(), g = q.group_len();
#pragma omp parallel for schedule(static) if (q.rows > 64)
  for (int64_t r = 0; r < q.rows; ++r) {
    for (int64_t c = 0; c < q.cols; ++c)
      out[r * q.cols + c] = f.decode(q.codes[r * q.cols + c], q.params[r * gpr + c / g]);
  }
}

void check_parts(const FormatChoice& f, const std::vector<Tensor>& parts, int64_t rows, int64_t cols) {
  formats::check_parts(*f.spec, parts, rows, cols, f.group_size);
}

Tensor dequantize_parts(const FormatChoice& f, const std::vector<Tensor>& parts, int64_t rows, int64_t cols) {
  QuantizedMatrix q = f.spec->unpack(parts, rows, cols, f.group_size);
  q.format = f.spec;
  Tensor out = Tensor::zeros(DType::F32, {rows, cols});
  dequantize(q, out.data_mut<float>());
  return out;
}

}  // namespace nibble
