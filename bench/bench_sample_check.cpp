// How often top-k / top-p's check (sampling::draw_kept, the GPU select
// kernel's shortcut) keeps the unfiltered draw on a model's own logits: the
// CPU forward over the first tokens of a text, then at each position a few
// draws per configuration. Where the check keeps the draw, the GPU's
// sampled step skips the select's radix passes.
//
//   bench_sample_check --model DIR --text FILE [--tokens 512] [--draws 4]
//
// Prints, per configuration, the draws the check keeps and, as the
// reference measured in the same run, how often the filtered draw (the
// sampler's own) equals the unfiltered one: the check can keep no more.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "nibble/model.h"
#include "nibble/sampler.h"
#include "nibble/source.h"
#include "nibble/tokenizer.h"

int main(int argc, char** argv) {
  using namespace nibble;
  std::string model, text;
  int64_t tokens = 512;
  int draws = 4;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return std::string(argv[++i]);
    };
    if (a == "--model") model = value();
    else if (a == "--text") text = value();
    else if (a == "--tokens") tokens = std::atoll(value().c_str());
    else if (a == "--draws") draws = std::atoi(value().c_str());
    else {
      std::fprintf(stderr, "usage: bench_sample_check --model DIR --text FILE [--tokens 512] [--draws 4]\n");
      return a == "--help" || a == "-h" ? 0 : 2;
    }
  }
  if (model.empty() || text.empty() || tokens < 1 || draws < 1) {
    std::fprintf(stderr, "bench_sample_check: --model and --text are required; --tokens, --draws >= 1\n");
    return 2;
  }
  try {
    auto src = CheckpointDir::open(model);
    auto m = Model::load(*src);
    std::ifstream f(text);
    if (!f) throw std::runtime_error("cannot read " + text);
    std::stringstream ss;
    ss << f.rdbuf();
    std::vector<int32_t> ids = src->tokenizer()->encode(ss.str().substr(0, 64 * static_cast<size_t>(tokens)), true);
    ids.resize(std::min<size_t>(ids.size(), static_cast<size_t>(tokens)));
    KVCache cache(m->config(), static_cast<int64_t>(ids.size()));
    const Tensor L = m->forward(ids, cache, true);
    const int64_t V = m->config().vocab_size, n = static_cast<int64_t>(ids.size());
    const SamplerConfig configs[] = {{.temperature = 0.8f, .top_k = 0, .top_p = 0.95f, .seed = 7},
                                     {.temperature = 0.8f, .top_k = 40, .top_p = 1.0f, .seed = 7},
                                     {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .seed = 7},
                                     {.temperature = 0.7f, .top_k = 0, .top_p = 0.9f, .seed = 7},
                                     {.temperature = 1.0f, .top_k = 50, .top_p = 0.9f, .seed = 7}};
    std::printf("%s: %lld positions of %s, %d draws each\n", model.c_str(), static_cast<long long>(n), text.c_str(),
                draws);
    std::printf("%-32s %12s %12s\n", "config", "check keeps", "same draw");
    for (const SamplerConfig& c : configs) {
      int64_t kept = 0, same = 0, all = 0;
      SamplerConfig open = c;
      open.top_k = 0;
      open.top_p = 1.0f;
      for (int64_t r = 0; r < n; ++r) {
        const float* l = L.data<float>() + r * V;
        for (int d = 0; d < draws; ++d) {
          const uint64_t number = static_cast<uint64_t>(r * draws + d);
          const int32_t id = sample_logits(l, V, open, number);
          kept += sample_check_keeps(l, V, c, id);
          same += sample_logits(l, V, c, number) == id;
          ++all;
        }
      }
      char name[64];
      std::snprintf(name, sizeof name, "T %.1f top-k %d top-p %.2f", c.temperature, c.top_k, c.top_p);
      std::printf("%-32s %11.1f%% %11.1f%%\n", name, 100.0 * kept / all, 100.0 * same / all);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sample_check: %s\n", e.what());
    return 1;
  }
  return 0;
}
