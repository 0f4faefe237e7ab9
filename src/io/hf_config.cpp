// config.json -> ModelConfig.

#include <nlohmann/json.hpp>

#include "nibble/arch.h"
#include "nibble/error.h"
#include "nibble/model_config.h"
#include "io/json_file.h"

namespace nibble {
namespace {

using json = nlohmann::json;

// A string from the file in single quotes for a message, with JSON's escapes
// inside (a newline in it stays "\n": the message stays one line).
std::string in_quotes(const std::string& s) {
  std::string d = json(s).dump();  // "..." with JSON's escapes
  d.front() = '\'';                 // built in place: `"'" + substr + "'"` set off GCC 12's -Wrestrict false positive
  d.back() = '\'';
  return d;
}

using io::JsonFields;

RopeScaling parse_rope(const JsonFields& r, const json& rope, const char* where) {
  RopeScaling s;
  NIBBLE_CHECK(rope.is_object(), "{}: '{}' should be an object, found {}", r.where, where, rope.dump());
  JsonFields sub{r.where, rope};
  // transformers 4 used "type", later versions "rope_type".
  s.type = sub.optional<std::string>("rope_type", sub.optional<std::string>("type", "default"));
  NIBBLE_CHECK(s.type == "default" || s.type == "linear" || s.type == "llama3",
               "{}: rope type {} is not supported (supported: default, linear, llama3)", r.where, in_quotes(s.type));
  s.factor = sub.optional<double>("factor", 1.0);
  if (s.type == "llama3") {
    s.low_freq_factor = sub.required<double>("low_freq_factor");
    s.high_freq_factor = sub.required<double>("high_freq_factor");
    s.original_max_position_embeddings = sub.required<int64_t>("original_max_position_embeddings");
  }
  if (s.type == "linear") NIBBLE_CHECK(s.factor > 0, "{}: linear rope factor must be > 0, found {}", r.where, s.factor);
  return s;
}

}  // namespace

ModelConfig parse_model_config(const std::filesystem::path& path) {
  const json j = io::read_json_file(path);
  NIBBLE_CHECK(j.is_object(), "{}: expected a JSON object at top level", path.string());
  JsonFields r{path.string(), j};

  ModelConfig c;
  c.model_type = r.required<std::string>("model_type");
  NIBBLE_CHECK(lookup_arch(c.model_type), "{}: model_type {} is not supported (supported: {})", path.string(),
               in_quotes(c.model_type), supported_model_types());
  c.hidden_size = r.required<int64_t>("hidden_size");
  c.intermediate_size = r.required<int64_t>("intermediate_size");
  c.num_layers = r.required<int64_t>("num_hidden_layers");
  c.num_heads = r.required<int64_t>("num_attention_heads");
  c.num_kv_heads = r.optional<int64_t>("num_key_value_heads", c.num_heads);
  c.vocab_size = r.required<int64_t>("vocab_size");
  c.max_position_embeddings = r.optional<int64_t>("max_position_embeddings", 2048);
  for (auto [key, value] : {std::pair{"hidden_size", c.hidden_size}, {"intermediate_size", c.intermediate_size},
                            {"num_hidden_layers", c.num_layers}, {"num_attention_heads", c.num_heads},
                            {"num_key_value_heads", c.num_kv_heads}, {"vocab_size", c.vocab_size}})
    NIBBLE_CHECK(value > 0, "{}: '{}' must be positive, found {}", path.string(), key, value);
  // Layers are counted in the tens to hundreds; a count past this is a broken
  // file, refused before anything is sized by it.
  constexpr int64_t kMaxLayers = 1 << 16;
  NIBBLE_CHECK(c.num_layers <= kMaxLayers, "{}: 'num_hidden_layers' = {} is not plausible (at most {})", path.string(),
               c.num_layers, kMaxLayers);
  c.rms_norm_eps = r.optional<double>("rms_norm_eps", 1e-6);
  c.tie_word_embeddings = r.optional<bool>("tie_word_embeddings", false);
  c.attention_bias = r.optional<bool>("attention_bias", false);
  c.mlp_bias = r.optional<bool>("mlp_bias", false);
  if (r.optional<bool>("use_sliding_window", true) && j.contains("sliding_window") && !j["sliding_window"].is_null())
    c.sliding_window = r.required<int64_t>("sliding_window");
  c.dtype = r.optional<std::string>("dtype", r.optional<std::string>("torch_dtype", ""));
  // Which layers use the window: layer_types (transformers 5), else the
  // architecture's rule (qwen2/qwen3: layers >= max_window_layers; others: all).
  c.layer_windows.assign(static_cast<size_t>(std::max<int64_t>(c.num_layers, 0)), 0);
  if (j.contains("layer_types") && !j["layer_types"].is_null()) {
    const auto& lt = j["layer_types"];
    NIBBLE_CHECK(lt.is_array() && static_cast<int64_t>(lt.size()) == c.num_layers,
                 "{}: 'layer_types' must list one entry per layer ({}), found {}", path.string(), c.num_layers,
                 lt.dump());
    for (int64_t i = 0; i < c.num_layers; ++i) {
      const std::string t = lt[i].is_string() ? lt[i].get<std::string>() : "";
      NIBBLE_CHECK(t == "full_attention" || t == "sliding_attention",
                   "{}: layer_types[{}] = {} is not supported (full_attention, sliding_attention)", path.string(), i,
                   lt[i].is_string() ? in_quotes(t) : lt[i].dump());
      if (t == "sliding_attention") c.layer_windows[i] = c.sliding_window.value_or(0);
    }
  } else if (c.sliding_window) {
    const int64_t first = find_arch(c.model_type).window_from_max_window_layers
                              ? r.optional<int64_t>("max_window_layers", 0)
                              : 0;
    for (int64_t i = std::max<int64_t>(first, 0); i < c.num_layers; ++i) c.layer_windows[i] = *c.sliding_window;
  }

  NIBBLE_CHECK(c.num_heads % c.num_kv_heads == 0,
               "{}: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})", path.string(),
               c.num_heads, c.num_kv_heads);
  c.head_dim = r.optional<int64_t>("head_dim", 0);
  if (c.head_dim == 0) {
    NIBBLE_CHECK(c.hidden_size % c.num_heads == 0,
                 "{}: hidden_size ({}) is not a multiple of num_attention_heads ({}) and no head_dim is given",
                 path.string(), c.hidden_size, c.num_heads);
    c.head_dim = c.hidden_size / c.num_heads;
  }
  NIBBLE_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, "{}: head_dim must be positive and even, found {}", path.string(),
               c.head_dim);

