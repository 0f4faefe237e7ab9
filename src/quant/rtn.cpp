// Round-to-nearest: per group, the format fits its parameters to the group's
// own range and every weight takes the nearest code.
#include "nibble/error.h"
#include "nibble/gptq.h"
#include "nibble/quantizer.h"

namespace nibble::quant {

QuantizedMatrix quantize_rtn(const FormatChoice& format, const float* w, int64_t rows, int64_t cols) {
  const FormatSpec& f = *format.spec;
  QuantizedMatrix q;
  q.format = &f;
  q.group_size = format.group_size;
  q.rows = rows;
  q.cols = cols;
  const int64_t gpr = q.groups_per_row(), g = q.group_len();
  q.codes.resize(static_cast<size_t>(rows * cols));
  q.params.resize(static_cast<size_t>(rows * gpr));
  const GroupParams tensor = fit_tensor_params(f, w, rows, cols);
#pragma omp parallel for schedule(static) if (rows > 16)
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = 0; k < gpr; ++k) {
      const int64_t c0 = k * g, n = std::min(g, cols - c0);  // last group may be shorter
      const float* src = w + r * cols + c0;
      const GroupParams p = f.fit_group(src, n, 1.0f, tensor);
      q.params[r * gpr + k] = p;
      uint8_t* codes = q.codes.data() + r * cols + c0;
      for (int64_t i = 0; i < n; ++i) codes[i] = f.encode(src[i], p);
    }
  }
  return q;
}

namespace {

class RtnQuantizer final : public Quantizer {
 public:
  explicit RtnQuantizer(const QuantizerConfig& c) : config_(c) {}
  QuantizedMatrix quantize(const Tensor& w, const MatrixStats*, QuantizeInfo*) const override {
    NIBBLE_CHECK(w.dim() == 2 && w.dtype() == DType::F32 && w.is_contiguous(),
                 "rtn: expected a contiguous F32 2-D matrix, found {} {}", dtype_name(w.dtype()), shape_str(w.shape()));
    if (!config_.mse) return quantize_rtn(config_.format, w.data<float>(), w.size(0), w.size(1));
    const auto grid = make_format_grid(config_.format, true);
    return rtn(w.data<float>(), w.size(0), w.size(1), *grid).to_quantized(*config_.format.spec, config_.format.group_size);
  }

 private:
  QuantizerConfig config_;
};

std::unique_ptr<Quantizer> make_rtn(const QuantizerConfig& c) {
  NIBBLE_CHECK(c.device == "cpu", "--device {}: only the gptq method has a GPU backend; rtn runs on the CPU (use --device "
               "cpu, or --method gptq)", c.device);
  return std::make_unique<RtnQuantizer>(c);
}

}  // namespace

extern const MethodSpec kRtn;
const MethodSpec kRtn{"rtn", "round-to-nearest per group, no calibration", false, make_rtn};

}  // namespace nibble::quant
