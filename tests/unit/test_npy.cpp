// .npy reader and writer: round trips, files written by real NumPy (and ours
// read back by NumPy), and malformed files built by hand from the format's
// description, each with the error it must give.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "nibble/npy.h"
#include "test_util.h"

namespace nibble::io {
namespace {

namespace fs = std::filesystem;
using test::TempDir;

void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// A .npy image built by hand: magic, version, little-endian header length (2
// bytes for 1.0, 4 after), the header text as given (not padded), the data.
std::string hand_made(const std::string& header, const std::string& data, int major = 1) {
  std::string out = "\x93NUMPY";
  out += static_cast<char>(major);
  out += '\0';
  const uint32_t n = static_cast<uint32_t>(header.size());
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
  return out + header + data;
}

std::string f32_bytes(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

bool have_numpy() { return test::run_command("python3 -c 'import numpy'").exit_code == 0; }

TEST(Npy, RoundTripShapesAndDtypes) {
  TempDir tmp;
  const std::vector<Shape> shapes = {{3, 4}, {7}, {2, 3, 5}, {}, {0, 5}, {1, 1}};
  for (const Shape& shape : shapes) {
    for (DType dt : {DType::F32, DType::I32, DType::F16, DType::I64, DType::U8}) {
      SCOPED_TRACE(shape_str(shape) + " " + std::string(dtype_name(dt)));
      Tensor t = Tensor::empty(dt, shape);
      auto* b = static_cast<uint8_t*>(t.raw_mut());
      for (size_t i = 0; i < t.nbytes(); ++i) b[i] = static_cast<uint8_t>(i * 37 + 11);
      if (dt == DType::F16)  // keep the bit patterns finite halves (no NaN payloads to worry about)
        for (int64_t i = 0; i < t.numel(); ++i)
          t.data_mut<uint16_t>()[i] = f32_to_f16(0.5f * static_cast<float>(i) - 3);
      const fs::path p = tmp / "a.npy";
      write_npy(p, t);
      EXPECT_FALSE(fs::exists(tmp / "a.npy.tmp"));
      const NpyHeader h = read_npy_header(p);
      EXPECT_EQ(h.major, 1);
      EXPECT_EQ(h.data_offset % 64, 0u);  // np.save's alignment
      EXPECT_EQ(h.shape, shape);
      EXPECT_EQ(fs::file_size(p), h.data_offset + t.nbytes());
      const Tensor back = read_npy(p);
      EXPECT_EQ(back.dtype(), dt);
      EXPECT_EQ(back.shape(), shape);
      ASSERT_EQ(back.nbytes(), t.nbytes());
      if (t.nbytes()) {
        EXPECT_EQ(std::memcmp(back.raw(), t.raw(), t.nbytes()), 0);
      }
    }
  }
}

TEST(Npy, WritesStridedViewsInCOrder) {
  TempDir tmp;
  Tensor t = Tensor::empty(DType::F32, {2, 3});
  for (int i = 0; i < 6; ++i) t.data_mut<float>()[i] = static_cast<float>(i);
  // The transpose [3, 2]: element (r, c) = t[c, r].
  const Tensor tt = Tensor::view_strided(DType::F32, {3, 2}, {1, 3}, t.raw(), nullptr);
  write_npy(tmp / "t.npy", tt);
  const Tensor back = read_npy(tmp / "t.npy");
  ASSERT_EQ(back.shape(), (Shape{3, 2}));
  const float want[] = {0, 3, 1, 4, 2, 5};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(back.data<float>()[i], want[i]);
}

TEST(Npy, DescrNames) {
  EXPECT_EQ(npy_descr(DType::F32), "<f4");
  EXPECT_EQ(npy_descr(DType::I32), "<i4");
  EXPECT_EQ(npy_descr(DType::U8), "|u1");
  EXPECT_EQ(npy_descr(DType::BF16), std::nullopt);
  TempDir tmp;
  EXPECT_NE(test::error_of([&] { write_npy(tmp / "b.npy", Tensor::zeros(DType::BF16, {2})); }).find("BF16"),
            std::string::npos);
  EXPECT_FALSE(fs::exists(tmp / "b.npy"));
}

// Files made by NumPy itself, every version and supported dtype, read back here.
TEST(Npy, ReadsFilesWrittenByNumpy) {
  if (!have_numpy()) GTEST_SKIP() << "python3 with numpy not available";
  TempDir tmp;
  const std::string script = R"(
import numpy as np, sys
from numpy.lib import format as F
d = sys.argv[1]
a = (np.arange(12).reshape(3, 4) * 0.25 - 1.0)
np.save(d + '/f32.npy', a.astype(np.float32))
np.save(d + '/f64.npy', np.arange(12).reshape(3, 4) * 0.1)
np.save(d + '/f16.npy', a.astype(np.float16))
np.save(d + '/i32.npy', (np.arange(6) - 3).astype(np.int32))
np.save(d + '/i64.npy', (np.arange(6) * 1000000007 - 3).astype(np.int64).reshape(2, 3))
np.save(d + '/b1.npy', np.array([True, False, True]))
np.save(d + '/r3.npy', np.arange(24, dtype=np.float32).reshape(2, 3, 4))
np.save(d + '/r0.npy', np.float32(2.5))
np.save(d + '/empty.npy', np.zeros((0, 7), dtype=np.float32))
np.save(d + '/noncontig.npy', np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2])
for v in [(1, 0), (2, 0), (3, 0)]:
    with open(d + '/v%d.npy' % v[0], 'wb') as f:
        F.write_array(f, a.astype(np.float32), version=v)
np.save(d + '/fortran.npy', np.asfortranarray(a.astype(np.float32)))
np.save(d + '/be.npy', a.astype('>f4'))
np.save(d + '/c8.npy', a.astype(np.complex64))
np.save(d + '/u2.npy', np.arange(4, dtype=np.uint16))
np.save(d + '/rec.npy', np.zeros(3, dtype=[('x', '<f4'), ('y', '<i4')]))
np.save(d + '/str.npy', np.array(['ab', 'c']))
)";
  spit(tmp / "gen.py", script);
  const auto r = test::run_command("python3 " + (tmp / "gen.py").string() + " " + tmp.path().string());
  ASSERT_EQ(r.exit_code, 0) << r.err;

