// The Llama-family architecture table and the tensors a config implies.
#include "nibble/arch.h"

#include "nibble/error.h"

namespace nibble {

const std::vector<ArchSpec>& arch_registry() {
  static const std::vector<ArchSpec> rows = {
      // model_type  qkv_bias_always  honours_attention_bias  qk_norm  window_from_max_window_layers  hf_class
      {"llama", false, true, false, false, "LlamaForCausalLM"},
      {"mistral", false, false, false, false, "MistralForCausalLM"},
      {"qwen2", true, false, false, true, "Qwen2ForCausalLM"},
      {"qwen3", false, true, true, true, "Qwen3ForCausalLM"},
  };
  return rows;
}

const ArchSpec* lookup_arch(std::string_view model_type) {
  for (const ArchSpec& a : arch_registry())
    if (a.model_type == model_type) return &a;
  return nullptr;
}

std::string supported_model_types() {
  std::vector<std::string_view> names;
  for (const ArchSpec& a : arch_registry()) names.push_back(a.model_type);
  return fmt::format("{}", fmt::join(names, ", "));
}

const ArchSpec& find_arch(std::string_view model_type) {
  const ArchSpec* a = lookup_arch(model_type);
  NIBBLE_CHECK(a, "model_type '{}' is not supported (supported: {})", model_type, supported_model_types());
  return *a;
}

std::vector<ExpectedTensor> expected_tensors(const ModelConfig& c) {
  const ArchSpec& arch = find_arch(c.model_type);
  const int64_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim,
                ff = c.intermediate_size;
  const bool qkv_bias = arch.qkv_bias_always || (arch.honours_attention_bias && c.attention_bias);
  const bool o_bias = arch.honours_attention_bias && c.attention_bias;

  std::vector<ExpectedTensor> t;
  t.push_back({"model.embed_tokens.weight", {c.vocab_size, h}, TensorRole::Embedding});
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    t.push_back({p + "input_layernorm.weight", {h}, TensorRole::Norm});
    t.push_back({p + "self_attn.q_proj.weight", {q, h}, TensorRole::Linear});
    t.push_back({p + "self_attn.k_proj.weight", {kv, h}, TensorRole::Linear});
    t.push_back({p + "self_attn.v_proj.weight", {kv, h}, TensorRole::Linear});
    t.push_back({p + "self_attn.o_proj.weight", {h, q}, TensorRole::Linear});
    if (qkv_bias) {
      t.push_back({p + "self_attn.q_proj.bias", {q}, TensorRole::Bias});
      t.push_back({p + "self_attn.k_proj.bias", {kv}, TensorRole::Bias});
      t.push_back({p + "self_attn.v_proj.bias", {kv}, TensorRole::Bias});
    }
    if (o_bias) t.push_back({p + "self_attn.o_proj.bias", {h}, TensorRole::Bias});
    if (arch.qk_norm) {
      t.push_back({p + "self_attn.q_norm.weight", {c.head_dim}, TensorRole::Norm});
      t.push_back({p + "self_attn.k_norm.weight", {c.head_dim}, TensorRole::Norm});
    }
    t.push_back({p + "post_attention_layernorm.weight", {h}, TensorRole::Norm});
    t.push_back({p + "mlp.gate_proj.weight", {ff, h}, TensorRole::Linear});
    t.push_back({p + "mlp.up_proj.weight", {ff, h}, TensorRole::Linear});
    t.push_back({p + "mlp.down_proj.weight", {h, ff}, TensorRole::Linear});
    if (c.mlp_bias) {
      t.push_back({p + "mlp.gate_proj.bias", {ff}, TensorRole::Bias});
      t.push_back({p + "mlp.up_proj.bias", {ff}, TensorRole::Bias});
      t.push_back({p + "mlp.down_proj.bias", {h}, TensorRole::Bias});
    }
  }
  t.push_back({"model.norm.weight", {h}, TensorRole::Norm});
  if (!c.tie_word_embeddings) t.push_back({"lm_head.weight", {c.vocab_size, h}, TensorRole::Head});
  return t;
}

}  // namespace nibble
