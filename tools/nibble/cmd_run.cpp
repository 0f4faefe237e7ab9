// nibble run: generate text from a (plain or packed) checkpoint; nibble ppl: perplexity of a text file.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>

#include "commands.h"
#include "nibble/dtype.h"
#include "nibble/error.h"
#include "nibble/eval.h"
#include "nibble/model.h"
#include "nibble/sampler.h"
#include "nibble/tokenizer.h"
#include "nibble/util.h"
#ifdef NIBBLE_HAVE_CUDA
#include "nibble/cuda.h"
#include "nibble/cuda_model.h"
#endif

namespace nibble::cli {
namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// A model on the CPU or the GPU behind one "run these tokens" call.
class Runner {
 public:
  // kv: a KV-cache scheme name ("none": exact); act_quant: an activation
  // quantizer replacing the checkpoint's ("" keeps the checkpoint's).
  Runner(const std::string& path, const std::string& device, const std::string& kv, const std::string& act_quant)
      : src_(open_model_source(path)), kv_(find_kv_quant(kv)) {
    src_->check_loadable();
    const ActQuantSpec* act = act_quant.empty() ? nullptr : find_act_quant(act_quant);
    tok_ = std::make_unique<Tokenizer>(require_tokenizer(*src_, path));
    NIBBLE_CHECK(device == "cpu" || device == "cuda", "--device must be cpu or cuda, found '{}'", device);
#ifndef NIBBLE_HAVE_CUDA
    NIBBLE_CHECK(device == "cpu", "--device cuda: this build has no CUDA backend (build with NIBBLE_CUDA=on)");
#endif
    cuda_ = device == "cuda";
    if (cuda_) {
      kv_dtype_ = kv_device_dtype(kv_, "run --device cuda");  // none or bf16
      const std::string declared = src_->activation_quant();
      NIBBLE_CHECK(act_quant.empty() ? declared.empty() : act == nullptr,
                   "{}: simulated activation quantization is not supported on --device cuda yet (use --device cpu{})",
                   act_quant.empty() ? fmt::format("{} declares activations '{}'", path, declared)
                                     : "--act-quant " + act_quant,
                   act_quant.empty() ? ", or --act-quant none to run it with bf16 activations" : "");
    } else {
      cpu_ = Model::load(*src_);
      if (!act_quant.empty()) cpu_->set_act_quant(act);
    }
  }
  const ModelConfig& config() const { return src_->config(); }
  const Tokenizer& tok() const { return *tok_; }
  // Makes room for `positions` tokens (the KV cache).
  void reserve(int64_t positions, bool cuda_graph) {
    if (cuda_) {
#ifdef NIBBLE_HAVE_CUDA
      cuda::GpuOptions g;
      g.decode_graph = cuda_graph;
      g.kv_dtype = kv_dtype_;
      const size_t before = cuda::device_bytes_live();
      gpu_ = cuda::GpuModel::load(*src_, positions, g);
      model_bytes_ = cuda::device_bytes_live() - before;
      positions_ = positions;
#else
      (void)cuda_graph;
#endif
    } else {
      cache_ = std::make_unique<KVCache>(config(), positions, kv_);
    }
  }
  // On the GPU: runs `ids` as a prefill whose result is dropped (the KV cache
  // emptied after it) and returns its seconds, so that the prefill timed
  // after it runs warm. A process's first prefill also pays one-time setup:
  // loading each kernel on its first launch (CUDA loads modules lazily), the
  // memory pools' first allocations, cuBLAS's first call per shape. The same
  // ids take the same kernels, so none of that is left for the timed one.
  // On the CPU: nothing to warm (-1).
  double warm_up(const std::vector<int32_t>& ids) {
#ifdef NIBBLE_HAVE_CUDA
    if (cuda_) {
      const auto t0 = Clock::now();
      (void)gpu_->forward(ids, false);
      gpu_->reset();
      return seconds_since(t0);
    }
#endif
    (void)ids;
    return -1.0;
  }
  Tensor last_logits(const std::vector<int32_t>& ids) {
#ifdef NIBBLE_HAVE_CUDA
    if (cuda_) return gpu_->forward(ids, false);
#endif
    return cpu_->forward(ids, *cache_, false);
  }
  // Decode on the GPU: up to `steps` steps from `token`, each choosing an id
  // below `limit` on the device (the argmax at temperature 0, else the
  // sampler's draw, continuing its draw numbers) and feeding it to the next
  // step there (no logits copied back, no host round trip per token); `emit`
  // sees each id and returns false to stop.
  bool device_decode(const Sampler& sampler, int64_t limit) const {
#ifdef NIBBLE_HAVE_CUDA
    if (cuda_) return sampler.config().temperature == 0.0f || cuda::samples_on_device(sampler.config(), limit);
#endif
    (void)sampler, (void)limit;
    return false;
  }
  void device_run(int32_t token, int64_t limit, int64_t steps, Sampler& sampler,
                  const std::function<bool(int32_t)>& emit) {
    NIBBLE_CHECK(cuda_, "device_run: the device-side decode loop is the GPU's");
#ifdef NIBBLE_HAVE_CUDA
    if (sampler.config().temperature == 0.0f) {
      gpu_->decode_greedy_run(token, limit, steps, emit);
    } else {
      sampler.advance(static_cast<uint64_t>(
          gpu_->decode_sample_run(token, limit, steps, sampler.config(), sampler.draws(), emit)));
    }
#else
    (void)token, (void)limit, (void)steps, (void)sampler, (void)emit;
#endif
  }
  // A note on the quantized matrices that no kernel takes (held as bf16 on
  // the GPU, as f32 on the CPU, so more memory and a slower decode than the
  // format's bytes promise), or "".
  std::string fallback_note() const {
    std::string note;
#ifdef NIBBLE_HAVE_CUDA
    if (cuda_) {
      std::vector<std::string> kernels;  // what the registry takes, for the note
      for (const cuda::LinearKernel* k : cuda::linear_kernel_registry())
        kernels.push_back(fmt::format("{} ({}) at groups of {}", k->name, k->format, fmt::join(k->group_sizes, ", ")));
      for (const DenseFallback& f : cuda::dense_fallbacks(*src_))
        note += fmt::format("note: {} matrices in {} ({:.1f} M weights) have no GPU kernel: they run dequantized to "
                            "bf16 through cuBLAS (2 bytes a weight). GPU kernels: {}\n",
                            f.matrices, f.format, f.params / 1e6, fmt::join(kernels, "; "));
      return note;
    }
#endif
    for (const DenseFallback& f : cpu_dense_fallbacks(*src_))
      note += fmt::format("note: {} matrices in {} ({:.1f} M weights) have no CPU kernel: they run dequantized to f32 "
                          "(4 bytes a weight)\n",
                          f.matrices, f.format, f.params / 1e6);
    return note;
  }
  // For the GPU: what nibble's buffers hold on the device (the model as
  // loaded, and the peak of the run so far), or "" on the CPU. Call it
  // before roofline(), whose bandwidth probe allocates 1 GiB.
  std::string memory() const {
#ifdef NIBBLE_HAVE_CUDA
    if (cuda_) {
      const size_t kv = gpu_->cache_bytes();
      const cuda::DeviceMemory dev = cuda::device_memory();
      return fmt::format("cuda memory: the model {} (weights and scratch {}, {} KV cache of {} positions {}); peak "
                         "{} in nibble's buffers; the device has {} of {} in use (with the CUDA context, cuBLAS "
                         "workspace, memory pools and any other process)\n",
                         human_bytes(model_bytes_), human_bytes(model_bytes_ - kv),
                         kv_dtype_ == DType::BF16 ? "bf16" : "f32", positions_, human_bytes(kv),
                         human_bytes(cuda::device_bytes_peak()), human_bytes(dev.used), human_bytes(dev.total));
    }
#endif
    return "";
  }
  // For the GPU: a line on what one decode step reads against the device's
  // read bandwidth (measured now), or "" on the CPU. The roofline is the
  // weights' (issue 6's measure); `cached` is the mean number of positions
  // the steps' attention read, and where their keys and values add more than
  // 1 % to the weights a second roofline counts them too.
  std::string roofline(double decode_tok_s, double cached) const {
#ifdef NIBBLE_HAVE_CUDA
    if (cuda_) {
      const double bytes = static_cast<double>(gpu_->decode_weight_bytes());
      const double gbs = cuda::read_bandwidth_gbs();
      const double roof = gbs * 1e9 / bytes;
      std::string line = fmt::format(
          "cuda decode ({}): {:.3f} GB of weights per token; read bandwidth {:.0f} GB/s (1 GiB read kernel) -> "
          "roofline {:.1f} tok/s; measured {:.1f} tok/s = {:.1f} % of roofline",
          gpu_->decode_graph() ? "CUDA graph" : "no graph", bytes / 1e9, gbs, roof, decode_tok_s,
          100.0 * decode_tok_s / roof);
      const double kv = cached * static_cast<double>(gpu_->cache_bytes()) / static_cast<double>(positions_);
      if (kv > 0.01 * bytes) {
        const double roof_kv = gbs * 1e9 / (bytes + kv);
        line += fmt::format("; with the KV cache ({:.0f} positions on average, {:.3f} GB per token) {:.1f} tok/s "
                            "= {:.1f} %",
                            cached, kv / 1e9, roof_kv, 100.0 * decode_tok_s / roof_kv);
      }
      return line + "\n";
    }
#endif
    (void)decode_tok_s, (void)cached;
    return "";
  }

