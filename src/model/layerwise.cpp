#include "nibble/layerwise.h"

#include <algorithm>
#include <deque>

#include "backend/cpu/kernels.h"
#include "nibble/error.h"
#include "nibble/util.h"

namespace nibble {

LayerStream::LayerStream(const ModelSource& src, const std::vector<std::vector<int32_t>>& sequences, bool do_embed)
    : config_(src.config()), inv_freq_(rope_inv_freq(config_)), final_norm_(src.load("model.norm.weight").to_f32()) {
  src.validate_against_config();
  const int64_t D = config_.hidden_size, V = config_.vocab_size;
  // Stored dtype; rows converted as needed.
  const Tensor embed = do_embed ? src.load("model.embed_tokens.weight") : Tensor();
  const Tensor e32 = embed.defined() && embed.dtype() == DType::F32 ? embed : Tensor();
  hidden_.resize(sequences.size());
  for (size_t s = 0; s < sequences.size(); ++s) {
    const auto& ids = sequences[s];
    NIBBLE_CHECK(!ids.empty(), "layer stream: sequence {} is empty", s);
    NIBBLE_CHECK(static_cast<int64_t>(ids.size()) <= config_.max_position_embeddings,
                 "layer stream: sequence {} has {} tokens, more than the model's context of {}", s, ids.size(),
                 config_.max_position_embeddings);
    for (int32_t id : ids)
      NIBBLE_CHECK(id >= 0 && id < V, "layer stream: token id {} is outside the vocabulary (size {})", id, V);
    lengths_.push_back(static_cast<int64_t>(ids.size()));
    if (!do_embed) continue;
    auto& h = hidden_[s];
    h.resize(ids.size() * static_cast<size_t>(D));
    const int64_t n = static_cast<int64_t>(ids.size());
#pragma omp parallel for schedule(static) if (n * D > (1 << 18))
    for (int64_t i = 0; i < n; ++i) {
      if (e32.defined()) {
        std::copy_n(e32.data<float>() + ids[i] * D, D, h.data() + i * D);
      } else {
        const Tensor row = embed.slice_rows(ids[i], ids[i] + 1).to_f32();
        std::copy_n(row.data<float>(), D, h.data() + i * D);
      }
    }
  }
}

std::vector<float>& LayerStream::hidden(size_t s) {
  std::vector<float>& h = hidden_.at(s);
  if (h.empty()) h.resize(static_cast<size_t>(lengths_[s] * config_.hidden_size));
  return h;
}

uint64_t LayerStream::hidden_bytes() const {
  uint64_t b = 0;
  for (const auto& h : hidden_) b += h.size() * sizeof(float);
  return b;
}

void LayerStream::apply(const DecoderLayer& L, const InputTap* tap, bool advance, const KvQuantSpec* kv) {
  const int64_t D = config_.hidden_size, H = config_.num_heads, KV = config_.num_kv_heads, hd = config_.head_dim;
  const int64_t row = KV * hd;
  // Sequences go through the layer several at a time, so that a small model's products have enough tiles for every
  // core: consecutive sequences whose lengths are whole GEMM tiles (each row then gets the bits it would get alone,
  // cpu::kGemmTile), up to about 256 MiB of the layer's f32 temporaries per batch (decoder_layer_forward's buffers,
  // this batch's copy of x and its cache rows).
  const int64_t bytes_per_row = 4 * (3 * D + 2 * H * hd + 4 * row + 2 * config_.intermediate_size + hd);
  const int64_t budget = std::max<int64_t>(1, (int64_t{256} << 20) / bytes_per_row);
  auto whole_tiles = [&](size_t s) { return length(s) % cpu::kGemmTile == 0; };
  std::vector<float>& x = batch_x_;
  std::vector<float>& keys = batch_keys_;
  std::vector<float>& values = batch_values_;
  for (size_t s = 0; s < hidden_.size();) {
    size_t e = s + 1;
    int64_t rows = length(s);
    if (whole_tiles(s))
      while (e < hidden_.size() && whole_tiles(e) && rows + length(e) <= budget) rows += length(e++);
    x.resize(static_cast<size_t>(rows * D));
    keys.resize(static_cast<size_t>(rows * row));
    values.resize(static_cast<size_t>(rows * row));
    std::deque<KvCacheRows> quantized;  // each sequence's quantized cache rows
    std::vector<LayerSegment> segments;
    int64_t off = 0;
    for (size_t i = s; i < e; ++i) {
      const std::vector<float>& h = hidden(i);
      std::copy(h.begin(), h.end(), x.begin() + off * D);
      KvCacheRows* kr = kv ? &quantized.emplace_back(*kv) : nullptr;
      segments.push_back({length(i), 0, keys.data() + off * row, values.data() + off * row, kr});
      off += length(i);
    }
    decoder_layer_forward(config_, L, inv_freq_, x.data(), segments, tap);
    if (advance) {
      off = 0;
      for (size_t i = s; i < e; ++i) {
        std::copy_n(x.begin() + off * D, length(i) * D, hidden_[i].begin());
        off += length(i);
      }
    }
    s = e;
  }
}

void LayerStream::apply_all(const ModelSource& src, bool progress) {
  Progress bar("layers", config_.num_layers, progress, "layers");
  for (int64_t i = 0; i < config_.num_layers; ++i) {
    const DecoderLayer L = DecoderLayer::load(src, i);
    apply(L, nullptr, true);
    bar.advance();
  }
  bar.finish();
}

std::vector<float> LayerStream::final_normed(size_t s) const {
  NIBBLE_CHECK(static_cast<int64_t>(hidden_[s].size()) == length(s) * config_.hidden_size,
               "layer stream: sequence {} has no hidden states", s);
  std::vector<float> out(hidden_[s].size());
  rms_norm(hidden_[s].data(), length(s), config_.hidden_size, final_norm_.data<float>(),
           static_cast<float>(config_.rms_norm_eps), out.data());
  return out;
}

LinearWeight LayerStream::load_head(const ModelSource& src) const {
  return load_linear(src, config_.tie_word_embeddings ? "model.embed_tokens" : "lm_head");
}

}  // namespace nibble
