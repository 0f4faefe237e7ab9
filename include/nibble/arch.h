// The architecture table (DESIGN.md, "An architecture"): one data row per
// model_type, and the tensors a config implies.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "nibble/model_config.h"
#include "nibble/tensor.h"

namespace nibble {

struct ArchSpec {
  std::string_view model_type;
  bool qkv_bias_always;         // qwen2: q/k/v projections always carry biases
  bool honours_attention_bias;  // llama/qwen3: config.attention_bias adds q/k/v/o biases
  bool qk_norm;                 // qwen3: per-head RMSNorm on q and k before RoPE
  // qwen2/qwen3 (configs without layer_types): the sliding window applies only
  // to layers >= max_window_layers; otherwise it applies to every layer.
  bool window_from_max_window_layers;
  std::string_view hf_class;  // config.json's "architectures" entry: LlamaForCausalLM, ...
};

const std::vector<ArchSpec>& arch_registry();
// Throws an Error listing the supported model types when unknown.
const ArchSpec& find_arch(std::string_view model_type);
// nullptr when unknown.
const ArchSpec* lookup_arch(std::string_view model_type);
// "llama, mistral, qwen2, qwen3"
std::string supported_model_types();

enum class TensorRole { Embedding, Norm, Linear, Bias, Head };

struct ExpectedTensor {
  std::string name;
  Shape shape;
  TensorRole role;
};

// Every tensor the config implies, with its shape, in layer order.
std::vector<ExpectedTensor> expected_tensors(const ModelConfig& config);

}  // namespace nibble
