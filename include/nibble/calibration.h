// Calibration data: token sequences sampled deterministically from text files
// (tokenized with the model's tokenizer) or token-id files (.npy).
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "nibble/tokenizer.h"

namespace nibble {

struct CalibrationOptions {
  std::vector<std::filesystem::path> files;  // UTF-8 text, or .npy arrays of token ids (flattened)
  int64_t samples = 128;
  int64_t length = 2048;  // clipped to the model's context and to the data
  uint64_t seed = 0;
  // How the windows are cut from the data: "random" (`samples` windows at
  // random starts, drawn with `seed`; they may overlap) or "first" (the data's
  // first samples x length tokens in consecutive windows, as GPTQModel and
  // AutoRound take a list of sequences: for calibrating on exactly their data).
  std::string windows = "random";
};

struct CalibrationSet {
  std::vector<std::vector<int32_t>> sequences;  // samples x length
  int64_t stream_tokens = 0;                    // tokens in all files together
  int64_t length = 0;                           // after clipping
  std::string sha256;                           // of the sampled ids (int32 little-endian), for resume checks
  std::vector<std::string> notes;               // clipping and the like, for the user
};

// Token ids from a .npy of integers (any shape, flattened), each checked
// against the vocabulary; `what` ("--calib", "--corpus") starts the errors.
std::vector<int32_t> read_token_ids_npy(const std::filesystem::path& path, int64_t vocab, const std::string& what);

// Every file becomes one stream of ids (text: encode() without special tokens;
// .npy: its integers, flattened), the streams are concatenated, and each
// sample is a window of length L (minus one for the BOS when `bos` is set, which is
// then put first) starting at an offset drawn from a 64-bit Mersenne twister
// seeded with `seed` (offset = draw mod (tokens − window + 1)): the same files,
// options and tokenizer always give the same samples.
// `tokenizer` may be null when every file is a .npy of ids.
CalibrationSet load_calibration(const CalibrationOptions& options, const Tokenizer* tokenizer,
                                std::optional<int32_t> bos, int64_t max_context, int32_t vocab_size);

}  // namespace nibble
