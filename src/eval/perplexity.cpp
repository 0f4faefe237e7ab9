#include <cmath>

#include "nibble/error.h"
#include "nibble/eval.h"
#include "nibble/util.h"

namespace nibble::eval {

void log_softmax(const float* l, int64_t vocab, double* out) {
  double mx = l[0];
  for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, static_cast<double>(l[v]));
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(l[v]) - mx);
  const double lse = mx + std::log(sum);
  for (int64_t v = 0; v < vocab; ++v) out[v] = static_cast<double>(l[v]) - lse;
}

PerplexityResult perplexity(const Model& model, const std::vector<int32_t>& tokens, int64_t ctx,
                            std::optional<int32_t> bos, bool progress) {
  const ModelConfig& c = model.config();
  NIBBLE_CHECK(ctx >= 4, "perplexity: --ctx must be at least 4, found {}", ctx);
  NIBBLE_CHECK(ctx <= c.max_position_embeddings, "perplexity: --ctx {} exceeds the model's context of {} positions",
               ctx, c.max_position_embeddings);
  const int64_t chunks = static_cast<int64_t>(tokens.size()) / ctx;
  NIBBLE_CHECK(chunks > 0, "perplexity: the text has {} tokens, fewer than one window of --ctx {}", tokens.size(),
               ctx);
  PerplexityResult r;
  r.chunks = chunks;
  double sum = 0, sum2 = 0;
  std::vector<double> lp(static_cast<size_t>(c.vocab_size));
  Progress bar("perplexity", chunks, progress, "chunks");
  KVCache cache(c, ctx);
  for (int64_t k = 0; k < chunks; ++k) {
    std::vector<int32_t> window(tokens.begin() + k * ctx, tokens.begin() + (k + 1) * ctx);
    if (bos) window[0] = *bos;
    cache.clear();
    const Tensor logits = model.forward(window, cache);  // [ctx, vocab]
    for (int64_t j = ctx / 2; j < ctx - 1; ++j) {
      log_softmax(logits.data<float>() + j * c.vocab_size, c.vocab_size, lp.data());
      const double nll = -lp[static_cast<size_t>(window[j + 1])];
      sum += nll;
      sum2 += nll * nll;
      ++r.scored_tokens;
    }
    bar.advance();
  }
  bar.finish();
  const double n = static_cast<double>(r.scored_tokens);
  r.mean_nll = sum / n;
  r.ppl = std::exp(r.mean_nll);
  const double var = n > 1 ? std::max(0.0, (sum2 / n - r.mean_nll * r.mean_nll) * n / (n - 1)) : 0.0;
  r.ppl_stderr = r.ppl * std::sqrt(var / n);  // d exp(m) = exp(m) dm
  return r;
}

}  // namespace nibble::eval
