#include "nibble/calibration.h"

#include <fstream>
#include <random>
#include <sstream>

#include "nibble/error.h"
#include "nibble/npy.h"
#include "nibble/util.h"

namespace nibble {
namespace fs = std::filesystem;

namespace {

std::vector<int32_t> file_ids(const fs::path& path, const Tokenizer* tok, int32_t vocab) {
  NIBBLE_CHECK(fs::is_regular_file(path), "--calib {}: no such file", path.string());
  std::vector<int32_t> ids;
  if (path.extension() == ".npy") {
    ids = read_token_ids_npy(path, vocab, "--calib");
  } else {
    std::ifstream f(path, std::ios::binary);
    NIBBLE_CHECK(f, "--calib {}: cannot open", path.string());
    std::stringstream ss;
    ss << f.rdbuf();
    NIBBLE_CHECK(tok != nullptr, "--calib {}: a text file needs the model's tokenizer.json (or pass token ids as .npy)",
                 path.string());
    try {
      ids = tok->encode(ss.str(), false);
    } catch (const Error& e) {
      NIBBLE_FAIL("--calib {}: {}", path.string(), e.what());
    }
  }
  NIBBLE_CHECK(!ids.empty(), "--calib {}: no tokens", path.string());
  return ids;
}

}  // namespace

std::vector<int32_t> read_token_ids_npy(const fs::path& path, int64_t vocab, const std::string& what) {
  const Tensor t = io::read_npy(path);
  NIBBLE_CHECK(t.dtype() == DType::I32 || t.dtype() == DType::I64 || t.dtype() == DType::I16 || t.dtype() == DType::U8,
               "{} {}: token-id files must hold integers, found {}", what, path.string(), dtype_name(t.dtype()));
  const Tensor c = t.contiguous();
  std::vector<int32_t> ids(static_cast<size_t>(c.numel()));
  for (int64_t i = 0; i < c.numel(); ++i) {
    int64_t v = 0;
    switch (c.dtype()) {
      case DType::I32: v = c.data<int32_t>()[i]; break;
      case DType::I64: v = c.data<int64_t>()[i]; break;
      case DType::I16: v = c.data<int16_t>()[i]; break;
      default: v = c.data<uint8_t>()[i]; break;
    }
    NIBBLE_CHECK(v >= 0 && v < vocab, "{} {}: token id {} at index {} is outside the vocabulary (size {})", what,
                 path.string(), v, i, vocab);
    ids[static_cast<size_t>(i)] = static_cast<int32_t>(v);
  }
  return ids;
}

CalibrationSet load_calibration(const CalibrationOptions& o, const Tokenizer* tok, std::optional<int32_t> bos,
                                int64_t max_context, int32_t vocab) {
  NIBBLE_CHECK(!o.files.empty(), "calibration needs at least one --calib file");
  NIBBLE_CHECK(o.samples > 0, "--calib-samples must be positive, found {}", o.samples);
  NIBBLE_CHECK(o.length >= 2, "--calib-len must be at least 2, found {}", o.length);
  CalibrationSet set;
  std::vector<int32_t> stream;
  for (const fs::path& p : o.files) {
    const auto ids = file_ids(p, tok, vocab);
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  set.stream_tokens = static_cast<int64_t>(stream.size());
  int64_t L = o.length;
  if (max_context > 0 && L > max_context) {
    set.notes.push_back(fmt::format("--calib-len {} clipped to the model's context of {} tokens", L, max_context));
    L = max_context;
  }
  const int64_t lead = bos ? 1 : 0;
  if (L - lead > set.stream_tokens) {
    set.notes.push_back(fmt::format("--calib-len {} clipped to the {} tokens of calibration data", L,
                                    set.stream_tokens + lead));
    L = set.stream_tokens + lead;
  }
  NIBBLE_CHECK(L >= 2, "calibration data too short: {} tokens", set.stream_tokens);
  set.length = L;
  const int64_t window = L - lead, starts = set.stream_tokens - window + 1;
  const bool first = o.windows == "first";
  NIBBLE_CHECK(first || o.windows == "random", "--calib-windows '{}': random or first", o.windows);
  NIBBLE_CHECK(!first || o.samples * window <= set.stream_tokens,
               "--calib-windows first: {} windows of {} tokens need {} tokens of data, and the calibration data has {} "
               "(fewer --calib-samples, a shorter --calib-len, or more data)",
               o.samples, window, o.samples * window, set.stream_tokens);
  if (o.samples * window > set.stream_tokens)
    set.notes.push_back(fmt::format("{} samples of {} tokens overlap: the calibration data has {} tokens", o.samples,
                                    L, set.stream_tokens));
  std::mt19937_64 rng(o.seed);
  for (int64_t s = 0; s < o.samples; ++s) {
    const int64_t start = first ? s * window : static_cast<int64_t>(rng() % static_cast<uint64_t>(starts));
    std::vector<int32_t> seq;
    seq.reserve(static_cast<size_t>(L));
    if (bos) seq.push_back(*bos);
    seq.insert(seq.end(), stream.begin() + start, stream.begin() + start + window);
    set.sequences.push_back(std::move(seq));
  }
  std::vector<int32_t> all;
  for (const auto& s : set.sequences) all.insert(all.end(), s.begin(), s.end());
  set.sha256 = sha256_hex(all.data(), all.size() * sizeof(int32_t));
  return set;
}

}  // namespace nibble
