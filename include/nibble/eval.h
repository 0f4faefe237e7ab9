// Perplexity over a token stream (llama.cpp's protocol).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "nibble/model.h"

namespace nibble::eval {

struct PerplexityResult {
  double ppl = 0;           // exp(mean NLL)
  double ppl_stderr = 0;    // delta-method standard error of ppl
  double mean_nll = 0;
  int64_t scored_tokens = 0;
  int64_t chunks = 0;
};

// Splits `tokens` into non-overlapping windows of `ctx` tokens (a tail shorter
// than ctx is dropped); the first token of each window is replaced by `bos`
// when given; each window runs from an empty cache, and the NLL of the true
// next token is scored for the second half of the window: predictions made at
// positions ctx/2 .. ctx-2 (the llama.cpp perplexity protocol).
PerplexityResult perplexity(const Model& model, const std::vector<int32_t>& tokens, int64_t ctx,
                            std::optional<int32_t> bos, bool progress);

// The same protocol run one decoder layer at a time over all windows at once
// (LayerStream): only one layer's weights are in memory, the hidden states of
// every window are. Gives the same numbers as perplexity().
PerplexityResult perplexity_streaming(const ModelSource& src, const std::vector<int32_t>& tokens, int64_t ctx,
                                      std::optional<int32_t> bos, bool progress);

// The same protocol on the GPU (CUDA builds; elsewhere an Error): the model
// loaded once as the KL yardstick's GPU forward holds it (every linear in fp32
// on the weights as stored, cuda::GpuOptions::f32_linears), each window run
// from an empty cache: perplexity()'s numbers up to fp32 summation order.
PerplexityResult perplexity_cuda(const ModelSource& src, const std::vector<int32_t>& tokens, int64_t ctx,
                                 std::optional<int32_t> bos, bool progress);

// The windows every metric here scores: non-overlapping runs of `ctx` tokens
// from the start of `tokens` (a shorter tail dropped; the first `max_windows`
// when > 0), each starting with `bos` when given. `what` names the text in the
// error when it holds less than one window.
std::vector<std::vector<int32_t>> make_windows(const std::vector<int32_t>& tokens, int64_t ctx, int64_t max_windows,
                                               std::optional<int32_t> bos, const std::string& what);

// log-softmax of one row of logits, in double: out[v] = l[v] - logsumexp(l).
void log_softmax(const float* logits, int64_t vocab, double* out);

}  // namespace nibble::eval
