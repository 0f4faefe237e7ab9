// The KL yardstick: how far a candidate model's next-token distributions are
// from the reference's, over the whole vocabulary, per scored position.
//
// Each corpus is cut into non-overlapping windows of ctx tokens (a shorter
// tail is dropped; the first token of a window becomes BOS when the tokenizer
// adds one) and, as in llama.cpp's perplexity/KL protocol, the predictions
// made at positions ctx/2 .. ctx-2 of each window are scored: for each,
// KL(ref ‖ cand) = Σ_v p_ref(v) (log p_ref(v) − log p_cand(v)) from fp32
// log-softmaxes (accumulated in fp64), whether the argmax tokens agree, and
// the NLL of the true next token under both.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "nibble/act_quant.h"
#include "nibble/kv_quant.h"
#include "nibble/source.h"

namespace nibble::eval {

struct Corpus {
  std::string name;
  std::vector<int32_t> tokens;
  std::string sha256;  // of the text (or ids), for the reference cache
};

struct KlOptions {
  int64_t ctx = 512;
  int64_t chunks = 0;  // windows per corpus (0 = all)
  std::optional<int32_t> bos;
  int bootstrap = 1000;  // resamples of chunks for the 95 % intervals
  uint64_t seed = 0;
  bool progress = true;
  // Where the forward runs: "cpu" (one decoder layer at a time, any model
  // size), or "cuda" (CUDA builds: the whole model on the GPU in fp32,
  // cuda::GpuOptions::f32_linears; the same numbers up to fp32 summation
  // order; no --kv or simulated activation quantization).
  std::string device = "cpu";
};

// The reference's scored positions of one corpus: its fp32 log-probabilities
// over the vocabulary (kept in full: no top-k truncation, so the cache adds no
// error), the true next tokens, its argmax and NLL.
struct ReferenceCorpus {
  std::string name;
  int64_t vocab = 0, per_chunk = 0, chunks = 0;  // positions = chunks * per_chunk
  std::vector<int32_t> target, top1;
  std::vector<float> nll;
  Tensor logprobs;  // F32 [positions, vocab] (owned, or mapped from the cache)
};

// How a candidate runs in the forward (the reference and its noise floor
// always run exactly: f32 activations and an f32 KV cache).
struct CandidateOptions {
  // Set: replaces the activation quantizer the candidate's source declares
  // (nullptr: exact activations). Unset: the source's.
  std::optional<const ActQuantSpec*> act_quant;
  // A quantized KV cache, read as a token-by-token decode would (kv_quant.h).
  const KvQuantSpec* kv_quant = nullptr;
};

struct Reference {
  std::vector<ReferenceCorpus> corpora;
  // KL between the reference and a second honest computation of it (bf16
  // activations at every linear), per corpus and overall mean.
  std::vector<double> noise_floor;
  double noise_floor_all = 0;
};

// Runs the reference over the corpora (or loads it from `cache_dir` when the
// cache there was made from the same model, corpora and options). It runs
// exactly even when its source declares an activation quantizer (a note says
// so).
Reference build_reference(const ModelSource& reference, const std::vector<Corpus>& corpora, const KlOptions& o,
                          const std::filesystem::path& cache_dir, std::vector<std::string>& notes);

struct Dist {
  double mean = 0, median = 0, p90 = 0, p99 = 0, p999 = 0, max = 0;
};

struct KlSummary {
  std::string corpus;  // "all" for the pooled row
  int64_t positions = 0, chunks = 0;
  Dist kl;
  bool has_ci = false;                // the intervals below were bootstrapped (EvalOptions::bootstrap > 0)
  double kl_ci_lo = 0, kl_ci_hi = 0;  // bootstrap 95 % of the mean
  double top1 = 0, top1_ci_lo = 0, top1_ci_hi = 0;
  double ppl_ref = 0, ppl_cand = 0;
  double noise_floor = 0;
};

// Scores one candidate against the reference: one summary per corpus, then
// the pooled "all". When `per_position_kl` is given it receives the KL of every
// scored position, corpora in order (the pooled sample the quantiles come
// from; moved out, not copied), for histograms and CDFs.
std::vector<KlSummary> score_candidate(const ModelSource& candidate, const Reference& ref, const std::vector<Corpus>& corpora,
                                       const KlOptions& o, const CandidateOptions& co = {},
                                       std::vector<double>* per_position_kl = nullptr);

// The order statistics of a sample (copied and sorted): quantile q by linear
// interpolation between closest ranks (numpy's default).
double quantile(std::vector<double> v, double q);

}  // namespace nibble::eval
