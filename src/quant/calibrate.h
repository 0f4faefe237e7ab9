// The calibrated half of quantize_model: sampling the calibration set, then,
// decoder layer by decoder layer, accumulating each linear input's Hessian
// (through the already-quantized layers when sequential), quantizing the
// layer's matrices, and checkpointing the layer's packed parts and the hidden
// states so a killed run resumes at the next layer. The head goes last, on the
// final-normed hidden states of the quantized body.
#pragma once

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nibble/convert.h"
#include "nibble/quantizer.h"
#include "nibble/safetensors.h"
#include "nibble/source.h"

namespace nibble::quant {

class CalibratedParts {
 public:
  // Runs (or, with options.resume and a matching state, continues) the
  // calibration in `state_dir`. `selected`: the tensors to quantize.
  CalibratedParts(const CheckpointDir& src, const std::set<std::string>& selected, const Quantizer& quantizer,
                  const FormatChoice& format, const QuantizeOptions& options, const std::filesystem::path& state_dir,
                  std::vector<std::string>& warnings, std::vector<std::string>& notes);

  // The stored parts of a quantized matrix (mapped from the state files).
  std::vector<Tensor> parts(const std::string& name) const;
  const QuantizeInfo& info(const std::string& name) const { return info_.at(name); }
  // Calibration details for nibble.json.
  const nlohmann::ordered_json& report() const { return report_; }
  int64_t resumed_from_layer() const { return resumed_from_; }

 private:
  FormatChoice format_;
  std::map<std::string, QuantizeInfo> info_;
  std::map<std::string, size_t> file_of_;  // matrix name -> index in files_
  std::vector<io::SafetensorsFile> files_;
  nlohmann::ordered_json report_;
  int64_t resumed_from_ = -1;
};

}  // namespace nibble::quant
