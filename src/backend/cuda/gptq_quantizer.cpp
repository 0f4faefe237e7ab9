// The `gptq` method's GPU backend (QuantizerConfig::device == "cuda"): the CPU
// quantizer's contract (src/quant/gptq.cpp), with the prepared Hessian and the
// sweep on the GPU. The statistics still arrive as MatrixStats (the calibrated
// flow accumulates them on the CPU); H goes up once per distinct input.
#include <mutex>

#include "nibble/cuda_gptq.h"
#include "nibble/error.h"

namespace nibble::cuda {
namespace {

class GpuGptqQuantizer final : public quant::Quantizer {
 public:
  explicit GpuGptqQuantizer(const quant::QuantizerConfig& c) : config_(c) {}

  QuantizedMatrix quantize(const Tensor& w, const quant::MatrixStats* stats, quant::QuantizeInfo* info) const override {
    NIBBLE_CHECK(w.dim() == 2 && w.dtype() == DType::F32 && w.is_contiguous(),
                 "gptq: expected a contiguous F32 2-D matrix, found {} {}", dtype_name(w.dtype()), shape_str(w.shape()));
    NIBBLE_CHECK(stats != nullptr, "gptq needs calibration statistics (pass --calib)");
    NIBBLE_CHECK(stats->dim == w.size(1), "gptq: the statistics are for {} inputs, the matrix has {} columns",
                 stats->dim, w.size(1));
    quant::GptqOptions o;
    o.damp = config_.damp;
    o.act_order = config_.act_order;
    // q/k/v (and gate/up) share their statistics: factor them once.
    std::lock_guard<std::mutex> lock(mu_);
    if (prepared_id_ != stats->id) {
      prepared_ = cuda::prepare_hessian(*stats, o);
      objective_ = config_.refine > 0 ? refine_objective(*stats, prepared_) : DeviceBuffer();
      prepared_id_ = stats->id;
    }
    quant::GptqResult r;
    quant::RefineReport refined;
    if (config_.refine == 0) {
      r = cuda::gptq(w.data<float>(), w.size(0), w.size(1), prepared_, config_.format, config_.mse, o);
    } else {  // the sweep's values stay on the device for the refinement
      const DeviceBuffer w_dev = upload(w.data<float>(), static_cast<size_t>(w.numel()) * sizeof(float));
      DeviceBuffer dequant;
      r = gptq_device(static_cast<const float*>(w_dev.get()), w.size(0), w.size(1), prepared_, config_.format,
                      config_.mse, o, &dequant);
      refined = refine_device(r, static_cast<const float*>(w_dev.get()), static_cast<float*>(dequant.get()),
                              static_cast<const float*>(objective_.get()), prepared_, config_.format, config_.refine);
    }
    if (info) *info = quant::QuantizeInfo{r.damp_used, r.damp_retries, r.dead_columns, 0, 0, refined};
    return r.to_quantized(*config_.format.spec, config_.format.group_size);
  }

 private:
  quant::QuantizerConfig config_;
  mutable std::mutex mu_;
  mutable uint64_t prepared_id_ = 0;
  mutable GpuPreparedHessian prepared_;
  mutable DeviceBuffer objective_;  // --refine's A = H + λI for prepared_
};

}  // namespace

std::unique_ptr<quant::Quantizer> make_gptq_quantizer(const quant::QuantizerConfig& c) {
  std::string why;
  NIBBLE_CHECK(gptq_supports(c.format, &why), "--device cuda: {}", why);
  NIBBLE_CHECK(c.refine == 0 || refine_supports(c.format, &why), "--device cuda: {}", why);
  NIBBLE_CHECK(device_available(), "--device cuda: no CUDA device is visible (cudaGetDeviceCount found none); "
                                   "use --device cpu");
  return std::make_unique<GpuGptqQuantizer>(c);
}

}  // namespace nibble::cuda
