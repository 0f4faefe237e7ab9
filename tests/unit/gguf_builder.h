// A GGUF writer for tests, written from the format's description (gguf.h's
// header comment), independent of the reader: build files with exactly the
// metadata, tensors and defects a test needs.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "nibble/tensor.h"

namespace nibble::test {

inline void put_u32(std::string& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b += static_cast<char>((v >> (8 * i)) & 0xff);
}
inline void put_u64(std::string& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b += static_cast<char>((v >> (8 * i)) & 0xff);
}
inline void put_str(std::string& b, const std::string& s) {
  put_u64(b, s.size());
  b += s;
}
inline void put_f32(std::string& b, float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  put_u32(b, u);
}

class GgufBuilder {
 public:
  // Value type ids (GgufType).
  enum : uint32_t { U8 = 0, I8, U16, I16, U32, I32, F32, Bool, String, Array, U64, I64, F64 };

  uint32_t version = 3;
  uint64_t alignment = 32;  // padding used; add a general.alignment key to announce another

  // A key with an already-encoded value of type `type`.
  void kv_raw(const std::string& key, uint32_t type, const std::string& value) {
    std::string e;
    put_str(e, key);
    put_u32(e, type);
    kvs_.push_back(e + value);
  }
  void kv_u32(const std::string& key, uint32_t v) {
    std::string b;
    put_u32(b, v);
    kv_raw(key, U32, b);
  }
  void kv_f32(const std::string& key, float v) {
    std::string b;
    put_f32(b, v);
    kv_raw(key, F32, b);
  }
  void kv_str(const std::string& key, const std::string& v) {
    std::string b;
    put_str(b, v);
    kv_raw(key, String, b);
  }
  void kv_str_array(const std::string& key, const std::vector<std::string>& v) {
    std::string b;
    put_u32(b, String);
    put_u64(b, v.size());
    for (const auto& s : v) put_str(b, s);
    kv_raw(key, Array, b);
  }
  // A tensor with explicit bytes; offset = the next aligned offset after the
  // previous tensors unless given.
  void tensor(const std::string& name, std::vector<uint64_t> ne, uint32_t type, std::string bytes,
              std::optional<uint64_t> offset = std::nullopt) {
    tensors_.push_back({name, std::move(ne), type, std::move(bytes), offset});
  }
  // An F32 tensor from a nibble Tensor of row-major shape [.., out, in]:
  // stored with ne = shape reversed.
  void tensor_f32(const std::string& name, const Tensor& t) {
    const Tensor c = t.to_f32();
    std::vector<uint64_t> ne(c.shape().rbegin(), c.shape().rend());
    tensor(name, ne, 0, std::string(static_cast<const char*>(c.raw()), c.nbytes()));
  }

  std::string build() const {
    std::string b = "GGUF";
    put_u32(b, version);
    put_u64(b, tensors_.size());
    put_u64(b, kvs_.size());
    for (const auto& kv : kvs_) b += kv;
    std::vector<uint64_t> offsets;
    uint64_t next = 0;
    for (const auto& t : tensors_) {
      const uint64_t off = t.offset.value_or(next);
      offsets.push_back(off);
      next = std::max(next, (off + t.bytes.size() + alignment - 1) / alignment * alignment);
      put_str(b, t.name);
      put_u32(b, static_cast<uint32_t>(t.ne.size()));
      for (uint64_t d : t.ne) put_u64(b, d);
      put_u32(b, t.type);
      put_u64(b, off);
    }
    b.resize((b.size() + alignment - 1) / alignment * alignment, '\0');
    // The data section: each tensor's bytes at its offset (explicit offsets
    // too, so defect tests can make tensors overlap; a tensor given fewer
    // bytes than its shape needs makes a short data section).
    std::string data;
    for (size_t i = 0; i < tensors_.size(); ++i) {
      const std::string& bytes = tensors_[i].bytes;
      if (bytes.empty()) continue;  // declared only: its offset may point anywhere
      if (data.size() < offsets[i] + bytes.size()) data.resize(offsets[i] + bytes.size(), '\0');
      std::memcpy(data.data() + offsets[i], bytes.data(), bytes.size());
    }
    data.resize((data.size() + alignment - 1) / alignment * alignment, '\0');
    return b + data;
  }

  void write(const std::filesystem::path& path) const {
    const std::string b = build();
    std::ofstream f(path, std::ios::binary);
    f.write(b.data(), static_cast<std::streamsize>(b.size()));
  }

 private:
  struct T {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::string bytes;
    std::optional<uint64_t> offset;
  };
  std::vector<std::string> kvs_;
  std::vector<T> tensors_;
};

}  // namespace nibble::test
