// safetensors reader and writer: round trips of every dtype, files written by
// hand straight from the spec, the broken-file corpus, writer misuse.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "nibble/safetensors.h"
#include "test_util.h"

namespace nibble::io {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

std::vector<DType> all_dtypes() {
  std::vector<DType> out;
  for (int i = 0; i <= static_cast<int>(DType::F8_E5M2); ++i) out.push_back(static_cast<DType>(i));
  return out;
}

std::vector<uint8_t> random_bytes(size_t n, DType dt, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> out(n);
  for (auto& b : out) b = static_cast<uint8_t>(rng());
  if (dt == DType::Bool)
    for (auto& b : out) b &= 1;
  return out;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A file built by hand exactly as the spec describes: 8-byte little-endian
// header length, the JSON header, the data buffer. No nibble code involved.
std::string hand_made(const std::string& header, const std::string& data) {
  std::string out;
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

// Runs `fn`, expects a nibble::Error, and returns its message.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected nibble::Error";
  return "";
}

std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.raw()), t.nbytes());
}

// ------------------------------------------------------------ round trips

TEST(SafetensorsRoundTrip, EveryDtypeAndShape) {
  TempDir tmp;
  const auto path = tmp / "all.safetensors";
  // 0-d scalar, zero-sized dims in several positions, odd sizes.
  const std::vector<Shape> shapes = {{}, {0}, {1}, {7}, {3, 5}, {2, 0, 3}, {0, 0}, {2, 3, 1, 5}};
  struct Item {
    std::string name;
    DType dtype;
    Shape shape;
    std::vector<uint8_t> bytes;
  };
  std::vector<Item> items;
  uint32_t seed = 1;
  for (DType dt : all_dtypes())
    for (const Shape& s : shapes) {
      const size_t n = static_cast<size_t>(shape_numel(s)) * dtype_size(dt);
      items.push_back({fmt::format("{}.{}", dtype_name(dt), shape_str(s)), dt, s, random_bytes(n, dt, seed++)});
    }

  {
    SafetensorsWriter w(path);
    for (const auto& it : items) w.declare(it.name, it.dtype, it.shape);
    for (const auto& it : items) w.write(it.name, it.bytes.data(), it.bytes.size());
    w.finish();
  }

  const auto f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), items.size());
  EXPECT_TRUE(f.metadata().empty());
  EXPECT_EQ(f.file_size(), fs::file_size(path));
  // Declaration order is offset order; the offsets tile the buffer.
  uint64_t offset = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const TensorInfo& ti = f.tensors()[i];
    SCOPED_TRACE(items[i].name);
    EXPECT_EQ(ti.name, items[i].name);
    EXPECT_EQ(ti.dtype, items[i].dtype);
    EXPECT_EQ(ti.shape, items[i].shape);
    EXPECT_EQ(ti.begin, offset);
    EXPECT_EQ(ti.end - ti.begin, items[i].bytes.size());
    offset = ti.end;

    ASSERT_TRUE(f.contains(items[i].name));
    const Tensor t = f.tensor(items[i].name);
    EXPECT_EQ(t.dtype(), items[i].dtype);
    EXPECT_EQ(t.shape(), items[i].shape);
    ASSERT_EQ(t.nbytes(), items[i].bytes.size());
    if (t.nbytes()) {
      EXPECT_EQ(std::memcmp(t.raw(), items[i].bytes.data(), t.nbytes()), 0);
      // The writer aligns the buffer, so views are aligned for their dtype.
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw()) % dtype_size(t.dtype()), 0u);
    }
  }
}

TEST(SafetensorsRoundTrip, SaveTensorsAndMetadata) {
  TempDir tmp;
  const auto path = tmp / "meta.safetensors";
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"nibble.method", "gptq"}, {"empty", ""}, {"unicode", "grüße ✓"}, {"quote", "a\"b\\c\n"}};
  Tensor a = Tensor::zeros(DType::F32, {2, 3});
  for (int i = 0; i < 6; ++i) a.data_mut<float>()[i] = 0.5f * static_cast<float>(i) - 1.0f;
  Tensor b = Tensor::zeros(DType::I64, {});
  b.data_mut<int64_t>()[0] = -1234567890123LL;
  Tensor c = Tensor::zeros(DType::BF16, {0, 4});
  save_safetensors(path, {{"z.weight", a}, {"a.scalar", b}, {"m.empty", c}}, meta);

  const auto f = SafetensorsFile::open(path);
  EXPECT_EQ(f.metadata(), meta);
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "z.weight");  // offset order = declaration order, not name order
  EXPECT_EQ(bytes_of(f.tensor("z.weight")), bytes_of(a));
  EXPECT_EQ(f.tensor("a.scalar").data<int64_t>()[0], -1234567890123LL);
  EXPECT_EQ(f.tensor("m.empty").shape(), (Shape{0, 4}));
  EXPECT_EQ(f.tensor("m.empty").numel(), 0);
}

