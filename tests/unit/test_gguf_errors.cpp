// Malformed GGUF files, built by hand (tests/unit/gguf_builder.h): each must
// give one nibble::Error line naming the file and saying what is wrong, and
// random corruption of a real file must never crash the reader.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "gguf_builder.h"
#include "nibble/gguf.h"
#include "test_util.h"

namespace nibble::io {
namespace {

namespace fs = std::filesystem;
using test::GgufBuilder;

constexpr const char* kName = "bad.gguf";

std::string f32_bytes(std::initializer_list<float> v) {
  std::string s;
  for (float x : v) test::put_f32(s, x);
  return s;
}

// A small valid file: two keys, an F32 [2, 4] tensor and one Q4_0 block.
GgufBuilder base() {
  GgufBuilder b;
  b.kv_str("general.architecture", "llama");
  b.kv_str_array("x.names", {"a", "bc"});
  b.tensor("a", {4, 2}, 0, f32_bytes({0, 1, 2, 3, 4, 5, 6, 7}));
  b.tensor("q", {32, 1}, 2, std::string(18, '\x11'));
  return b;
}

GgufFile parse(const std::string& bytes) {
  return GgufFile::from_buffer(nullptr, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), kName);
}

// The error parse() gives; checks it is one line that names the file.
std::string error_of(const std::string& bytes) {
  try {
    GgufFile f = parse(bytes);
    for (const GgufTensorInfo& t : f.tensors()) f.dequantize(t.name);
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(msg.rfind(std::string(kName) + ": ", 0), 0u) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    return msg;
  }
  return "(no error)";
}

#define EXPECT_ERROR(bytes, text)                                     \
  do {                                                                \
    const std::string msg_ = error_of(bytes);                         \
    EXPECT_NE(msg_.find(text), std::string::npos) << "error: " << msg_; \
  } while (0)

TEST(GgufFile, ReadsAHandBuiltFile) {
  const std::string bytes = base().build();  // parse() does not copy: the bytes must outlive f
  const GgufFile f = parse(bytes);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.get_string("general.architecture"), "llama");
  EXPECT_EQ(f.get_string_array("x.names"), (std::vector<std::string>{"a", "bc"}));
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.info("a").shape(), (Shape{2, 4}));  // ne [4, 2] is row-major [2, 4]
  const Tensor a = f.dequantize("a");
  for (int i = 0; i < 8; ++i) EXPECT_EQ(a.data<float>()[i], static_cast<float>(i));
  const Tensor v = f.view("a");
  EXPECT_EQ(v.shape(), (Shape{2, 4}));
  EXPECT_EQ(v.data<float>()[7], 7.0f);
  // Q4_0 block of 0x11 bytes: d = f16 0x1111, every code 1 -> (1 - 8)·d.
  const Tensor q = f.dequantize("q");
  EXPECT_EQ(q.shape(), (Shape{1, 32}));
  EXPECT_EQ(q.data<float>()[0], -7.0f * f16_to_f32(0x1111));
  try {
    f.view("q");
    ADD_FAILURE() << "view of a Q4_0 tensor";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block-quantized"), std::string::npos) << e.what();
  }
}

TEST(GgufFile, EveryTruncationFails) {
  const std::string full = base().build();
  const GgufFile f = parse(full);
  uint64_t needed = 0;  // the file may lose its final padding and still hold every tensor
  for (const GgufTensorInfo& t : f.tensors()) needed = std::max(needed, f.data_offset() + t.offset + t.nbytes);
  for (size_t len = 0; len < full.size(); ++len) {
    SCOPED_TRACE(len);
    if (len < needed)
      EXPECT_NE(error_of(full.substr(0, len)), "(no error)");
    else
      EXPECT_EQ(error_of(full.substr(0, len)), "(no error)");
  }
}

TEST(GgufFile, HeaderDefects) {
  std::string bytes = base().build();
  bytes[3] = 'X';
  EXPECT_ERROR(bytes, "not a GGUF file: expected the magic 'GGUF' (47 47 55 46), found 'GGUX'");
  EXPECT_ERROR(std::string("GGU"), "too short for the magic");
  EXPECT_ERROR(std::string(), "too short for the magic");

  GgufBuilder b = base();
  b.version = 1;
  EXPECT_ERROR(b.build(), "GGUF version 1 is not supported (only 2 and 3");
  b.version = 4;
  EXPECT_ERROR(b.build(), "GGUF version 4 is not supported (expected 2 or 3)");
  b.version = 0x03000000;  // what a big-endian version 3 reads as
  EXPECT_ERROR(b.build(), "big-endian GGUF (version 3 byte-swapped) is not supported");
  b.version = 2;
  EXPECT_EQ(error_of(b.build()), "(no error)");

  // Counts that cannot fit in the file.
  std::string h = "GGUF";
  test::put_u32(h, 3);
  test::put_u64(h, uint64_t{1} << 40);
  test::put_u64(h, 0);
  EXPECT_ERROR(h, "1099511627776 tensor infos cannot fit");
  h = "GGUF";
  test::put_u32(h, 3);
  test::put_u64(h, 0);
  test::put_u64(h, uint64_t{1} << 62);
  EXPECT_ERROR(h, "metadata entries cannot fit");
}