  // RoPE: transformers 5 puts theta and scaling in rope_parameters; 4 had
  // rope_theta plus an optional rope_scaling object.
  if (j.contains("rope_parameters") && !j["rope_parameters"].is_null()) {
    const json& rp = j["rope_parameters"];
    c.rope_scaling = parse_rope(r, rp, "rope_parameters");
    c.rope_theta =
        JsonFields{path.string(), rp}.optional<double>("rope_theta", r.optional<double>("rope_theta", 10000.0));
  } else {
    c.rope_theta = r.optional<double>("rope_theta", 10000.0);
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
      c.rope_scaling = parse_rope(r, j["rope_scaling"], "rope_scaling");
  }
  NIBBLE_CHECK(c.rope_theta > 0, "{}: rope_theta must be positive, found {}", path.string(), c.rope_theta);

  if (j.contains("bos_token_id") && !j["bos_token_id"].is_null()) c.bos_token_id = r.required<int64_t>("bos_token_id");
  if (j.contains("eos_token_id") && !j["eos_token_id"].is_null()) {
    const json& e = j["eos_token_id"];
    if (e.is_array()) {
      for (const json& v : e) c.eos_token_ids.push_back(r.get<int64_t>(v, "eos_token_id"));
    } else {
      c.eos_token_ids.push_back(r.required<int64_t>("eos_token_id"));
    }
  }
  return c;
}

std::string model_config_json(const ModelConfig& c, const std::string& dtype) {
  const ArchSpec& arch = find_arch(c.model_type);
  nlohmann::ordered_json j = {{"architectures", {arch.hf_class}},
                              {"model_type", c.model_type},
                              {"hidden_size", c.hidden_size},
                              {"intermediate_size", c.intermediate_size},
                              {"num_hidden_layers", c.num_layers},
                              {"num_attention_heads", c.num_heads},
                              {"num_key_value_heads", c.num_kv_heads},
                              {"head_dim", c.head_dim},
                              {"vocab_size", c.vocab_size},
                              {"max_position_embeddings", c.max_position_embeddings},
                              {"rms_norm_eps", c.rms_norm_eps},
                              {"rope_theta", c.rope_theta},
                              {"hidden_act", "silu"},
                              {"tie_word_embeddings", c.tie_word_embeddings},
                              {"attention_bias", c.attention_bias},
                              {"mlp_bias", c.mlp_bias}};
  const RopeScaling& s = c.rope_scaling;
  if (s.type == "linear") {
    j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", s.factor}};
  } else if (s.type == "llama3") {
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.factor},
                         {"low_freq_factor", s.low_freq_factor},
                         {"high_freq_factor", s.high_freq_factor},
                         {"original_max_position_embeddings", s.original_max_position_embeddings}};
  } else {
    j["rope_scaling"] = nullptr;
  }
  int64_t window = 0;
  for (int64_t w : c.layer_windows) {
    NIBBLE_CHECK(w == 0 || window == 0 || w == window, "config.json: layers with different sliding windows ({} and {})",
                 window, w);
    window = std::max(window, w);
  }
  if (window > 0) {
    j["use_sliding_window"] = true;
    j["sliding_window"] = window;
    nlohmann::ordered_json types = nlohmann::ordered_json::array();
    for (int64_t w : c.layer_windows) types.push_back(w ? "sliding_attention" : "full_attention");
    j["layer_types"] = types;
  } else {
    j["use_sliding_window"] = false;
    j["sliding_window"] = nullptr;
  }
  if (c.bos_token_id) j["bos_token_id"] = *c.bos_token_id;
  if (c.eos_token_ids.size() == 1) j["eos_token_id"] = c.eos_token_ids[0];
  if (c.eos_token_ids.size() > 1) j["eos_token_id"] = c.eos_token_ids;
  const std::string dt = dtype.empty() ? c.dtype : dtype;
  if (!dt.empty()) j["torch_dtype"] = dt;
  return j.dump(2) + "\n";
}

}  // namespace nibble