TEST(SafetensorsRoundTrip, NoTensors) {
  TempDir tmp;
  save_safetensors(tmp / "none.safetensors", {}, {{"k", "v"}});
  const auto f = SafetensorsFile::open(tmp / "none.safetensors");
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_EQ(f.metadata().at("k"), "v");
  save_safetensors(tmp / "bare.safetensors", {});
  EXPECT_TRUE(SafetensorsFile::open(tmp / "bare.safetensors").tensors().empty());
}

TEST(SafetensorsRoundTrip, ViewOutlivesFile) {
  TempDir tmp;
  Tensor a = Tensor::zeros(DType::F32, {4});
  for (int i = 0; i < 4; ++i) a.data_mut<float>()[i] = static_cast<float>(i * i);
  save_safetensors(tmp / "v.safetensors", {{"a", a}});
  Tensor view;
  {
    const auto f = SafetensorsFile::open(tmp / "v.safetensors");
    view = f.tensor("a");
  }
  fs::remove(tmp / "v.safetensors");  // the mapping survives unlinking too
  EXPECT_EQ(view.data<float>()[3], 9.0f);
}

// ------------------------------------------------------------ writer layout

TEST(SafetensorsWriter, HeaderIsPaddedAndOrdered) {
  TempDir tmp;
  const auto path = tmp / "pad.safetensors";
  // Names of several lengths so at least one header needs padding.
  for (const std::string name : {"a", "ab", "abc", "abcd", "abcde", "abcdef", "abcdefg", "abcdefgh"}) {
    SafetensorsWriter w(path, {{"format", "pt"}});
    w.declare(name, DType::U8, {3});
    w.declare("b", DType::F16, {1});
    const uint8_t x[3] = {1, 2, 3}, y[2] = {4, 5};
    w.write(name, x, 3);
    w.write("b", y, 2);
    w.finish();

    const std::string bytes = slurp(path);
    ASSERT_GE(bytes.size(), 8u);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
    SCOPED_TRACE(name);
    EXPECT_EQ(n % 8, 0u) << "data buffer must start 8-byte aligned";
    ASSERT_EQ(bytes.size(), 8 + n + 5);
    const std::string header = bytes.substr(8, n);
    const auto close = header.find_last_of('}');
    EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos) << "padding must be spaces";
    EXPECT_LT(n - (close + 1), 8u);
    // __metadata__ first, then tensors in declaration order.
    EXPECT_EQ(header.rfind("{\"__metadata__\":", 0), 0u) << header;
    EXPECT_LT(header.find('"' + name + '"'), header.find("\"b\""));
    EXPECT_EQ(bytes.substr(8 + n), std::string("\x01\x02\x03\x04\x05", 5));
  }
}

// Tensors written in any order land where the declaration order puts them:
// the file is byte-identical to the in-order one.
TEST(SafetensorsWriter, AnyWriteOrderGivesTheDeclaredLayout) {
  TempDir tmp;
  const uint8_t a[3] = {1, 2, 3}, b[2] = {4, 5}, c[4] = {6, 7, 8, 9};
  auto write = [&](const fs::path& path, const std::vector<int>& order) {
    SafetensorsWriter w(path, {{"k", "v"}});
    w.declare("a", DType::U8, {3});
    w.declare("b", DType::F16, {1});
    w.declare("c", DType::U8, {2, 2});
    for (int i : order) {
      if (i == 0) w.write("a", a, 3);
      if (i == 1) w.write("b", b, 2);
      if (i == 2) w.write("c", c, 4);
    }
    w.finish();
    return slurp(path);
  };
  const std::string in_order = write(tmp / "in.safetensors", {0, 1, 2});
  EXPECT_EQ(in_order.substr(in_order.size() - 9), std::string("\x01\x02\x03\x04\x05\x06\x07\x08\x09", 9));
  EXPECT_EQ(write(tmp / "rev.safetensors", {2, 1, 0}), in_order);
  EXPECT_EQ(write(tmp / "mid.safetensors", {1, 2, 0}), in_order);
}