 private:
  std::unique_ptr<ModelSource> src_;
  const KvQuantSpec* kv_ = nullptr;
  std::unique_ptr<Tokenizer> tok_;
  bool cuda_ = false;
  size_t model_bytes_ = 0;  // device bytes the GPU model took at load
  DType kv_dtype_ = DType::F32;  // the GPU's KV cache (--kv none or bf16)
  int64_t positions_ = 0;
  std::unique_ptr<Model> cpu_;
  std::unique_ptr<KVCache> cache_;
#ifdef NIBBLE_HAVE_CUDA
  std::unique_ptr<cuda::GpuModel> gpu_;
#endif
};

}  // namespace

void register_run(CLI::App& app, const GlobalOptions& global) {
  auto* cmd = app.add_subcommand("run", "Generate text with a checkpoint (plain or packed) on the CPU or a GPU");
  struct Opts {
    std::string model, prompt, device = "cpu", kv = "none", act_quant;
    int n = 128;
    SamplerConfig sampler;
    bool truncate = false, ignore_eos = false, no_cuda_graph = false, no_warmup = false;
  };
  auto o = std::make_shared<Opts>();
  cmd->add_option("--model", o->model, "Model: " + model_help())->required();
  cmd->add_option("--prompt", o->prompt, "Prompt text")->required();
  cmd->add_option("-n,--n-tokens", o->n, "New tokens to generate")->capture_default_str()->check(nonnegative());
  cmd->add_option("--temp", o->sampler.temperature,
                  "Temperature (0 = greedy). Above 0 each token is drawn from softmax(logits / T) over the kept ids "
                  "(on the GPU too, with no logits copied back); the same seed draws the same ids from the same "
                  "logits on either device")
      ->capture_default_str();
  cmd->add_option("--top-k", o->sampler.top_k, "Keep the k most likely tokens (0 = all)")->capture_default_str();
  cmd->add_option("--top-p", o->sampler.top_p,
                  "Nucleus sampling: keep the most likely ids up to this share of the (top-k) mass (1 = all)")
      ->capture_default_str();
  cmd->add_option("--seed", o->sampler.seed, "Random seed for sampling (the same seed and prompt give the same text)")->capture_default_str();
  cmd->add_flag("--truncate", o->truncate, "Keep only the end of a prompt longer than the context");
  cmd->add_flag("--ignore-eos", o->ignore_eos,
                "Generate exactly -n tokens, past end-of-sequence ids (benchmarks, random synthesized models)");
  cmd->add_flag("--no-cuda-graph", o->no_cuda_graph,
                "--device cuda: launch the decode step's kernels one by one instead of replaying a CUDA graph");
  cmd->add_flag("--no-warmup", o->no_warmup,
                "--device cuda: time the process's first prefill, one-time setup included, instead of running the "
                "prompt once first (dropped; stderr gives its time) and timing a warm prefill");
  cmd->add_option("--device", o->device,
                  "cpu, or cuda (CUDA builds: int4 linears through the W4A16 kernels, the rest through cuBLAS; stderr "
                  "then also gives the model's GPU memory and decode tok/s against the roofline)")
      ->capture_default_str();
  cmd->add_option("--kv", o->kv,
                  "KV-cache format: none (f32), " + kv_quant_names() +
                      ". On the CPU each is simulated in the f32 forward; --device cuda holds none or bf16 for real "
                      "(bf16: half the cache memory)")
      ->capture_default_str();
  cmd->add_option("--act-quant", o->act_quant,
                  "Simulated activation quantization at every linear input (CPU), replacing what the checkpoint "
                  "declares: none, " + act_quant_names());
  cmd->footer("Examples:\n  nibble run --model out/stories-rtn --prompt \"Once upon a time\" -n 100\n"
              "  nibble run --model out/stories-rtn --prompt \"Once upon a time\" -n 100 --kv int4\n"
              "  nibble run --model out/stories-rtn --prompt \"Once upon a time\" -n 100 --temp 0.8 --top-p 0.95 "
              "--seed 1\n"
              "  nibble run --model ../shared/models/stories260K/gguf/stories260K-Q4_K_M.gguf --prompt \"Once upon a time\"\n"
              "  nibble run --model out/stories-rtn --prompt \"Once upon a time\" -n 100 --device cuda\n"
              "  nibble run --model out/stories-rtn --prompt \"Once upon a time\" -n 100 --device cuda --kv bf16\n"
              "  nibble run --model out/synth-8b-rtn --prompt hello -n 256 --ignore-eos --device cuda   "
              "(decode tok/s against the roofline)");
  cmd->callback([o, &global] {
    Runner m(o->model, o->device, o->kv, o->act_quant);
    const ModelConfig& c = m.config();
    std::vector<int32_t> ids = m.tok().encode(o->prompt, true);
    NIBBLE_CHECK(!ids.empty(), "the prompt encodes to no tokens; give some text");
    const int64_t ctx = c.max_position_embeddings;
    if (static_cast<int64_t>(ids.size()) + o->n > ctx) {
      NIBBLE_CHECK(o->truncate, "prompt ({} tokens) + {} new tokens exceed the model's context of {} (pass --truncate "
                   "to keep the end of the prompt, or lower -n)", ids.size(), o->n, ctx);
      NIBBLE_CHECK(o->n < ctx, "-n {} alone exceeds the model's context of {}", o->n, ctx);
      ids.erase(ids.begin(), ids.end() - (ctx - o->n));
    }
    Sampler sampler(o->sampler);
    m.reserve(static_cast<int64_t>(ids.size()) + o->n, !o->no_cuda_graph);
    if (!global.quiet) std::fprintf(stderr, "%s", m.fallback_note().c_str());
    if (!o->no_warmup) {
      const double warm_s = m.warm_up(ids);
      if (warm_s >= 0 && !global.quiet)
        std::fprintf(stderr, "warm-up: the prompt's %zu tokens run once and dropped, in %.1f ms (with a process's one-time "
                     "setup: kernels loaded, memory pools, cuBLAS's first calls); the prefill below runs warm\n",
                     ids.size(), 1e3 * warm_s);
    }
    std::printf("%s", m.tok().decode(ids, true).c_str());
    std::fflush(stdout);

    const auto t0 = Clock::now();
    Tensor logits = m.last_logits(ids);
    const double prefill_s = seconds_since(t0);
    // Stop at an end-of-sequence id; also at BOS, which models trained on
    // BOS-delimited documents (llama2.c's TinyStories) emit to end a story.
    std::vector<int32_t> stop(c.eos_token_ids.begin(), c.eos_token_ids.end());
    if (auto e = m.tok().eos_id()) stop.push_back(*e);
    if (auto b = leading_bos(m.tok())) stop.push_back(*b);
    StreamDecoder stream(m.tok(), true);
    // Models often have more embedding rows than their tokenizer has tokens
    // (padded vocabularies; a synthesized model with a borrowed tokenizer):
    // sample only ids the tokenizer can turn back into text.
    const int64_t samplable = std::min<int64_t>(c.vocab_size, m.tok().vocab_size());
    const auto t1 = Clock::now();
    int generated = 0;
    // On the GPU each id is chosen on the device (no logits row copied back
    // per token; cuda::samples_on_device says where it cannot); the
    // first token comes from the prefill's logits.
    const bool on_device = m.device_decode(sampler, samplable);
    auto emit = [&](int32_t id) {
      if (!o->ignore_eos && std::find(stop.begin(), stop.end(), id) != stop.end()) return false;
      ++generated;
      std::printf("%s", stream.step(id).c_str());
      std::fflush(stdout);
      return true;
    };
    if (o->n > 0) {
      int32_t next = sampler.sample(logits.data<float>(), samplable);
      if (emit(next)) {
        if (on_device) {
          m.device_run(next, samplable, o->n - 1, sampler, emit);
        } else {
          for (int i = 1; i < o->n; ++i) {
            logits = m.last_logits({next});
            next = sampler.sample(logits.data<float>(), samplable);
            if (!emit(next)) break;
          }
        }
      }
    }
    std::printf("%s\n", stream.finish().c_str());
    std::fflush(stdout);  // the text first, then the timings on stderr
    const double decode_s = seconds_since(t1);
    if (!global.quiet) {
      // tok/s counts sampled tokens; the first one comes from the prefill's
      // logits, so with -n 256 the forward rate is 0.4 % lower than printed.
      const double decode_tok_s = generated > 0 ? generated / decode_s : 0.0;
      std::fprintf(stderr, "prefill: %zu tokens in %.1f ms (%.1f tok/s); decode: %d tokens in %.1f ms (%.1f tok/s)\n",
                   ids.size(), 1e3 * prefill_s, ids.size() / prefill_s, generated, 1e3 * decode_s, decode_tok_s);
      std::fprintf(stderr, "%s", m.memory().c_str());
      // Step i (of the generated tokens after the first) runs at position ids.size() + i - 1 and reads the cache
      // up to it: ids.size() + i positions, i = 1 .. generated - 1.
      const double cached = static_cast<double>(ids.size()) + generated / 2.0;
      if (generated > 0) std::fprintf(stderr, "%s", m.roofline(decode_tok_s, cached).c_str());
    }
  });
}

