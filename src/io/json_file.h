// Reading a JSON file with the project's one-line errors (the file named, why
// it could not be opened, or where its JSON is malformed), and its fields with
// their types checked. Shared by the readers of config.json, index files,
// nibble.json and quantization configs.
#pragma once

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <type_traits>

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

// Typed fields of a JSON object; `where` names it in errors (a file's path,
// or "path: quantization_config"). A field of the wrong type is an error
// that names it, never nlohmann's type_error.
struct JsonFields {
  std::string where;
  const nlohmann::json& j;

  template <typename T>
  T required(const char* key) const {
    NIBBLE_CHECK(j.is_object() && j.contains(key) && !j.at(key).is_null(), "{}: missing required key '{}'", where, key);
    return get<T>(j.at(key), key);
  }
  template <typename T>
  T optional(const char* key, T fallback) const {
    if (!j.is_object() || !j.contains(key) || j.at(key).is_null()) return fallback;
    return get<T>(j.at(key), key);
  }
  // `v` (the value of field `key`) as a T.
  template <typename T>
  T get(const nlohmann::json& v, const char* key) const {
    if constexpr (std::is_same_v<T, bool>) {
      NIBBLE_CHECK(v.is_boolean(), "{}: '{}' should be a boolean, found {}", where, key, v.dump());
    } else if constexpr (std::is_integral_v<T>) {
      static_assert(std::is_signed_v<T>, "integer fields are read as signed types");
      NIBBLE_CHECK(v.is_number_integer(), "{}: '{}' should be an integer, found {}", where, key, v.dump());
      const bool fits =
          v.is_number_unsigned()
              ? v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<T>::max())
              : v.get<int64_t>() >= std::numeric_limits<T>::min() && v.get<int64_t>() <= std::numeric_limits<T>::max();
      NIBBLE_CHECK(fits, "{}: '{}' = {} is out of range", where, key, v.dump());
    } else if constexpr (std::is_floating_point_v<T>) {
      NIBBLE_CHECK(v.is_number(), "{}: '{}' should be a number, found {}", where, key, v.dump());
    } else {
      NIBBLE_CHECK(v.is_string(), "{}: '{}' should be a string, found {}", where, key, v.dump());
    }
    return v.get<T>();
  }
};

}  // namespace nibble::io
