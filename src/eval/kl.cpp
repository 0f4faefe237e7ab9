#include "nibble/kl.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <random>

#include <nlohmann/json.hpp>

#include "nibble/error.h"
#include "nibble/eval.h"
#include "nibble/layerwise.h"
#include "nibble/model.h"
#include "nibble/safetensors.h"
#include "nibble/util.h"
#ifdef NIBBLE_HAVE_CUDA
#include "nibble/cuda.h"
#include "nibble/cuda_model.h"
#endif

namespace nibble::eval {
namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

double quantile(std::vector<double> v, double q) {
  NIBBLE_CHECK(!v.empty(), "quantile of an empty sample");
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos)), hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

namespace {

std::vector<std::vector<int32_t>> windows_of(const Corpus& c, const KlOptions& o) {
  NIBBLE_CHECK(o.ctx >= 4, "eval: --ctx must be at least 4, found {}", o.ctx);
  return make_windows(c.tokens, o.ctx, o.chunks, o.bos, fmt::format("eval: corpus '{}'", c.name));
}

int64_t scored_per_window(int64_t ctx) { return ctx - 1 - ctx / 2; }  // positions ctx/2 .. ctx-2

// Per position results of a candidate (or of the noise-floor run).
struct Positions {
  std::vector<double> kl, nll;
  std::vector<uint8_t> agree;
};

// Runs `model` over the corpus windows; with `ref` set, scores every position
// against it; otherwise fills `out` as the reference.
// Windows per pass of the layer stream: bounds the hidden states in memory
// (windows × ctx × hidden f32) while each layer's weights are read once per pass.
constexpr size_t kWindowsPerPass = 32;

// How one run computes: the candidate's options, or the reference's exact
// forward (optionally with bf16 activations: the noise floor).
struct RunSetup {
  bool bf16_activations = false;
  CandidateOptions cand;
};

RunSetup exact(bool bf16_activations) {
  RunSetup r;
  r.bf16_activations = bf16_activations;
  r.cand.act_quant = nullptr;
  return r;
}

// CPU: runs `src` over the windows one decoder layer at a time (only one
// layer's weights in memory; LayerStream gives the same logits as
// Model::forward) and calls fn(k, logits [ctx, vocab]) for every window k.
void for_each_window(const ModelSource& src, const std::vector<std::vector<int32_t>>& ws, const RunSetup& setup,
                     Progress& bar, const std::function<void(size_t, const float*)>& fn) {
  const bool bf16_activations = setup.bf16_activations;
  const ModelConfig& c = src.config();
  for (size_t b0 = 0; b0 < ws.size(); b0 += kWindowsPerPass) {
    const size_t nb = std::min(kWindowsPerPass, ws.size() - b0);
    const std::vector<std::vector<int32_t>> batch(ws.begin() + b0, ws.begin() + b0 + nb);
    LayerStream stream(src, batch);
    for (int64_t i = 0; i < c.num_layers; ++i) {
      DecoderLayer L = DecoderLayer::load(src, i);
      L.bf16_activations = bf16_activations;
      if (setup.cand.act_quant) {  // the user's quantizer: a mixed input counts as quantized
        L.act_quant = *setup.cand.act_quant;
        L.unsimulated.clear();
      }
      stream.apply(L, nullptr, true, setup.cand.kv_quant);
    }
    const LinearWeight head = stream.load_head(src);
    std::vector<float> logits;
    for (size_t k = 0; k < nb; ++k) {
      std::vector<float> xn = stream.final_normed(k);
      if (bf16_activations)
        for (float& v : xn) v = round_to_bf16(v);
      logits.resize(static_cast<size_t>(stream.length(k) * c.vocab_size));
      head.forward(xn.data(), stream.length(k), logits.data());
      fn(b0 + k, logits.data());
      bar.advance();
    }
  }
}

// One source run over windows in one way (RunSetup), on the CPU (the layer
// stream, for_each_window) or on the GPU (KlOptions::device "cuda": the
// model loaded once with f32 linears, cuda::GpuOptions::f32_linears, and
// each window run from an empty cache). Its lifetime bounds the GPU's copy.
class WindowRunner {
 public:
  WindowRunner(const ModelSource& src, const RunSetup& setup, const KlOptions& o) : src_(src), setup_(setup) {
    if (o.device == "cpu") return;
    NIBBLE_CHECK(o.device == "cuda", "eval: --device '{}' (cpu or cuda)", o.device);
#ifdef NIBBLE_HAVE_CUDA
    // The candidate's activation quantizer, else the one its source declares
    // (as DecoderLayer::load applies it on the CPU); each input goes through the host.
    cuda::GpuOptions g;
    g.act_quant = setup.cand.act_quant ? *setup.cand.act_quant : declared_act_quant(src);
    g.f32_linears = true;
    g.bf16_inputs = setup.bf16_activations;
    g.decode_graph = false;  // prefill only
    g.kv_shared_from = -1;
    g.kv_dtype = kv_device_dtype(setup.cand.kv_quant, "eval --device cuda");  // none: f32, bf16: a bf16 cache
    gpu_ = cuda::GpuModel::load(src, o.ctx, g);
#else
    NIBBLE_FAIL("eval: --device cuda needs a CUDA build of nibble (make build NIBBLE_CUDA=on)");
#endif
  }
  // The noise floor's second computation on the same load (RunSetup::bf16_activations).
  void set_bf16_activations(bool on) {
    setup_.bf16_activations = on;
#ifdef NIBBLE_HAVE_CUDA
    if (gpu_) gpu_->set_bf16_inputs(on);
#endif
  }
  void each(const std::vector<std::vector<int32_t>>& ws, Progress& bar,
            const std::function<void(size_t, const float*)>& fn) {
#ifdef NIBBLE_HAVE_CUDA
    if (gpu_) {
      for (size_t k = 0; k < ws.size(); ++k) {
        gpu_->reset();
        const Tensor logits = gpu_->forward(ws[k], true);
        fn(k, logits.data<float>());
        bar.advance();
      }
      cuda::device_memory();  // samples the device's peak in use (eval's memory line)
      return;
    }
#endif
    for_each_window(src_, ws, setup_, bar, fn);
  }