void register_ppl(CLI::App& app, const GlobalOptions& global) {
  auto* cmd = app.add_subcommand("ppl", "Perplexity of a text file (llama.cpp protocol: second half of each window)");
  auto model = std::make_shared<std::string>();
  auto text = std::make_shared<std::string>();
  auto ctx = std::make_shared<int64_t>(512);
  auto max_chunks = std::make_shared<int64_t>(0);
  cmd->add_option("--model", *model, "Model: " + model_help())->required();
  cmd->add_option("--text", *text, "UTF-8 text file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--ctx", *ctx, "Window length in tokens")->capture_default_str();
  cmd->add_option("--chunks", *max_chunks, "Score at most this many windows (0 = all)")
      ->capture_default_str()
      ->check(nonnegative());
  auto stream = std::make_shared<bool>(false);
  cmd->add_flag("--stream", *stream,
                "Run one decoder layer at a time over all windows (only one layer's weights in memory; "
                "the hidden states of all windows are)");
  auto device = std::make_shared<std::string>("cpu");
  cmd->add_option("--device", *device,
                  "cpu, or cuda (CUDA builds: the forward of eval --device cuda, fp32 on the weights as stored: the "
                  "CPU's numbers, faster)")
      ->capture_default_str()
      ->check(CLI::IsMember({"cpu", "cuda"}));
  cmd->footer("Examples:\n  nibble ppl --model out/qwen3-rtn --text ../shared/data/corpora/linux-eval.txt --ctx 512 --chunks 20\n"
              "  nibble ppl --model ../shared/models/stories260K/gguf/stories260K-Q4_K_M.gguf \\\n"
              "      --text ../shared/data/corpora/tinystories-valid-sample.txt --ctx 256 --chunks 20\n"
              "  nibble ppl --model out/qwen3-rtn --text ../shared/data/corpora/linux-eval.txt --device cuda");
  cmd->callback([=, &global] {
    auto dir = open_model_source(*model);
    dir->check_loadable();  // before the first window, not at the layer that holds the tensor
    const Tokenizer tok = require_tokenizer(*dir, *model);
    std::ifstream f(*text, std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    std::vector<int32_t> ids = tok.encode(ss.str(), true);
    if (*max_chunks > 0 && static_cast<int64_t>(ids.size()) > *max_chunks * *ctx) ids.resize(*max_chunks * *ctx);
    NIBBLE_CHECK(!*stream || *device == "cpu", "ppl: --stream runs on the CPU; leave it out with --device cuda");
    const auto r = *device == "cuda" ? eval::perplexity_cuda(*dir, ids, *ctx, leading_bos(tok), !global.quiet)
                   : *stream         ? eval::perplexity_streaming(*dir, ids, *ctx, leading_bos(tok), !global.quiet)
                                     : eval::perplexity(*Model::load(*dir), ids, *ctx, leading_bos(tok), !global.quiet);
    std::printf("ppl %.4f +/- %.4f  (mean NLL %.5f over %lld tokens in %lld windows of %lld)\n", r.ppl, r.ppl_stderr,
                r.mean_nll, static_cast<long long>(r.scored_tokens), static_cast<long long>(r.chunks),
                static_cast<long long>(*ctx));
  });
}

}  // namespace nibble::cli
