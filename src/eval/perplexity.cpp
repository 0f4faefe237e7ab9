#include <cmath>

#include "nibble/error.h"
#include "nibble/eval.h"
#include "nibble/layerwise.h"
#include "nibble/model.h"
#include "nibble/util.h"
#ifdef NIBBLE_HAVE_CUDA
#include "nibble/cuda_model.h"
#endif

namespace nibble::eval {

void log_softmax(const float* l, int64_t vocab, double* out) {
  double mx = l[0];
  for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, static_cast<double>(l[v]));
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v) sum += std::exp(static_cast<double>(l[v]) - mx);
  const double lse = mx + std::log(sum);
  for (int64_t v = 0; v < vocab; ++v) out[v] = static_cast<double>(l[v]) - lse;
}

namespace {

// The scoring half of the protocol, shared by both ways of running the model.
struct Scorer {
  int64_t vocab;
  std::vector<double> lp;
  double sum = 0, sum2 = 0;
  int64_t n = 0;
  explicit Scorer(int64_t v) : vocab(v), lp(static_cast<size_t>(v)) {}
  void window(const float* logits, const std::vector<int32_t>& w) {
    const int64_t ctx = static_cast<int64_t>(w.size());
    for (int64_t j = ctx / 2; j < ctx - 1; ++j) {
      log_softmax(logits + j * vocab, vocab, lp.data());
      const double nll = -lp[static_cast<size_t>(w[j + 1])];
      sum += nll;
      sum2 += nll * nll;
      ++n;
    }
  }
  PerplexityResult result(int64_t chunks) const {
    PerplexityResult r;
    r.chunks = chunks;
    r.scored_tokens = n;
    const double nd = static_cast<double>(n);
    r.mean_nll = sum / nd;
    r.ppl = std::exp(r.mean_nll);
    const double var = n > 1 ? std::max(0.0, (sum2 / nd - r.mean_nll * r.mean_nll) * nd / (nd - 1)) : 0.0;
    r.ppl_stderr = r.ppl * std::sqrt(var / nd);  // d exp(m) = exp(m) dm
    return r;
  }
};

std::vector<std::vector<int32_t>> windows(const ModelConfig& c, const std::vector<int32_t>& tokens, int64_t ctx,
                                          std::optional<int32_t> bos) {
  NIBBLE_CHECK(ctx >= 4, "perplexity: --ctx must be at least 4, found {}", ctx);
  NIBBLE_CHECK(ctx <= c.max_position_embeddings, "perplexity: --ctx {} exceeds the model's context of {} positions",
               ctx, c.max_position_embeddings);
  return make_windows(tokens, ctx, 0, bos, "perplexity: the text");
}

}  // namespace

std::vector<std::vector<int32_t>> make_windows(const std::vector<int32_t>& tokens, int64_t ctx, int64_t max_windows,
                                               std::optional<int32_t> bos, const std::string& what) {
  int64_t n = static_cast<int64_t>(tokens.size()) / ctx;
  NIBBLE_CHECK(n > 0, "{} has {} tokens, fewer than one window of --ctx {}", what, tokens.size(), ctx);
  if (max_windows > 0) n = std::min(n, max_windows);
  std::vector<std::vector<int32_t>> w;
  for (int64_t k = 0; k < n; ++k) {
    w.emplace_back(tokens.begin() + k * ctx, tokens.begin() + (k + 1) * ctx);
    if (bos) w.back()[0] = *bos;
  }
  return w;
}

PerplexityResult perplexity(const Model& model, const std::vector<int32_t>& tokens, int64_t ctx,
                            std::optional<int32_t> bos, bool progress) {
  const ModelConfig& c = model.config();
  const auto ws = windows(c, tokens, ctx, bos);
  Scorer scorer(c.vocab_size);
  Progress bar("perplexity", static_cast<int64_t>(ws.size()), progress, "chunks");
  KVCache cache(c, ctx);
  for (const auto& w : ws) {
    cache.clear();
    const Tensor logits = model.forward(w, cache);  // [ctx, vocab]
    scorer.window(logits.data<float>(), w);
    bar.advance();
  }
  bar.finish();
  return scorer.result(static_cast<int64_t>(ws.size()));
}

PerplexityResult perplexity_streaming(const ModelSource& src, const std::vector<int32_t>& tokens, int64_t ctx,
                                      std::optional<int32_t> bos, bool progress) {
  const auto ws = windows(src.config(), tokens, ctx, bos);
  LayerStream stream(src, ws);
  stream.apply_all(src, progress);
  const LinearWeight head = stream.load_head(src);
  const int64_t V = src.config().vocab_size;
  Scorer scorer(V);
  std::vector<float> logits(static_cast<size_t>(ctx * V));
  for (size_t s = 0; s < ws.size(); ++s) {
    const std::vector<float> xn = stream.final_normed(s);
    head.forward(xn.data(), ctx, logits.data());
    scorer.window(logits.data(), ws[s]);
  }
  return scorer.result(static_cast<int64_t>(ws.size()));
}

PerplexityResult perplexity_cuda(const ModelSource& src, const std::vector<int32_t>& tokens, int64_t ctx,
                                 std::optional<int32_t> bos, bool progress) {
#ifdef NIBBLE_HAVE_CUDA
  const auto ws = windows(src.config(), tokens, ctx, bos);
  cuda::GpuOptions g;
  // What the checkpoint declares, as the CPU forward applies it (each input through the host: GpuOptions).
  g.act_quant = declared_act_quant(src);
  g.f32_linears = true;
  g.decode_graph = false;  // whole windows only
  g.kv_shared_from = -1;
  auto model = cuda::GpuModel::load(src, ctx, g);
  Scorer scorer(src.config().vocab_size);
  Progress bar("perplexity", static_cast<int64_t>(ws.size()), progress, "chunks");
  for (const auto& w : ws) {
    model->reset();
    const Tensor logits = model->forward(w, true);  // [ctx, vocab]
    scorer.window(logits.data<float>(), w);
    bar.advance();
  }
  bar.finish();
  return scorer.result(static_cast<int64_t>(ws.size()));
#else
  (void)src, (void)tokens, (void)ctx, (void)bos, (void)progress;
  NIBBLE_FAIL("ppl: --device cuda needs a CUDA build of nibble (make build NIBBLE_CUDA=on)");
#endif
}

}  // namespace nibble::eval