 private:
  const ModelSource& src_;
  RunSetup setup_;
#ifdef NIBBLE_HAVE_CUDA
  std::unique_ptr<cuda::GpuModel> gpu_;
#endif
};

void run(WindowRunner& runner, int64_t V, const std::vector<std::vector<int32_t>>& ws, int64_t ctx,
         const ReferenceCorpus* ref, ReferenceCorpus* out, Positions* pos, Progress& bar) {
  const int64_t per = scored_per_window(ctx);
  std::vector<double> kls(static_cast<size_t>(per)), nlls(static_cast<size_t>(per));
  std::vector<uint8_t> agrees(static_cast<size_t>(per));
  runner.each(ws, bar, [&](size_t k, const float* logits) {
    // Positions are independent: scored in parallel, collected in order.
#pragma omp parallel
    {
      std::vector<double> lp(static_cast<size_t>(V));
#pragma omp for schedule(static)
      for (int64_t i = 0; i < per; ++i) {
        const int64_t j = ctx / 2 + i;
        const float* l = logits + j * V;
        log_softmax(l, V, lp.data());
        const int64_t p = static_cast<int64_t>(k) * per + i;
        const int32_t target = ws[k][j + 1];
        const int32_t top = static_cast<int32_t>(std::max_element(l, l + V) - l);
        if (out) {
          float* dst = out->logprobs.data_mut<float>() + p * V;
          for (int64_t v = 0; v < V; ++v) dst[v] = static_cast<float>(lp[v]);
          out->target[p] = target;
          out->top1[p] = top;
          out->nll[p] = static_cast<float>(-lp[target]);
        } else {
          const float* r = ref->logprobs.data<float>() + p * V;
          double kl = 0;
          // Both log-softmaxes as fp32 values (the reference's are stored so),
          // the sum in fp64: a model against itself gives exactly 0.
          for (int64_t v = 0; v < V; ++v) {
            const double lr = r[v], lc = static_cast<float>(lp[v]);
            kl += std::exp(lr) * (lr - lc);
          }
          kls[i] = std::max(kl, 0.0);  // rounding can leave -1e-17 where the two agree
          nlls[i] = -lp[target];
          agrees[i] = top == ref->top1[p];
        }
      }
    }
    if (pos) {
      pos->kl.insert(pos->kl.end(), kls.begin(), kls.end());
      pos->nll.insert(pos->nll.end(), nlls.begin(), nlls.end());
      pos->agree.insert(pos->agree.end(), agrees.begin(), agrees.end());
    }
  });
}

ojson fingerprint(const ModelSource& src, const std::vector<Corpus>& corpora, const KlOptions& o) {
  ojson names = ojson::object();
  for (const auto& n : src.names()) names[n] = shape_str(src.meta(n).shape);
  ojson cs = ojson::array();
  for (const auto& c : corpora) cs.push_back({{"name", c.name}, {"sha256", c.sha256}, {"tokens", c.tokens.size()}});
  ojson fp = {{"reference", src.describe()},
          {"tensors", names},
          {"corpora", cs},
          {"ctx", o.ctx},
          {"chunks", o.chunks},
          {"bos", o.bos ? ojson(*o.bos) : ojson()},
          {"version", 1}};
  if (o.device != "cpu") fp["device"] = o.device;  // cpu caches keep their fingerprint
  return fp;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

}  // namespace

Reference build_reference(const ModelSource& src, const std::vector<Corpus>& corpora, const KlOptions& o,
                          const fs::path& cache_dir, std::vector<std::string>& notes) {
  const ojson fp = fingerprint(src, corpora, o);
  Reference ref;
  const fs::path index = cache_dir / "reference.json";
  if (!cache_dir.empty() && fs::exists(index)) {
    std::ifstream f(index);
    const ojson old = ojson::parse(f, nullptr, false);
    if (!old.is_discarded() && old.contains("fingerprint") && old["fingerprint"] == fp) {
      for (size_t i = 0; i < corpora.size(); ++i) {
        const auto file = io::SafetensorsFile::open(cache_dir / fmt::format("corpus-{}.safetensors", i));
        ReferenceCorpus rc;
        rc.name = corpora[i].name;
        rc.logprobs = file.tensor("logprobs");
        rc.vocab = rc.logprobs.size(1);
        rc.per_chunk = scored_per_window(o.ctx);
        rc.chunks = rc.logprobs.size(0) / rc.per_chunk;
        const Tensor t = file.tensor("target"), top = file.tensor("top1"), nll = file.tensor("nll");
        rc.target.assign(t.data<int32_t>(), t.data<int32_t>() + t.numel());
        rc.top1.assign(top.data<int32_t>(), top.data<int32_t>() + top.numel());
        rc.nll.assign(nll.data<float>(), nll.data<float>() + nll.numel());
        ref.corpora.push_back(std::move(rc));
      }
      ref.noise_floor = old["noise_floor"].get<std::vector<double>>();
      ref.noise_floor_all = old["noise_floor_all"].get<double>();
      notes.push_back("reference log-probabilities loaded from " + cache_dir.string());
      return ref;
    }
    notes.push_back("reference cache in " + cache_dir.string() + " was made from other inputs; recomputing it");
  }

  src.validate_against_config();
  if (const std::string a = src.activation_quant(); !a.empty())
    notes.push_back(fmt::format("the reference declares activations '{}'; the reference runs with exact activations", a));
  const int64_t V = src.config().vocab_size, per = scored_per_window(o.ctx);
  std::vector<std::vector<std::vector<int32_t>>> ws;
  int64_t total = 0;
  for (const auto& c : corpora) {
    ws.push_back(windows_of(c, o));
    total += static_cast<int64_t>(ws.back().size());
  }
  // One load for both runs (on the GPU the reference's weights stay loaded).
  WindowRunner runner(src, exact(false), o);
  {
    Progress bar("reference", total, o.progress, "windows");
    for (size_t i = 0; i < corpora.size(); ++i) {
      ReferenceCorpus rc;
      rc.name = corpora[i].name;
      rc.vocab = V;
      rc.per_chunk = per;
      rc.chunks = static_cast<int64_t>(ws[i].size());
      const int64_t n = rc.chunks * per;
      rc.logprobs = Tensor::zeros(DType::F32, {n, V});
      rc.target.resize(n);
      rc.top1.resize(n);
      rc.nll.resize(n);
      run(runner, V, ws[i], o.ctx, nullptr, &rc, nullptr, bar);
      ref.corpora.push_back(std::move(rc));
    }
    bar.finish();
  }
  // The noise floor: the same reference, computed a second honest way.
  {
    Progress bar("noise floor", total, o.progress, "windows");
    runner.set_bf16_activations(true);
    double sum = 0;
    int64_t count = 0;
    for (size_t i = 0; i < corpora.size(); ++i) {
      Positions p;
      run(runner, V, ws[i], o.ctx, &ref.corpora[i], nullptr, &p, bar);
      ref.noise_floor.push_back(mean_of(p.kl));
      for (double k : p.kl) sum += k;
      count += static_cast<int64_t>(p.kl.size());
    }
    ref.noise_floor_all = count ? sum / static_cast<double>(count) : 0;
    bar.finish();
  }
  if (!cache_dir.empty()) {
    fs::create_directories(cache_dir);
    for (size_t i = 0; i < ref.corpora.size(); ++i) {
      const ReferenceCorpus& rc = ref.corpora[i];
      const int64_t n = static_cast<int64_t>(rc.target.size());
      io::save_safetensors(
          cache_dir / fmt::format("corpus-{}.safetensors", i),
          {{"logprobs", rc.logprobs},
           {"target", Tensor::view(DType::I32, {n}, rc.target.data(), nullptr)},
           {"top1", Tensor::view(DType::I32, {n}, rc.top1.data(), nullptr)},
           {"nll", Tensor::view(DType::F32, {n}, rc.nll.data(), nullptr)}},
          {{"corpus", rc.name}});
    }
    write_file_atomic(index, ojson{{"fingerprint", fp},
                                   {"noise_floor", ref.noise_floor},
                                   {"noise_floor_all", ref.noise_floor_all}}
                                 .dump(2) +
                                 "\n");
    notes.push_back("reference log-probabilities cached in " + cache_dir.string());
  }
  return ref;
}

std::vector<KlSummary> score_candidate(const ModelSource& cand, const Reference& ref, const std::vector<Corpus>& corpora,
                                       const KlOptions& o, const CandidateOptions& co,
                                       std::vector<double>* per_position_kl) {
  cand.validate_against_config();
  NIBBLE_CHECK(!ref.corpora.empty() && cand.config().vocab_size == ref.corpora[0].vocab,
               "eval: {} has a vocabulary of {} tokens, the reference {}", cand.describe(), cand.config().vocab_size,
               ref.corpora.empty() ? 0 : ref.corpora[0].vocab);
  int64_t total = 0;
  std::vector<std::vector<std::vector<int32_t>>> ws;
  for (const auto& c : corpora) {
    ws.push_back(windows_of(c, o));
    total += static_cast<int64_t>(ws.back().size());
  }
  Progress bar("candidate", total, o.progress, "windows");
  std::vector<KlSummary> out;
  // Per chunk sums, for the pooled row and the bootstrap.
  struct Chunk {
    double kl = 0, agree = 0;
    int64_t n = 0;
  };
  std::vector<Chunk> all_chunks;
  std::vector<double> all_kl;
  double all_agree = 0, all_nll_r = 0, all_nll_c = 0;

  auto summarize = [&](const std::string& name, const std::vector<double>& kl, const std::vector<Chunk>& chunks,
                       double agree, double nll_r, double nll_c, double floor) {
    KlSummary s;
    s.corpus = name;
    s.positions = static_cast<int64_t>(kl.size());
    s.chunks = static_cast<int64_t>(chunks.size());
    s.kl.mean = mean_of(kl);
    s.kl.median = quantile(kl, 0.5);
    s.kl.p90 = quantile(kl, 0.9);
    s.kl.p99 = quantile(kl, 0.99);
    s.kl.p999 = quantile(kl, 0.999);
    s.kl.max = *std::max_element(kl.begin(), kl.end());
    s.top1 = agree / static_cast<double>(kl.size());
    s.ppl_ref = std::exp(nll_r / static_cast<double>(kl.size()));
    s.ppl_cand = std::exp(nll_c / static_cast<double>(kl.size()));
    s.noise_floor = floor;
    // Bootstrap over chunks (positions inside a window are not independent).
    std::mt19937_64 rng(o.seed);
    std::vector<double> kls, tops;
    const uint64_t m = chunks.size();
    for (int b = 0; b < o.bootstrap; ++b) {
      double k = 0, a = 0;
      int64_t n = 0;
      for (uint64_t i = 0; i < m; ++i) {
        const Chunk& c = chunks[rng() % m];
        k += c.kl;
        a += c.agree;
        n += c.n;
      }
      kls.push_back(k / static_cast<double>(n));
      tops.push_back(a / static_cast<double>(n));
    }
    if (o.bootstrap > 0) {
      s.has_ci = true;
      s.kl_ci_lo = quantile(kls, 0.025);
      s.kl_ci_hi = quantile(kls, 0.975);
      s.top1_ci_lo = quantile(tops, 0.025);
      s.top1_ci_hi = quantile(tops, 0.975);
    }
    return s;
  };

  WindowRunner runner(cand, RunSetup{false, co}, o);
  for (size_t i = 0; i < corpora.size(); ++i) {
    const ReferenceCorpus& rc = ref.corpora[i];
    NIBBLE_CHECK(rc.chunks == static_cast<int64_t>(ws[i].size()), "eval: reference and corpus '{}' disagree",
                 corpora[i].name);
    Positions p;
    run(runner, cand.config().vocab_size, ws[i], o.ctx, &rc, nullptr, &p, bar);
    std::vector<Chunk> chunks(static_cast<size_t>(rc.chunks));
    double agree = 0, nll_r = 0, nll_c = 0;
    for (size_t k = 0; k < p.kl.size(); ++k) {
      Chunk& c = chunks[k / static_cast<size_t>(rc.per_chunk)];
      c.kl += p.kl[k];
      c.agree += p.agree[k];
      c.n += 1;
      agree += p.agree[k];
      nll_r += rc.nll[k];
      nll_c += p.nll[k];
    }
    out.push_back(summarize(corpora[i].name, p.kl, chunks, agree, nll_r, nll_c, ref.noise_floor[i]));
    all_chunks.insert(all_chunks.end(), chunks.begin(), chunks.end());
    all_kl.insert(all_kl.end(), p.kl.begin(), p.kl.end());
    all_agree += agree;
    all_nll_r += nll_r;
    all_nll_c += nll_c;
  }
  bar.finish();
  if (corpora.size() > 1)
    out.push_back(summarize("all", all_kl, all_chunks, all_agree, all_nll_r, all_nll_c, ref.noise_floor_all));
  if (per_position_kl) *per_position_kl = std::move(all_kl);
  return out;
}

}  // namespace nibble::eval