TEST(SafetensorsWriter, NoMetadataKeyWhenEmpty) {
  TempDir tmp;
  save_safetensors(tmp / "x.safetensors", {{"t", Tensor::zeros(DType::I8, {2})}});
  EXPECT_EQ(slurp(tmp / "x.safetensors").find("__metadata__"), std::string::npos);
}

// ------------------------------------------------------------ independent files

TEST(SafetensorsReader, HandMadeFileUnpaddedAndUnaligned) {
  TempDir tmp;
  // "b" comes first in the buffer but second in the header; the 19-byte I8
  // tensor leaves "c" (F32) unaligned, which the reader must still decode.
  const std::string header =
      R"({"a":{"dtype":"I8","shape":[3],"data_offsets":[8,11]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("c":{"dtype":"F32","shape":[1],"data_offsets":[11,15]}})";
  std::string data;
  const float bvals[2] = {1.5f, -2.25f}, cval = 3.0f;
  data.append(reinterpret_cast<const char*>(bvals), 8);
  data += std::string("\x05\xfb\x7f", 3);
  data.append(reinterpret_cast<const char*>(&cval), 4);
  spit(tmp / "hand.safetensors", hand_made(header, data));

  const auto f = SafetensorsFile::open(tmp / "hand.safetensors");
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "b");
  EXPECT_EQ(f.tensors()[1].name, "a");
  EXPECT_EQ(f.tensors()[2].name, "c");
  EXPECT_EQ(f.info("a").begin, 8u);
  EXPECT_EQ(f.info("a").end, 11u);
  EXPECT_EQ(f.tensor("b").data<float>()[1], -2.25f);
  const Tensor a = f.tensor("a");
  EXPECT_EQ(a.data<int8_t>()[0], 5);
  EXPECT_EQ(a.data<int8_t>()[1], -5);
  EXPECT_EQ(a.data<int8_t>()[2], 127);
  const Tensor c = f.tensor("c");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(c.raw()) % alignof(float), 0u);
  EXPECT_EQ(c.data<float>()[0], 3.0f);
}

TEST(SafetensorsReader, HandMadeFileWithSpacePaddingAndMetadata) {
  TempDir tmp;
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[2,1],"data_offsets":[0,4]}})" +
      std::string(13, ' ');
  spit(tmp / "p.safetensors", hand_made(header, std::string("\x80\x3f\x00\xc0", 4)));
  const auto f = SafetensorsFile::open(tmp / "p.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const Tensor w = f.tensor("w");
  EXPECT_EQ(w.dtype(), DType::BF16);
  EXPECT_EQ(w.shape(), (Shape{2, 1}));
  EXPECT_EQ(w.data<uint16_t>()[0], 0x3f80);  // 1.0 in bf16, little-endian
  EXPECT_EQ(w.data<uint16_t>()[1], 0xc000);  // -2.0
}

TEST(SafetensorsReader, EmptyTensorsMayShareAnOffset) {
  TempDir tmp;
  const std::string header =
      R"({"e2":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
      R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
      R"("e1":{"dtype":"F64","shape":[3,0],"data_offsets":[4,4]},)"
      R"("z":{"dtype":"U8","shape":[],"data_offsets":[4,5]},)"
      R"("e0":{"dtype":"I16","shape":[0],"data_offsets":[0,0]}})";
  spit(tmp / "e.safetensors", hand_made(header, std::string(5, '\x01')));
  const auto f = SafetensorsFile::open(tmp / "e.safetensors");
  std::vector<std::string> order;
  for (const auto& t : f.tensors()) order.push_back(t.name);
  // By offset; empties before a tensor at the same offset; ties in header order.
  EXPECT_EQ(order, (std::vector<std::string>{"e0", "a", "e2", "e1", "z"}));
  EXPECT_EQ(f.tensor("e1").numel(), 0);
  EXPECT_EQ(f.tensor("z").dim(), 0);
  EXPECT_EQ(f.tensor("z").data<uint8_t>()[0], 1);
}

TEST(SafetensorsReader, EmptyHeaderObjectIsAValidFile) {
  TempDir tmp;
  spit(tmp / "e.safetensors", hand_made("{}      ", ""));
  EXPECT_TRUE(SafetensorsFile::open(tmp / "e.safetensors").tensors().empty());
}

