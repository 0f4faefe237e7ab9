// Reading a JSON file with the project's one-line errors (the file named, why
// it could not be opened, or where its JSON is malformed). Shared by the
// readers of config.json, index files, nibble.json and quantization configs.
#pragma once

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "nibble/error.h"

namespace nibble::io {

inline nlohmann::json read_json_file(const std::filesystem::path& path) {
  std::ifstream f(path);
  NIBBLE_CHECK(f.good(), "{}: cannot open ({})", path.string(), std::strerror(errno));
  try {
    return nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {  // parse_error, or out_of_range for a number past double
    NIBBLE_FAIL("{}: malformed JSON: {}", path.string(), e.what());
  }
}

}  // namespace nibble::io