  auto check_f32 = [](const Tensor& t, const Shape& shape, auto value) {
    ASSERT_EQ(t.dtype(), DType::F32);
    ASSERT_EQ(t.shape(), shape);
    for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(t.data<float>()[i], value(i)) << i;
  };
  auto a_value = [](int64_t i) { return static_cast<float>(i) * 0.25f - 1.0f; };  // exact in every float type
  check_f32(read_npy(tmp / "f32.npy"), {3, 4}, a_value);
  // float64 is rounded to the nearest float32 on reading.
  check_f32(read_npy(tmp / "f64.npy"), {3, 4},
            [](int64_t i) { return static_cast<float>(static_cast<double>(i) * 0.1); });
  EXPECT_EQ(read_npy_header(tmp / "f64.npy").dtype, DType::F64);
  {
    const Tensor h = read_npy(tmp / "f16.npy");
    ASSERT_EQ(h.dtype(), DType::F16);
    check_f32(h.to_f32(), {3, 4}, a_value);
  }
  {
    const Tensor t = read_npy(tmp / "i32.npy");
    ASSERT_EQ(t.dtype(), DType::I32);
    ASSERT_EQ(t.shape(), (Shape{6}));
    for (int i = 0; i < 6; ++i) EXPECT_EQ(t.data<int32_t>()[i], i - 3);
  }
  {
    const Tensor t = read_npy(tmp / "i64.npy");
    ASSERT_EQ(t.dtype(), DType::I64);
    ASSERT_EQ(t.shape(), (Shape{2, 3}));
    for (int i = 0; i < 6; ++i) EXPECT_EQ(t.data<int64_t>()[i], int64_t{i} * 1000000007 - 3);
  }
  {
    const Tensor t = read_npy(tmp / "b1.npy");
    ASSERT_EQ(t.dtype(), DType::Bool);
    EXPECT_EQ(t.data<uint8_t>()[0], 1);
    EXPECT_EQ(t.data<uint8_t>()[1], 0);
  }
  check_f32(read_npy(tmp / "r3.npy"), {2, 3, 4}, [](int64_t i) { return static_cast<float>(i); });
  check_f32(read_npy(tmp / "r0.npy"), {}, [](int64_t) { return 2.5f; });
  check_f32(read_npy(tmp / "empty.npy"), {0, 7}, [](int64_t) { return 0.0f; });
  // NumPy writes a non-contiguous slice in C order.
  check_f32(read_npy(tmp / "noncontig.npy"), {3, 2},
            [](int64_t i) { return static_cast<float>(i / 2 * 4 + i % 2 * 2); });
  for (int v : {1, 2, 3}) {
    SCOPED_TRACE(v);
    const fs::path p = tmp / fmt::format("v{}.npy", v);
    EXPECT_EQ(read_npy_header(p).major, v);
    check_f32(read_npy(p), {3, 4}, a_value);
  }