TEST(SafetensorsReader, MissingTensorAndMissingFileNameThePath) {
  TempDir tmp;
  save_safetensors(tmp / "x.safetensors", {{"t", Tensor::zeros(DType::I8, {2})}});
  const auto f = SafetensorsFile::open(tmp / "x.safetensors");
  EXPECT_FALSE(f.contains("nope"));
  std::string msg = error_of([&] { f.info("nope"); });
  EXPECT_NE(msg.find("x.safetensors: no tensor named 'nope'"), std::string::npos) << msg;
  msg = error_of([&] { SafetensorsFile::open(tmp / "absent.safetensors"); });
  EXPECT_NE(msg.find("absent.safetensors: cannot open for reading: No such file or directory"), std::string::npos)
      << msg;
  msg = error_of([&] { SafetensorsFile::open(tmp.path()); });
  EXPECT_NE(msg.find("not a regular file"), std::string::npos) << msg;
}

TEST(SafetensorsReader, FromBufferNamesTheDisplayName) {
  const std::string bytes = hand_made(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", "xy");
  const auto f = SafetensorsFile::from_buffer(nullptr, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                              "in-memory");
  EXPECT_EQ(f.path(), "in-memory");
  EXPECT_EQ(f.tensor("a").data<char>()[1], 'y');
  const std::string msg = error_of([&] {
    SafetensorsFile::from_buffer(nullptr, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size() - 1, "buf");
  });
  EXPECT_EQ(msg.rfind("buf: ", 0), 0u) << msg;
}

// ------------------------------------------------------------ broken files

struct BadCase {
  const char* file;
  const char* expected;  // a substring of the message
};

// Mirrors tests/data/safetensors_bad/README.md (written by make_corpus.py).
const BadCase kBadCorpus[] = {
    {"empty.safetensors", "truncated: the file is 0 bytes"},
    {"short.safetensors", "truncated: the file is 3 bytes, expected at least 8"},
    {"header_len_past_eof.safetensors", "header length 4096 runs past the end of the file"},
    {"header_len_absurd.safetensors", "header length 1099511627776 is absurd"},
    {"header_empty.safetensors", "header is empty"},
    {"header_not_object.safetensors", "header is not a JSON object: expected it to begin with '{', found '['"},
    {"header_leading_space.safetensors", "expected it to begin with '{', found ' '"},
    {"json_truncated.safetensors", "header JSON is malformed: it ends too early (37 bytes)"},
    {"json_trailing_garbage.safetensors", "header JSON is malformed at byte"},
    {"json_bad_utf8.safetensors", "header JSON is malformed at byte 3 of 7: parse error at line 1, column 3"},
    {"entry_not_object.safetensors",
     "tensor 'a': expected an object with dtype, shape and data_offsets, found an array"},
    {"missing_dtype.safetensors", "tensor 'a': missing \"dtype\""},
    {"missing_shape.safetensors", "tensor 'a': missing \"shape\""},
    {"missing_offsets.safetensors", "tensor 'a': missing \"data_offsets\""},
    {"dtype_not_string.safetensors", "tensor 'a': \"dtype\" must be a string, found 7"},
    {"unknown_dtype.safetensors", "tensor 'a': unknown dtype 'F4'; expected one of F64, F32, F16, BF16"},
    {"shape_not_array.safetensors",
     "tensor 'a': \"shape\" must be an array of non-negative integers, found '2'"},
    {"shape_negative.safetensors", "tensor 'a': shape[0] must be a non-negative integer, found -2"},
    {"shape_fraction.safetensors", "tensor 'a': shape[1] must be a non-negative integer, found 2.5"},
    {"shape_overflow.safetensors", "tensor 'a': shape overflow"},
    {"shape_dim_overflow.safetensors", "tensor 'a': shape overflow: shape[1] is 18446744073709551615"},
    {"offsets_not_pair.safetensors",
     "tensor 'a': \"data_offsets\" must be [begin, end], found an array of 3 elements"},
    {"offsets_not_integers.safetensors",
     "tensor 'a': \"data_offsets\" must be two non-negative integers, found ['0', 8]"},
    {"offsets_negative.safetensors", "tensor 'a': \"data_offsets\" must be two non-negative integers, found [-8, 0]"},
    {"offsets_reversed.safetensors", "tensor 'a': data_offsets [8, 0]: expected begin <= end"},
    {"offsets_past_buffer.safetensors",
     "tensor 'a': data_offsets [0, 16] run beyond the data buffer: expected end <= 8, found 16"},
    {"byte_length_mismatch.safetensors", "tensor 'a': data_offsets [0, 8] span 8 bytes, expected 12"},
    {"overlap.safetensors", "tensors 'a' [0, 8) and 'b' [4, 12) overlap"},
    {"empty_inside_other.safetensors", "tensors 'a' [0, 8) and 'e' [4, 4) overlap"},
    {"hole_between.safetensors", "hole in the data buffer: bytes [4, 8) between tensors 'a' and 'b'"},
    {"hole_start.safetensors", "hole in the data buffer: bytes [0, 4) before tensor 'a'"},
    {"hole_end.safetensors", "hole in the data buffer: it has 8 bytes but the tensors cover only 4"},
    {"metadata_not_object.safetensors", "__metadata__ must be an object of string to string, found an array"},
    {"metadata_not_string.safetensors", "__metadata__ must map strings to strings, but key 'step' has 3"},
    {"duplicate_tensor.safetensors", "duplicate tensor name 'a'"},
    {"duplicate_field.safetensors", "tensor 'a': duplicate key 'dtype'"},
};

TEST(SafetensorsBadCorpus, EachFileFailsWithItsMessage) {
  const fs::path dir = test::test_data_dir() / "safetensors_bad";
  for (const BadCase& c : kBadCorpus) {
    SCOPED_TRACE(c.file);
    const fs::path path = dir / c.file;
    ASSERT_TRUE(fs::exists(path)) << path;
    const std::string msg = error_of([&] { SafetensorsFile::open(path); });
    // One line, starting with the file's path, naming the problem.
    EXPECT_EQ(msg.rfind(path.string() + ": ", 0), 0u) << msg;
    EXPECT_NE(msg.find(c.expected), std::string::npos) << "message: " << msg << "\nexpected: " << c.expected;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
}

TEST(SafetensorsBadCorpus, EveryCorpusFileIsInTheTable) {
  std::set<std::string> listed;
  for (const BadCase& c : kBadCorpus) listed.insert(c.file);
  const std::string readme = slurp(test::test_data_dir() / "safetensors_bad" / "README.md");
  for (const auto& entry : fs::directory_iterator(test::test_data_dir() / "safetensors_bad")) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".safetensors") continue;
    EXPECT_TRUE(listed.count(name)) << name << " is in the corpus but not in kBadCorpus";
    EXPECT_NE(readme.find("`" + name + "`"), std::string::npos) << name << " is not in README.md";
  }
}

