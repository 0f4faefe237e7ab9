// Whole-checkpoint flows: quantize an HF directory into nibble's packed format,
// and turn a packed directory back into a plain HF checkpoint.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "nibble/dtype.h"

namespace nibble {

struct QuantizeOptions {
  std::string method = "rtn";
  std::string format = "int4_asym";
  int group_size = 128;
  std::string keep_regex;        // tensors matching it (std::regex search) stay unquantized
  bool allow_nonfinite = false;  // keep a tensor with NaN/Inf unquantized (with a warning) instead of failing
  bool force = false;            // replace a non-empty output directory
  bool progress = true;
  std::string command_line;              // recorded in nibble.json
  uint64_t max_shard_bytes = 4ull << 30;  // output shard size bound
};

struct TensorResult {
  std::string name;
  bool quantized = false;
  std::string note;  // why it was kept ("embedding", "--keep", "tied head", "non-finite", ...)
  double rel_error = 0;  // ||W' - W||_F / ||W||_F (quantized tensors)
  double max_abs_error = 0;
  double bits_per_weight = 0;
  uint64_t params = 0, bytes = 0;
};

struct QuantizeResult {
  std::filesystem::path out_dir;
  std::string format;  // canonical name
  std::vector<TensorResult> tensors;
  uint64_t quantized_params = 0, total_params = 0, total_bytes = 0;
  double quantized_bits_per_weight = 0;   // over the quantized matrices
  double checkpoint_bits_per_weight = 0;  // all stored bytes over all parameters
  std::vector<std::string> warnings;
};

QuantizeResult quantize_model(const std::filesystem::path& model_dir, const std::filesystem::path& out_dir,
                              const QuantizeOptions& options);

struct DequantizeOptions {
  DType dtype = DType::F32;  // F32 (exact) or BF16 (rounds the dequantized values)
  bool force = false;
  bool progress = true;
};

// Writes a plain HF checkpoint (every float tensor in options.dtype) that
// transformers can load.
void dequantize_model(const std::filesystem::path& packed_dir, const std::filesystem::path& out_dir,
                      const DequantizeOptions& options);

}  // namespace nibble
