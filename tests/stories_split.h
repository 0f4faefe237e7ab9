// Shared by the calibrated-quantization tests (CPU and GPU): the TinyStories
// split of SOURCES.md, GPTQ options for a test run, and held-out perplexity.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "nibble/calibration.h"
#include "nibble/convert.h"
#include "nibble/eval.h"
#include "nibble/model.h"
#include "nibble/tokenizer.h"
#include "test_util.h"

namespace nibble::test {

// Bytes [begin, end) of tinystories-valid-sample.txt as dir/name: [0, 96207)
// calibrates, the rest evaluates.
inline std::filesystem::path write_stories_part(const TempDir& dir, const std::string& name, size_t begin,
                                                size_t end) {
  const std::string all = read_file(shared_dir() / "data/corpora/tinystories-valid-sample.txt");
  std::ofstream(dir / name, std::ios::binary) << all.substr(begin, std::min(end, all.size()) - begin);
  return dir / name;
}

// GPTQ options for a calibrated test run: `samples` windows of `len` tokens of `calib`, groups of `group`.
inline QuantizeOptions gptq_options(const std::filesystem::path& calib, int64_t samples, int64_t len, int group) {
  QuantizeOptions o;
  o.method = "gptq";
  o.group_size = group;
  o.progress = false;
  o.calib.files = {calib};
  o.calib.samples = samples;
  o.calib.length = len;
  return o;
}

// Perplexity of `model` on the first ctx × chunks tokens of `text` (its own tokenizer, BOS as it adds one).
inline double ppl_of(const std::filesystem::path& model, const std::filesystem::path& text, int64_t ctx,
                     int64_t chunks) {
  auto dir = CheckpointDir::open(model);
  const Tokenizer tok = Tokenizer::from_file(dir->dir() / "tokenizer.json");
  std::vector<int32_t> ids = tok.encode(read_file(text), true);
  ids.resize(std::min<size_t>(ids.size(), static_cast<size_t>(ctx * chunks)));
  return eval::perplexity(*Model::load(*dir), ids, ctx, leading_bos(tok), false).ppl;
}

}  // namespace nibble::test
