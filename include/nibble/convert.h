// Whole-checkpoint flows: quantize an HF directory into nibble's packed format,
// and turn a packed directory back into a plain HF checkpoint.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "nibble/calibration.h"
#include "nibble/dtype.h"
#include "nibble/quantizer.h"

namespace nibble {

struct QuantizeOptions {
  std::string method = "rtn";        // "[transform+]quantizer" (quant::parse_method)
  std::string format = "int4_asym";  // a registry family or canonical name
  int group_size = 0;                // 0: the format's default (int4_asym: 128)
  std::string keep_regex;        // tensors it matches anywhere in the name (PCRE2 search) stay unquantized
  bool allow_nonfinite = false;  // keep a tensor with NaN/Inf unquantized (with a warning) instead of failing
  bool force = false;            // replace a non-empty output directory
  bool progress = true;
  std::string command_line;              // recorded in nibble.json
  uint64_t max_shard_bytes = 4ull << 30;  // output shard size bound

  // Method options (quant::QuantizerConfig).
  bool mse = false;        // MSE range search per group (RTN and GPTQ)
  bool act_order = false;  // GPTQ: decreasing diag(H) order, static groups
  double damp = 0.01;      // GPTQ: λ = damp · mean(diag H)
  int refine = 0;          // GPTQ: passes of quant::refine after the sweep (CPU)
  std::string device = "cpu";  // GPTQ: "cpu", or "cuda" (int4_asym, int4_sym, int4_asym_f32; the solve on the GPU)
  double alpha = 0.5;      // SmoothQuant: migration strength
  uint64_t rotate_seed = 0;  // rotation: seed of the random signs
  // Activation quantizer the checkpoint's linears run with (simulated W8A8,
  // e.g. "int8_token"); recorded in nibble.json, empty for none.
  std::string activations;

  // Calibration (methods that need it).
  CalibrationOptions calib;
  bool sequential = true;  // layer i calibrated through the already-quantized layers 0..i-1
  // Continue an interrupted calibrated run from its last finished layer (the
  // state lives in the output's staging directory).
  bool resume = false;
};

struct TensorResult {
  std::string name;
  bool quantized = false;
  std::string note;  // why it was kept ("embedding", "--keep", "tied head", "non-finite", ...)
  double rel_error = 0;  // ||W' - W||_F / ||W||_F (quantized tensors)
  double max_abs_error = 0;
  double bits_per_weight = 0;
  uint64_t params = 0, bytes = 0;
  // GPTQ: the damping factor used, how often it was raised, dead inputs.
  double damp_used = 0;
  int damp_retries = 0;
  int64_t dead_columns = 0;
  quant::RefineReport refine;  // GPTQ --refine
};

struct QuantizeResult {
  std::filesystem::path out_dir;
  std::string format;  // canonical name
  std::vector<TensorResult> tensors;
  uint64_t quantized_params = 0, total_params = 0, total_bytes = 0;
  double quantized_bits_per_weight = 0;   // over the quantized matrices
  double checkpoint_bits_per_weight = 0;  // all stored bytes over all parameters
  std::vector<std::string> warnings;
  std::vector<std::string> notes;  // informational (calibration clipping, resume)
  int64_t resumed_from_layer = -1;  // first layer computed in this run when resumed
  // Wall time: the whole run, the calibrated part (0 without calibration) and
  // writing the checkpoint (the packed tensors, the copied ones, nibble.json).
  double seconds_total = 0, seconds_calibration = 0, seconds_write = 0;
};

// Quantizes an HF checkpoint directory, or a GGUF file whose tensors to
// quantize are stored as F32/F16/BF16 (config.json and the tokenizer files
// are then written from what the file holds), into a packed checkpoint.
QuantizeResult quantize_model(const std::filesystem::path& model_dir, const std::filesystem::path& out_dir,
                              const QuantizeOptions& options);

struct DequantizeOptions {
  DType dtype = DType::F32;  // F32 (exact) or BF16 (rounds the dequantized values)
  bool force = false;
  bool progress = true;
};

// Writes a plain HF checkpoint (every float tensor in options.dtype) that
// transformers can load, from a nibble-packed or plain directory, or from a
// GGUF file (config.json from model_config_json, tokenizer.json from
// io::tokenizer_json_from_gguf).
void dequantize_model(const std::filesystem::path& packed_dir, const std::filesystem::path& out_dir,
                      const DequantizeOptions& options);

}  // namespace nibble