TEST(GgufFile, MetadataDefects) {
  auto with = [](auto&& add) {
    GgufBuilder b = base();
    add(b);
    return b.build();
  };
  EXPECT_ERROR(with([](GgufBuilder& b) { b.kv_u32("general.architecture", 1); }),
               "metadata key 'general.architecture': duplicate key");
  EXPECT_ERROR(with([](GgufBuilder& b) { b.kv_raw("k", 13, ""); }), "metadata key 'k': value type 13 is unknown");
  EXPECT_ERROR(with([](GgufBuilder& b) { b.kv_raw("k", GgufBuilder::Bool, "\x02"); }),
               "metadata key 'k': bool value is 2, expected 0 or 1");
  EXPECT_ERROR(with([](GgufBuilder& b) {
                 std::string v;
                 test::put_u64(v, uint64_t{1} << 60);
                 b.kv_raw("k", GgufBuilder::String, v);
               }),
               "metadata key 'k': string value at byte");
  EXPECT_ERROR(with([](GgufBuilder& b) {
                 std::string v;
                 test::put_u32(v, GgufBuilder::U8);
                 test::put_u64(v, uint64_t{1} << 62);
                 b.kv_raw("k", GgufBuilder::Array, v);
               }),
               "metadata key 'k': truncated or corrupt: an array of 4611686018427387904 uint8 elements");
  EXPECT_ERROR(with([](GgufBuilder& b) {
                 std::string v;
                 for (int d = 0; d < 20; ++d) {  // 20 levels of [array of 1 array]
                   test::put_u32(v, GgufBuilder::Array);
                   test::put_u64(v, 1);
                 }
                 b.kv_raw("k", GgufBuilder::Array, v);
               }),
               "metadata key 'k': arrays nested deeper than 8 levels");
  EXPECT_ERROR(with([](GgufBuilder& b) {
                 std::string v;
                 test::put_u32(v, 77);
                 test::put_u64(v, 0);
                 b.kv_raw("k", GgufBuilder::Array, v);
               }),
               "array element type 77 is unknown");
  EXPECT_ERROR(with([](GgufBuilder& b) { b.kv_u32("general.alignment", 48); }),
               "metadata key 'general.alignment' is 48, expected a power of two");
  EXPECT_ERROR(with([](GgufBuilder& b) { b.kv_f32("general.alignment", 32); }),
               "metadata key 'general.alignment' is float32 32, expected a uint32");
  // A non-default alignment is honoured.
  GgufBuilder b = base();
  b.alignment = 64;
  b.kv_u32("general.alignment", 64);
  const std::string bytes = b.build();
  const GgufFile f = parse(bytes);
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset() % 64, 0u);
  EXPECT_EQ(f.dequantize("a").data<float>()[5], 5.0f);
}