TEST(SafetensorsBadCorpus, ControlCharactersInNamesStayOnOneLine) {
  const std::string bytes = hand_made("{\"a\\nb\\u0000\":{\"dtype\":\"X\",\"shape\":[],\"data_offsets\":[0,0]}}", "");
  const std::string msg = error_of([&] {
    SafetensorsFile::from_buffer(nullptr, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "f");
  });
  EXPECT_NE(msg.find("tensor 'a\\x0ab\\x00': unknown dtype 'X'"), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

// ------------------------------------------------------------ writer misuse

TEST(SafetensorsWriter, Errors) {
  TempDir tmp;
  const auto path = tmp / "w.safetensors";
  const std::vector<uint8_t> b16(16), b8(8);
  auto has = [](const std::string& msg, const std::string& what) {
    EXPECT_NE(msg.find(what), std::string::npos) << "message: " << msg << "\nexpected: " << what;
    EXPECT_NE(msg.find("w.safetensors"), std::string::npos) << msg;
  };
  {
    SafetensorsWriter w(path);
    w.declare("a", DType::F32, {4});
    w.declare("b", DType::F32, {2});
    has(error_of([&] { w.declare("a", DType::F16, {1}); }), "duplicate tensor name 'a'");
    has(error_of([&] { w.declare("__metadata__", DType::F16, {1}); }), "__metadata__ is reserved");
    has(error_of([&] { w.declare("neg", DType::F16, {2, -1}); }), "shape[1] is -1");
    has(error_of([&] { w.declare("big", DType::F64, {int64_t{1} << 62, 4}); }), "shape overflow");
    has(error_of([&] { w.write("c", b8.data(), 8); }), "cannot write tensor 'c': it was not declared");
    has(error_of([&] { w.write("a", b8.data(), 8); }), "tensor 'a': expected 16 bytes ([4] of F32), found 8");
    has(error_of([&] { w.write("a", Tensor::zeros(DType::F16, {4})); }), "declared dtype F32, found F16");
    has(error_of([&] { w.write("a", Tensor::zeros(DType::F32, {2, 2})); }), "declared shape [4], found [2, 2]");
    has(error_of([&] { w.finish(); }), "finish() with 2 of 2 declared tensors unwritten (first: 'a')");
    w.write("a", b16.data(), 16);
    has(error_of([&] { w.write("a", b16.data(), 16); }), "tensor 'a' is already written");
    has(error_of([&] { w.declare("late", DType::F32, {1}); }), "cannot declare tensor 'late' after the first write");
    has(error_of([&] { w.finish(); }), "finish() with 1 of 2 declared tensors unwritten (first: 'b')");
    EXPECT_FALSE(fs::exists(path)) << "nothing appears under the final name before finish()";
    EXPECT_TRUE(fs::exists(tmp / "w.safetensors.tmp"));
  }
  // The abandoned writer removed its temporary file and never created the target.
  EXPECT_FALSE(fs::exists(path));
  EXPECT_FALSE(fs::exists(tmp / "w.safetensors.tmp"));
  EXPECT_TRUE(fs::is_empty(tmp.path()));
}

TEST(SafetensorsWriter, CannotOpenOutputNamesPathAndReason) {
  TempDir tmp;
  const auto path = tmp / "no" / "such" / "dir.safetensors";
  const std::string msg = error_of([&] { SafetensorsWriter w(path); });
  EXPECT_NE(msg.find(path.string() + ".tmp"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No such file or directory"), std::string::npos) << msg;
}

TEST(SafetensorsWriter, AbandonedWriteLeavesExistingFileUntouched) {
  TempDir tmp;
  const auto path = tmp / "keep.safetensors";
  save_safetensors(path, {{"old", Tensor::zeros(DType::U8, {3})}});
  const std::string before = slurp(path);
  {
    SafetensorsWriter w(path);
    w.declare("new", DType::U8, {4});
    const uint8_t x[4] = {};
    w.write("new", x, 4);
    // no finish(): e.g. an exception unwound past the writer
  }
  EXPECT_EQ(slurp(path), before);
  EXPECT_FALSE(fs::exists(tmp / "keep.safetensors.tmp"));
  // A writer that throws mid-way and unwinds leaves nothing behind either.
  const std::string msg = error_of([&] {
    SafetensorsWriter w(tmp / "half.safetensors");
    w.declare("a", DType::U8, {1});
    w.write("a", Tensor::zeros(DType::I8, {1}));
  });
  EXPECT_NE(msg.find("declared dtype U8, found I8"), std::string::npos) << msg;
  EXPECT_FALSE(fs::exists(tmp / "half.safetensors"));
  EXPECT_FALSE(fs::exists(tmp / "half.safetensors.tmp"));
}

TEST(SafetensorsWriter, FinishTwiceAndWriteAfterFinish) {
  TempDir tmp;
  SafetensorsWriter w(tmp / "f.safetensors");
  w.declare("a", DType::U8, {1});
  const uint8_t x = 7;
  w.write("a", &x, 1);
  w.finish();
  EXPECT_NE(error_of([&] { w.finish(); }).find("already finished"), std::string::npos);
  EXPECT_NE(error_of([&] { w.write("a", &x, 1); }).find("already finished"), std::string::npos);
  EXPECT_EQ(SafetensorsFile::open(tmp / "f.safetensors").tensor("a").data<uint8_t>()[0], 7);
  EXPECT_FALSE(fs::exists(tmp / "f.safetensors.tmp"));
}

TEST(SafetensorsWriter, SlicedViewRoundTrips) {
  TempDir tmp;
  Tensor base = Tensor::zeros(DType::I32, {3, 2});
  for (int i = 0; i < 6; ++i) base.data_mut<int32_t>()[i] = i;
  const Tensor rows = base.slice_rows(1, 3);  // contiguous rows 1..2
  save_safetensors(tmp / "s.safetensors", {{"rows", rows}});
  const Tensor r = SafetensorsFile::open(tmp / "s.safetensors").tensor("rows");
  EXPECT_EQ(r.shape(), (Shape{2, 2}));
  EXPECT_EQ(r.data<int32_t>()[0], 2);
  EXPECT_EQ(r.data<int32_t>()[3], 5);
}

}  // namespace
}  // namespace nibble::io
