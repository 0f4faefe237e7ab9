#include "nibble/probe.h"

#include <cmath>

#include "nibble/error.h"
#include "nibble/eval.h"
#include "nibble/layerwise.h"
#include "nibble/model.h"
#include "nibble/util.h"

namespace nibble::eval {

double ProbeRow::rel() const { return sq_ref > 0 ? std::sqrt(sq_err / sq_ref) : NAN; }

namespace {


// Adds ‖yc − yr‖² and ‖yr − b‖² for one batch of inputs.
void accumulate(const LinearWeight& ref, const LinearWeight& cand, const float* x, int64_t n, ProbeRow& row) {
  const int64_t out = ref.out_features();
  std::vector<float> yr(static_cast<size_t>(n * out)), yc(static_cast<size_t>(n * out));
  ref.forward(x, n, yr.data());
  cand.forward(x, n, yc.data());
  const float* b = ref.bias.defined() && ref.bias.numel() > 0 ? ref.bias.data<float>() : nullptr;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < out; ++j) {
      const double r = yr[i * out + j], c = yc[i * out + j], w = r - (b ? b[j] : 0.0f);
      row.sq_err += (c - r) * (c - r);
      row.sq_ref += w * w;
    }
  row.tokens += n;
}

}  // namespace

std::vector<ProbeRow> probe(const ModelSource& ref, const ModelSource& cand, const std::vector<int32_t>& tokens,
                            std::optional<int32_t> bos, const ProbeOptions& o) {
  const ModelConfig& c = ref.config();
  cand.validate_against_config();
  const ModelConfig& cc = cand.config();
  NIBBLE_CHECK(cc.hidden_size == c.hidden_size && cc.num_layers == c.num_layers &&
                   cc.intermediate_size == c.intermediate_size && cc.vocab_size == c.vocab_size,
               "probe: {} and {} are not the same architecture (hidden {} vs {}, layers {} vs {})", ref.describe(),
               cand.describe(), c.hidden_size, cc.hidden_size, c.num_layers, cc.num_layers);
  NIBBLE_CHECK(o.ctx >= 2 && o.ctx <= c.max_position_embeddings, "probe: --ctx {} must be in [2, {}]", o.ctx,
               c.max_position_embeddings);
  for (int64_t l : o.layers)
    NIBBLE_CHECK(l >= 0 && l < c.num_layers, "probe: layer {} does not exist (the model has {})", l, c.num_layers);
  LayerStream stream(ref, make_windows(tokens, o.ctx, o.chunks, bos, "probe: the text"));
  std::vector<ProbeRow> rows;
  int64_t last = c.num_layers - 1;
  if (!o.layers.empty() && !o.head) last = *o.layers.rbegin();
  Progress bar("probe", last + 1 + (o.head && !c.tie_word_embeddings ? 1 : 0), o.progress, "layers");
  for (int64_t i = 0; i <= last; ++i) {
    const DecoderLayer Lr = DecoderLayer::load(ref, i, /*dense=*/true);
    const bool wanted = o.layers.empty() || o.layers.count(i);
    if (!wanted) {
      stream.apply(Lr, nullptr, true);
      bar.advance();
      continue;
    }
    const DecoderLayer Lc = DecoderLayer::load(cand, i);
    const size_t first = rows.size();
    for (const LinearSlot& s : decoder_linears()) rows.push_back({fmt::format("model.layers.{}.{}.weight", i, s.name), i});
    const InputTap tap = [&](LinearInput which, const float* x, int64_t n, int64_t) {
      for (size_t k = 0; k < decoder_linears().size(); ++k)
        if (decoder_linears()[k].input == which) accumulate(Lr.*decoder_linears()[k].member, Lc.*decoder_linears()[k].member, x, n, rows[first + k]);
    };
    stream.apply(Lr, &tap, true);
    bar.advance();
  }
  if (o.head && !c.tie_word_embeddings) {  // a tied head is the embedding, never quantized
    const LinearWeight hr = stream.load_head(ref), hc = stream.load_head(cand);
    ProbeRow row{"lm_head.weight", -1};
    for (size_t s = 0; s < stream.num_sequences(); ++s) {
      const auto xn = stream.final_normed(s);
      accumulate(hr, hc, xn.data(), stream.length(s), row);
    }
    rows.push_back(row);
    bar.advance();
  }
  bar.finish();
  return rows;
}

}  // namespace nibble::eval
