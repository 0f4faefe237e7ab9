// A Llama-family model's shape and hyper-parameters, read from an HF config.json
// (both the transformers 4 style: rope_theta / rope_scaling / torch_dtype, and
// the transformers 5 style: rope_parameters / dtype).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace nibble {

struct RopeScaling {
  std::string type = "default";  // default | linear | llama3
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_max_position_embeddings = 0;  // llama3
};

struct ModelConfig {
  std::string model_type;  // llama | mistral | qwen2 | qwen3
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  bool attention_bias = false;  // llama/qwen3 flag: biases on q/k/v/o
  bool mlp_bias = false;        // llama flag: biases on gate/up/down
  std::optional<int64_t> sliding_window;  // the window size, when some layer uses one
  // Attention window per layer (0 = full causal attention): from layer_types
  // when the config has it, else the architecture's rule.
  std::vector<int64_t> layer_windows;
  int64_t window(int64_t layer) const {
    return layer < static_cast<int64_t>(layer_windows.size()) ? layer_windows[layer] : sliding_window.value_or(0);
  }
  std::string dtype;  // "float32", "bfloat16", ... as the config states it (may be empty)
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;
};

// Parses config.json; throws nibble::Error naming the file and the key on a
// missing or mistyped field, or on an unsupported model_type.
ModelConfig parse_model_config(const std::filesystem::path& config_json);

// The config.json (transformers 4 style, with layer_types when some layer has
// a sliding window) that parse_model_config reads back as `c`; "torch_dtype"
// is `dtype` when given, else c.dtype. For checkpoints nibble writes from
// sources that have no config.json (GGUF files).
std::string model_config_json(const ModelConfig& c, const std::string& dtype = "");

}  // namespace nibble