TEST(GgufFile, TensorDefects) {
  auto one = [](const std::string& name, std::vector<uint64_t> ne, uint32_t type, std::string bytes,
                std::optional<uint64_t> offset = std::nullopt) {
    GgufBuilder b;
    b.kv_str("general.architecture", "llama");
    b.tensor(name, std::move(ne), type, std::move(bytes), offset);
    return b;
  };
  EXPECT_ERROR(one("t", {4}, 99, std::string(16, '\0')).build(), "tensor 't': ggml type 99 is unknown");
  EXPECT_ERROR(one("t", {1, 1, 1, 1, 1}, 0, std::string(4, '\0')).build(), "tensor 't': n_dims is 5, expected at most 4");
  EXPECT_ERROR(one("t", {16, 2}, 2, std::string(18, '\0')).build(),
               "tensor 't': the row length ne[0] = 16 is not a multiple of Q4_0's block size 32");
  // Found by fuzz_gguf: a 0-d Q4_0 tensor opened (0 bytes) and failed only in dequantize(), without the file name.
  EXPECT_ERROR(one("t", {}, 2, "").build(),
               "tensor 't': a 0-d tensor (one element) cannot be of Q4_0, whose blocks hold 32 elements");
  EXPECT_ERROR(one("t", {uint64_t{1} << 40, uint64_t{1} << 40}, 0, "").build(), "tensor 't': ne 1099511627776 x "
                                                                                 "1099511627776 overflows 64 bits");
  EXPECT_ERROR(one("t", {uint64_t{1} << 63}, 0, "").build(), "ne[0] is 9223372036854775808, expected at most 2^63-1");
  // Found by fuzz_gguf: an empty tensor (a zero dimension) whose other dimensions overflow opened, and failed in
  // dequantize() without the file's name.
  EXPECT_ERROR(one("t", {0, uint64_t{1} << 40, uint64_t{1} << 40}, 0, "").build(),
               "tensor 't': ne 0 x 1099511627776 x 1099511627776 overflows 64 bits");
  EXPECT_ERROR(one("t", {4}, 0, std::string(16, '\0'), 8).build(),
               "tensor 't': data offset 8 is not a multiple of the alignment 32");
  // Declared bigger than the bytes the file holds.
  EXPECT_ERROR(one("t", {4096}, 0, std::string(16, '\0')).build(),
               "tensor 't' data out of bounds: bytes [0, 16384) of the data section");
  EXPECT_ERROR(one("t", {8}, 0, "", uint64_t{1} << 62).build(), "data out of bounds");
  // A type nibble knows the size of but cannot decode: the file opens, the
  // tensor does not dequantize.
  EXPECT_ERROR(one("t", {256}, static_cast<uint32_t>(GgmlType::IQ2_XXS), std::string(66, '\0')).build(),
               "tensor 't' has ggml type IQ2_XXS, which nibble cannot dequantize (supported: F32, F16, BF16, Q8_0");

  GgufBuilder b = base();
  b.tensor("a", {4}, 0, std::string(16, '\0'));
  EXPECT_ERROR(b.build(), "tensor 'a': duplicate tensor name");
  GgufBuilder o;
  o.kv_str("general.architecture", "llama");
  o.tensor("x", {8}, 0, std::string(32, '\0'), 0);
  o.tensor("y", {8}, 0, std::string(32, '\0'), 0);
  EXPECT_ERROR(o.build(), "tensors 'x' [0, 32) and 'y' [0, 32) overlap");
}

TEST(GgufFile, OpenNamesThePath) {
  test::TempDir tmp("nibble-gguf");
  const fs::path p = tmp / "magic.gguf";
  std::string bytes = base().build();
  bytes[0] = 'X';
  {
    std::ofstream f(p, std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  try {
    GgufFile::open(p);
    ADD_FAILURE() << "opened a file with a bad magic";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(p.string() + ": not a GGUF file", 0), 0u) << e.what();
  }
  try {
    GgufFile::open(tmp / "absent.gguf");
    ADD_FAILURE() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("absent.gguf: cannot open"), std::string::npos) << e.what();
  }
}

// Random byte changes and truncations of a real llama.cpp file: every outcome
// is either a file that opens and dequantizes or one Error line; never a
// crash, a hang or another exception (std::bad_alloc, std::length_error).
TEST(GgufFile, CorruptionNeverCrashes) {
  const fs::path src = test::model_dir("stories260K") / "gguf" / "stories260K-Q4_0.gguf";
  std::ifstream in(src, std::ios::binary);
  const std::string good((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const uint64_t header = parse(good).data_offset();
  std::mt19937_64 rng(1234);
  int opened = 0, refused = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string bytes = good;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      // Half the edits land in the tensor infos (the last ~3 KB of the
      // header), where structure is dense; the rest anywhere in the header.
      const uint64_t lo = rng() % 2 ? header - 3000 : 0;
      const uint64_t pos = lo + rng() % (header - lo);
      bytes[pos] = static_cast<char>(rng() % 4 == 0 ? 0xff : rng());
    }
    if (rng() % 8 == 0) bytes.resize(rng() % bytes.size());
    try {
      GgufFile f = parse(bytes);
      for (const GgufTensorInfo& t : f.tensors()) {
        const GgmlTypeTraits* tt = ggml_type_traits(t.type);
        if (tt->dequantize && t.nbytes < (64u << 20)) f.dequantize(t.name);
      }
      ++opened;
    } catch (const Error& e) {
      ++refused;
      ASSERT_EQ(std::string(e.what()).find('\n'), std::string::npos);
    }
  }
  EXPECT_GT(refused, 100);
  EXPECT_GT(opened, 100);  // most edits hit token strings, which stay valid
}

}  // namespace
}  // namespace nibble::io