  // What NumPy can write but nibble refuses, each with its reason and the path.
  const std::vector<std::pair<std::string, std::vector<std::string>>> refused = {
      {"fortran.npy", {"fortran_order=True", "C-order"}},
      {"be.npy", {"big-endian", "'>f4'"}},
      {"c8.npy", {"unsupported .npy dtype '<c8'", "complex"}},
      {"u2.npy", {"unsupported .npy dtype '<u2'"}},
      {"rec.npy", {"structured"}},
      {"str.npy", {"unsupported .npy dtype '<U2'", "string"}},
  };
  for (const auto& [name, needles] : refused) {
    const std::string e = test::error_of([&] { read_npy(tmp / name); });
    EXPECT_NE(e.find((tmp / name).string()), std::string::npos) << e;
    for (const auto& n : needles) EXPECT_NE(e.find(n), std::string::npos) << "missing '" << n << "' in: " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
}

// Files written here, read by NumPy.
TEST(Npy, NumpyReadsOurFiles) {
  if (!have_numpy()) GTEST_SKIP() << "python3 with numpy not available";
  TempDir tmp;
  Tensor f = Tensor::empty(DType::F32, {3, 4});
  for (int i = 0; i < 12; ++i) f.data_mut<float>()[i] = 0.5f * static_cast<float>(i) - 2.0f;
  write_npy(tmp / "f.npy", f);
  Tensor n = Tensor::empty(DType::I32, {5});
  for (int i = 0; i < 5; ++i) n.data_mut<int32_t>()[i] = i * i - 7;
  write_npy(tmp / "n.npy", n);
  write_npy(tmp / "s.npy", Tensor::zeros(DType::F32, {}));
  const std::string check =
      "import numpy as np, sys; d = sys.argv[1]\n"
      "f = np.load(d + '/f.npy'); assert f.dtype == np.float32 and f.shape == (3, 4), (f.dtype, f.shape)\n"
      "assert (f == np.arange(12, dtype=np.float32).reshape(3, 4) * 0.5 - 2).all()\n"
      "n = np.load(d + '/n.npy'); assert n.dtype == np.int32 and n.shape == (5,)\n"
      "assert (n == np.arange(5) ** 2 - 7).all()\n"
      "s = np.load(d + '/s.npy'); assert s.shape == () and s == 0\n";
  spit(tmp / "check.py", check);
  const auto r = test::run_command("python3 " + (tmp / "check.py").string() + " " + tmp.path().string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST(Npy, MalformedFiles) {
  TempDir tmp;
  const std::string good_header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }\n";
  const std::string two = f32_bytes({1.0f, 2.0f});
  // The hand-made reference itself reads (no padding needed).
  spit(tmp / "ok.npy", hand_made(good_header, two));
  EXPECT_EQ(read_npy(tmp / "ok.npy").data<float>()[1], 2.0f);
  // Python 2 style: 'L' suffixes, double quotes, no trailing comma, version 2.0.
  spit(tmp / "ok2.npy", hand_made("{\"descr\": \"<f4\", \"shape\": (2L,), \"fortran_order\": False}", two, 2));
  EXPECT_EQ(read_npy(tmp / "ok2.npy").shape(), (Shape{2}));

  struct Case {
    std::string name, bytes;
    std::vector<std::string> needles;
  };
  const std::vector<Case> cases = {
      {"empty", "", {"not a .npy file", "bad magic"}},
      {"magic", "PK\x03\x04 this is a zip", {"not a .npy file", "bad magic"}},
      {"text", "hello world\n", {"bad magic"}},
      {"no_version", "\x93NUMPY", {"truncated .npy header"}},
      {"no_length", std::string("\x93NUMPY\x01\x00\x10", 9), {"truncated .npy header", "preamble"}},
      {"short_header", hand_made(good_header, two).substr(0, 30), {"truncated .npy header", "declares"}},
      {"version4", hand_made(good_header, two, 4), {"unsupported .npy format version 4.0"}},
      {"not_dict", hand_made("['descr', '<f4']\n", two), {"malformed .npy header", "'{'"}},
      {"unterminated", hand_made("{'descr': '<f4\n", two), {"malformed .npy header", "unterminated string"}},
      {"no_shape", hand_made("{'descr': '<f4', 'fortran_order': False}\n", two), {"no 'shape' key"}},
      {"extra_key", hand_made("{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", two),
       {"malformed .npy header"}},
      {"dup_key", hand_made("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", two),
       {"appears twice"}},
      {"shape_not_tuple", hand_made("{'descr': '<f4', 'fortran_order': False, 'shape': '2'}", two),
       {"'shape' is not a tuple"}},
      {"negative", hand_made("{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}", two), {"negative dimension"}},
      {"huge", hand_made("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}", two),
       {"too large"}},
      {"overflow", hand_made("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296)}", two),
       {"too large"}},
      // Found by fuzz_npy: an empty array whose other dimensions overflow
      // int64 read as 0 bytes, and its tensor's strides overflowed.
      {"empty_overflow",
       hand_made("{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4294967296, 4294967296)}", ""),
       {"too large"}},
      {"trailing", hand_made(good_header + "junk", two), {"unexpected text after the header"}},
      {"c8", hand_made("{'descr': '<c8', 'fortran_order': False, 'shape': (1,)}", two),
       {"unsupported .npy dtype '<c8'", "complex"}},
      {"be", hand_made("{'descr': '>f4', 'fortran_order': False, 'shape': (2,)}", two), {"big-endian", "'>f4'"}},
      // Found by fuzz_npy: the size digits of a long descr overflowed an int
      // (undefined behaviour, which UBSan reports).
      {"long_descr", hand_made("{'descr': '<f4000000000', 'fortran_order': False, 'shape': (2,)}", two),
       {"unsupported .npy dtype '<f4000000000'"}},
      {"object", hand_made("{'descr': '|O', 'fortran_order': False, 'shape': (1,)}", two),
       {"unsupported .npy dtype '|O'", "Python object"}},
      {"pipe_f4", hand_made("{'descr': '|f4', 'fortran_order': False, 'shape': (2,)}", two), {"no byte order"}},
      {"fortran", hand_made("{'descr': '<f4', 'fortran_order': True, 'shape': (1, 2)}", two), {"fortran_order=True"}},
      {"fortran_not_bool", hand_made("{'descr': '<f4', 'fortran_order': 0, 'shape': (2,)}", two),
       {"malformed .npy header"}},
      {"short_data", hand_made("{'descr': '<f4', 'fortran_order': False, 'shape': (3,)}", two),
       {"data size mismatch", "[3]", "12 bytes", "holds 8 bytes", "truncated"}},
      {"long_data", hand_made("{'descr': '<f4', 'fortran_order': False, 'shape': (1,)}", two),
       {"data size mismatch", "4 bytes", "holds 8 bytes"}},
      {"f64_mismatch", hand_made("{'descr': '<f8', 'fortran_order': False, 'shape': (2,)}", two),
       {"data size mismatch", "16 bytes", "holds 8 bytes"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const fs::path p = tmp / (c.name + ".npy");
    spit(p, c.bytes);
    const std::string e = test::error_of([&] { read_npy(p); });
    EXPECT_NE(e.find(p.string()), std::string::npos) << e;
    for (const auto& n : c.needles) EXPECT_NE(e.find(n), std::string::npos) << "missing '" << n << "' in: " << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << "not one line: " << e;
  }
  // A missing file and a directory.
  EXPECT_NE(test::error_of([&] { read_npy(tmp / "nope.npy"); }).find((tmp / "nope.npy").string()), std::string::npos);
  EXPECT_NE(test::error_of([&] { read_npy(tmp.path()); }), "(no error)");
}

}  // namespace
}  // namespace nibble::io
