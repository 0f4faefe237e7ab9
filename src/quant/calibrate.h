// The calibrated half of quantize_model: sampling the calibration set, then,
// decoder layer by decoder layer, accumulating each linear input's Hessian
// (through the already-quantized layers when sequential), quantizing the
// layer's matrices, and checkpointing the layer's packed parts and the hidden
// states so a killed run resumes at the next layer. The head goes last, on the
// final-normed hidden states of the quantized body.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "nibble/convert.h"
#include "nibble/quantizer.h"
#include "nibble/safetensors.h"
#include "nibble/source.h"
#include "nibble/transform.h"

namespace nibble::quant {

// How far a stored weight b is from the matrix a it was made from (F32, one
// shape): ‖b − a‖_F / ‖a‖_F (‖b‖_F when a is zero) and max |b − a|.
std::pair<double, double> weight_error(const Tensor& a, const Tensor& b);

class CalibratedParts {
 public:
  // Runs (or, with options.resume and a matching state, continues) the
  // calibration in `state_dir`. `source`: the checkpoint on disk (a
  // directory or a GGUF file) and `weight_files`, its weight files (they
  // identify the run for resume); `model`: the tensors as the method sees them (the
  // checkpoint itself, or a model transform's view of it). `selected`: the
  // tensors to quantize. A layer transform, when given, reshapes each layer
  // before its linears are quantized; the tensors it changes besides those
  // (norm gains, biases, kept linears) become replacements. `sink`, when
  // given, gets every stored tensor this run makes (parts and replacements,
  // by stored name) as soon as its layer's state file is written, from a
  // background thread too (two calls may overlap): the output can be written
  // while the calibration goes on.
  using Sink = std::function<void(const std::string& stored_name, const Tensor& t)>;
  CalibratedParts(const std::filesystem::path& source, const std::vector<std::filesystem::path>& weight_files,
                  const ModelSource& model, const std::set<std::string>& selected,
                  const Quantizer& quantizer, const LayerTransform* transform, const FormatChoice& format,
                  const QuantizeOptions& options, const std::filesystem::path& state_dir,
                  std::vector<std::string>& warnings, std::vector<std::string>& notes, const Sink& sink = {});

  // The stored parts of a quantized matrix (mapped from the state files).
  std::vector<Tensor> parts(const std::string& name) const;
  const QuantizeInfo& info(const std::string& name) const { return info_.at(name); }
  // A layer transform's version of a plain tensor (F32), or an undefined Tensor.
  Tensor replacement(const std::string& name) const;
  // Calibration details for nibble.json.
  const nlohmann::ordered_json& report() const { return report_; }
  int64_t resumed_from_layer() const { return resumed_from_; }

 private:
  FormatChoice format_;
  std::map<std::string, QuantizeInfo> info_;
  std::map<std::string, size_t> file_of_;  // matrix name -> index in files_
  std::map<std::string, size_t> replaced_;  // plain tensor name -> index in files_
  std::vector<io::SafetensorsFile> files_;
  nlohmann::ordered_json report_;
  int64_t resumed_from_ = -1;
};

}  // namespace nibble::quant
