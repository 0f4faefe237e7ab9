// Running a batch of sequences through a model one decoder layer at a time
// (issue: "a model larger than RAM can still be run"). Only one layer's
// weights are loaded at once; the hidden states of every sequence live in RAM
// as f32 [tokens, hidden] per sequence. Calibration uses the same stream with
// taps on the linears' inputs and its own (quantized) copies of each layer.
#pragma once

#include <cstdint>
#include <vector>

#include "nibble/model.h"
#include "nibble/source.h"

namespace nibble {

class LayerStream {
 public:
  // Embeds every sequence (ids are checked against the vocabulary). With
  // embed = false the ids are checked but the hidden states are left
  // unallocated until hidden(s) is first asked for (a GPU stream embeds on
  // its own and needs host memory only to save its states).
  LayerStream(const ModelSource& src, const std::vector<std::vector<int32_t>>& sequences, bool embed = true);

  const ModelConfig& config() const { return config_; }
  size_t num_sequences() const { return lengths_.size(); }
  int64_t length(size_t s) const { return lengths_[s]; }
  std::vector<float>& hidden(size_t s);  // allocated (zeros) on first use when not embedded
  const std::vector<float>& hidden(size_t s) const { return hidden_[s]; }
  uint64_t hidden_bytes() const;

  // Runs every sequence through layer L (each from position 0 with its own
  // attention cache). advance = false leaves the hidden states as they were,
  // so a tap can observe a layer's inputs without moving the stream. With
  // `kv`, attention reads a quantized cache as a token-by-token decode of
  // each sequence would (kv_quant.h). Sequences whose lengths are whole GEMM
  // tiles go through together (decoder_layer_forward over segments), with the
  // bits each would get alone.
  void apply(const DecoderLayer& L, const InputTap* tap, bool advance, const KvQuantSpec* kv = nullptr);

  // Loads, applies and drops every decoder layer in turn (optionally with a
  // progress bar).
  void apply_all(const ModelSource& src, bool progress);

  // The final RMSNorm of sequence s: [length, hidden].
  std::vector<float> final_normed(size_t s) const;

  // The head (the tied embedding, or lm_head plain or packed).
  LinearWeight load_head(const ModelSource& src) const;

 private:
  ModelConfig config_;
  std::vector<float> inv_freq_;
  Tensor final_norm_;
  std::vector<int64_t> lengths_;
  std::vector<std::vector<float>> hidden_;
  // apply()'s batch of sequences (their rows, keys and values), kept between layers.
  std::vector<float> batch_x_, batch_keys_, batch_values_;
};

}  // namespace nibble
