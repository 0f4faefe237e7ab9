// The Llama-family forward pass on the CPU (llama, mistral, qwen2, qwen3):
// f32 activations, weights dense f32 or nibble-packed int4 (used by the int4
// kernel directly, never expanded to a full-precision copy).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "nibble/format.h"
#include "nibble/model_config.h"
#include "nibble/source.h"
#include "nibble/tensor.h"

namespace nibble {

// One linear layer's weight (+ optional bias) as the forward uses it.
class LinearWeight {
 public:
  LinearWeight() = default;
  static LinearWeight dense(Tensor w_f32);  // [out, in] F32
  static LinearWeight packed(FormatChoice format, std::vector<Tensor> parts, int64_t out, int64_t in);

  // y[M, out] = x[M, in] · Wᵀ (+ bias)
  void forward(const float* x, int64_t M, float* y) const;
  int64_t out_features() const { return out_; }
  int64_t in_features() const { return in_; }
  bool is_packed() const { return format_.spec != nullptr; }
  Tensor bias;  // F32 [out] or undefined

 private:
  Tensor dense_;  // F32 [out, in] when not packed
  FormatChoice format_;
  std::vector<Tensor> parts_;
  int64_t out_ = 0, in_ = 0;
};

// Keys and values of every layer for the positions seen so far (f32).
class KVCache {
 public:
  KVCache(const ModelConfig& c, int64_t max_tokens);
  int64_t size() const { return len_; }
  int64_t capacity() const { return max_; }
  void clear() { len_ = 0; }
  float* keys(int64_t layer, int64_t pos) { return k_[layer].data() + pos * row_; }    // [kv_heads, head_dim]
  float* values(int64_t layer, int64_t pos) { return v_[layer].data() + pos * row_; }  // [kv_heads, head_dim]
  void advance(int64_t n) { len_ += n; }

 private:
  std::vector<std::vector<float>> k_, v_;
  int64_t row_, max_, len_ = 0;
};

class Model {
 public:
  // Loads every weight of `src` (plain or packed) for the CPU forward.
  static std::unique_ptr<Model> load(const CheckpointDir& src);

  const ModelConfig& config() const { return config_; }
  // Runs `tokens` at positions cache.size() .. cache.size()+n-1 and appends
  // them to the cache. Returns logits F32 [n, vocab] (all rows) or [1, vocab]
  // (the last row only).
  Tensor forward(const std::vector<int32_t>& tokens, KVCache& cache, bool all_logits = true) const;

 private:
  struct Layer {
    Tensor input_norm, post_norm, q_norm, k_norm;  // F32
    LinearWeight q, k, v, o, gate, up, down;
  };
  ModelConfig config_;
  Tensor embed_;  // F32 [vocab, hidden]
  Tensor final_norm_;
  LinearWeight head_;
  std::vector<Layer> layers_;
  std::vector<float> inv_freq_;  // [head_dim / 2], scaling applied
};

}  // namespace nibble
