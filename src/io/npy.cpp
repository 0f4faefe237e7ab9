// NumPy .npy reader and writer (format described in include/nibble/npy.h).
//
// The header is a Python dict literal; only the subset np.save writes is
// parsed here (strings, True/False, tuples of non-negative integers), with
// each thing that can be wrong reported as one Error line naming the file.
#include "nibble/npy.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <vector>

#include "io/mmap.h"
#include "nibble/error.h"

namespace nibble::io {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// np.save pads the header so the data starts on a multiple of 64 bytes
// (NumPy's ARRAY_ALIGN), which keeps every dtype aligned in a mapping.
constexpr size_t kAlign = 64;

static_assert(std::endian::native == std::endian::little, "the .npy reader assumes a little-endian host");

// The element types nibble reads and writes, by NumPy kind letter and itemsize.
struct DescrRow {
  char kind;
  int size;
  DType dtype;
};
constexpr DescrRow kDescrs[] = {
    {'f', 8, DType::F64}, {'f', 4, DType::F32}, {'f', 2, DType::F16}, {'i', 8, DType::I64}, {'i', 4, DType::I32},
    {'i', 2, DType::I16}, {'i', 1, DType::I8},  {'u', 1, DType::U8},  {'b', 1, DType::Bool},
};

// A string from the file made safe for a one-line message.
std::string shown(std::string_view s) {
  constexpr size_t kMaxShown = 80;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c >= 0x7f || c == '\\') out += fmt::format("\\x{:02x}", c);
    else out += static_cast<char>(c);
  }
  if (s.size() > kMaxShown) out += "...";
  return out;
}

std::string kind_word(char kind) {
  switch (kind) {
    case 'c': return "complex";
    case 'U': case 'S': case 'a': return "string";
    case 'O': return "Python object";
    case 'V': return "void/raw";
    case 'M': case 'm': return "datetime";
    case 'u': return "unsigned integer";
    case 'f': return "float";
    case 'i': return "integer";
    default: return "unknown";
  }
}

std::string supported_list() {
  std::string s;
  for (const auto& d : kDescrs)
    s += fmt::format("{}{}{}{}", s.empty() ? "" : ", ", d.size == 1 ? '|' : '<', d.kind, d.size);
  return s;
}

// The header dict's values: a string, a bool, or a tuple of integers.
struct Value {
  enum Kind { Str, Bool, Tuple } kind = Str;
  std::string str;
  bool b = false;
  Shape tuple;
};

// Recursive descent over the Python literal subset np.save writes.
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : s_(text), path_(path) {}

  std::map<std::string, Value> parse_dict() {
    std::map<std::string, Value> out;
    skip_ws();
    expect('{', "the header does not start with '{'");
    for (;;) {
      skip_ws();
      if (peek() == '}') break;
      if (peek() != '\'' && peek() != '"') fail("a dict key is not a string");
      std::string key = parse_string();
      skip_ws();
      expect(':', fmt::format("no ':' after key '{}'", shown(key)));
      skip_ws();
      Value v = parse_value(key);
      if (!out.emplace(key, std::move(v)).second) fail(fmt::format("key '{}' appears twice", shown(key)));
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      if (peek() != '}') fail("expected ',' or '}' in the dict");
    }
    ++i_;  // '}'
    // np.save pads with spaces and ends with '\n'; nothing else may follow.
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\r' || s_[i_] == '\t' || s_[i_] == '\0'))
      ++i_;
    if (i_ != s_.size()) fail("unexpected text after the header dict");
    return out;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    NIBBLE_FAIL("{}: malformed .npy header: {} (at byte {} of '{}')", path_, what, i_, shown(s_));
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c, const std::string& what) {
    if (peek() != c) fail(what);
    ++i_;
  }

  std::string parse_string() {
    const char q = s_[i_++];
    std::string out;
    while (i_ < s_.size() && s_[i_] != q) {
      if (s_[i_] == '\\' && i_ + 1 < s_.size()) ++i_;
      out += s_[i_++];
    }
    if (i_ >= s_.size()) fail("unterminated string");
    ++i_;
    return out;
  }

  int64_t parse_int() {
    if (peek() == '-') fail("negative dimension in 'shape'");
    if (peek() < '0' || peek() > '9') fail("expected an integer in 'shape'");
    int64_t v = 0;
    while (peek() >= '0' && peek() <= '9') {
      if (__builtin_mul_overflow(v, 10, &v) || __builtin_add_overflow(v, peek() - '0', &v))
        fail("dimension too large in 'shape'");
      ++i_;
    }
    if (peek() == 'L' || peek() == 'l') ++i_;  // Python 2 long literals in old files
    return v;
  }

  Value parse_value(const std::string& key) {
    Value v;
    const char c = peek();
    if (c == '\'' || c == '"') {
      v.kind = Value::Str;
      v.str = parse_string();
    } else if (s_.substr(i_, 4) == "True") {
      v.kind = Value::Bool, v.b = true, i_ += 4;
    } else if (s_.substr(i_, 5) == "False") {
      v.kind = Value::Bool, v.b = false, i_ += 5;
    } else if (c == '(') {
      ++i_;
      v.kind = Value::Tuple;
      skip_ws();
      while (peek() != ')') {
        v.tuple.push_back(parse_int());
        skip_ws();
        if (peek() == ',') {
          ++i_;
          skip_ws();
        } else if (peek() != ')') {
          fail("expected ',' or ')' in a tuple");
        }
      }
      ++i_;
    } else if (c == '[' && key == "descr") {
      NIBBLE_FAIL("{}: structured (record) arrays are not supported: descr is a field list; save a plain numeric "
                  "array",
                  path_);
    } else {
      fail(fmt::format("unsupported value for key '{}'", shown(key)));
    }
    return v;
  }

  std::string_view s_;
  const std::string& path_;
  size_t i_ = 0;
};

uint32_t read_le(const uint8_t* p, int bytes) {
  uint32_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

// The dtype of a descr such as '<f4', or an Error saying why nibble cannot read it.
DType dtype_of_descr(const std::string& descr, const std::string& path) {
  std::string_view d = descr;
  char order = '=';  // no byte-order character: native, which static_assert above makes little-endian
  if (!d.empty() && (d[0] == '<' || d[0] == '>' || d[0] == '|' || d[0] == '=')) order = d[0], d.remove_prefix(1);
  const char kind = d.empty() ? '?' : d[0];
  int size = 0;  // from at most 3 digits: a longer descr is not one nibble reads
  bool numeric_size = d.size() >= 2 && d.size() <= 4;
  if (numeric_size)
    for (char c : d.substr(1)) {
      if (c >= '0' && c <= '9') size = size * 10 + (c - '0');
      else numeric_size = false;
    }
  if (numeric_size) {
    for (const auto& row : kDescrs) {
      if (row.kind != kind || row.size != size) continue;
      if (size > 1 && order == '>')
        NIBBLE_FAIL("{}: big-endian dtype '{}' is not supported (save it little-endian, e.g. a.astype('<{}{}'))", path,
                    shown(descr), kind, size);
      if (size > 1 && order == '|')
        NIBBLE_FAIL("{}: dtype '{}' has no byte order ('|') though its items are {} bytes", path, shown(descr), size);
      return row.dtype;
    }
  }
  NIBBLE_FAIL("{}: unsupported .npy dtype '{}' ({} array; nibble reads {})", path, shown(descr), kind_word(kind),
              supported_list());
}

// Parses the magic, version and header dict of a .npy image of `size` bytes.
NpyHeader parse_header(const uint8_t* data, size_t size, const std::string& path) {
  NpyHeader h;
  if (size < kMagicLen || std::memcmp(data, kMagic, kMagicLen) != 0)
    NIBBLE_FAIL("{}: not a .npy file (bad magic: expected \\x93NUMPY, found '{}')", path,
                shown(std::string_view(reinterpret_cast<const char*>(data), std::min<size_t>(size, kMagicLen))));
  if (size < kMagicLen + 2) NIBBLE_FAIL("{}: truncated .npy header: {} bytes, no version", path, size);
  h.major = data[6];
  h.minor = data[7];
  if (h.major < 1 || h.major > 3 || h.minor != 0)
    NIBBLE_FAIL("{}: unsupported .npy format version {}.{} (nibble reads 1.0, 2.0 and 3.0)", path, h.major, h.minor);
  const int len_bytes = h.major == 1 ? 2 : 4;
  const size_t prefix = kMagicLen + 2 + len_bytes;
  if (size < prefix)
    NIBBLE_FAIL("{}: truncated .npy header: {} bytes, the version {}.0 preamble needs {}", path, size, h.major, prefix);
  const uint64_t header_len = read_le(data + kMagicLen + 2, len_bytes);
  if (header_len > size - prefix)
    NIBBLE_FAIL("{}: truncated .npy header: it declares {} header bytes but only {} follow the preamble", path,
                header_len, size - prefix);
  h.data_offset = prefix + header_len;

  const std::string_view text(reinterpret_cast<const char*>(data + prefix), header_len);
  auto dict = HeaderParser(text, path).parse_dict();
  for (const auto& [k, v] : dict)
    if (k != "descr" && k != "fortran_order" && k != "shape")
      NIBBLE_FAIL("{}: malformed .npy header: unexpected key '{}' (expected descr, fortran_order, shape)", path,
                  shown(k));
  auto get = [&](const char* key, Value::Kind kind, const char* what) -> const Value& {
    auto it = dict.find(key);
    if (it == dict.end()) NIBBLE_FAIL("{}: malformed .npy header: no '{}' key", path, key);
    if (it->second.kind != kind) NIBBLE_FAIL("{}: malformed .npy header: '{}' is not {}", path, key, what);
    return it->second;
  };
  h.descr = get("descr", Value::Str, "a string").str;
  const bool fortran = get("fortran_order", Value::Bool, "True or False").b;
  h.shape = get("shape", Value::Tuple, "a tuple of integers").tuple;
  h.dtype = dtype_of_descr(h.descr, path);
  if (fortran)
    NIBBLE_FAIL("{}: fortran_order=True (column-major) arrays are not supported; save a C-order array "
                "(np.ascontiguousarray)",
                path);
  return h;
}

// numel x itemsize, or an Error when it overflows. An empty shape's other
// dimensions must fit too (a Tensor's strides multiply them).
uint64_t data_bytes(const NpyHeader& h, const std::string& path) {
  const std::optional<int64_t> numel = checked_numel(h.shape);
  uint64_t n = 0;
  if (!numel || __builtin_mul_overflow(static_cast<uint64_t>(*numel), dtype_size(h.dtype), &n) ||
      n > (uint64_t{1} << 62))
    NIBBLE_FAIL("{}: .npy shape {} is too large", path, shape_str(h.shape));
  return n;
}

}  // namespace

std::optional<std::string> npy_descr(DType dt) {
  for (const auto& row : kDescrs)
    if (row.dtype == dt) return fmt::format("{}{}{}", row.size == 1 ? '|' : '<', row.kind, row.size);
  return std::nullopt;
}

NpyHeader read_npy_header(const std::filesystem::path& path) {
  const MappedFile m = map_file_readonly(path);
  return parse_header(m.data, m.size, path.string());
}

Tensor parse_npy(const void* data, size_t size, const std::string& display_name) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  const NpyHeader h = parse_header(bytes, size, display_name);
  const uint64_t need = data_bytes(h, display_name);
  const uint64_t have = size - h.data_offset;
  if (have != need)
    NIBBLE_FAIL("{}: data size mismatch: shape {} x {} bytes ('{}') = {} bytes, but the file holds {} bytes of data{}",
                display_name, shape_str(h.shape), dtype_size(h.dtype), shown(h.descr), need, have,
                have < need ? " (truncated?)" : "");
  const uint8_t* src = bytes + h.data_offset;
  if (h.dtype == DType::F64) {
    // nibble computes in f32: doubles are rounded to nearest on reading.
    Tensor t = Tensor::empty(DType::F32, h.shape);
    convert_to_f32(src, DType::F64, t.data_mut<float>(), static_cast<size_t>(t.numel()));
    return t;
  }
  Tensor t = Tensor::empty(h.dtype, h.shape);
  if (need) std::memcpy(t.raw_mut(), src, need);
  return t;
}

Tensor read_npy(const std::filesystem::path& path) {
  const MappedFile m = map_file_readonly(path);
  return parse_npy(m.data, m.size, path.string());
}

void write_npy(const std::filesystem::path& path, const Tensor& t) {
  const auto descr = npy_descr(t.dtype());
  NIBBLE_CHECK(descr.has_value(), "{}: cannot write a {} tensor as .npy (NumPy has no such dtype)", path.string(),
               dtype_name(t.dtype()));
  std::string shape = "(";
  for (size_t i = 0; i < t.shape().size(); ++i) shape += fmt::format("{}{}", i ? ", " : "", t.shape()[i]);
  if (t.shape().size() == 1) shape += ",";
  shape += ")";
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", *descr, shape);
  // Version 1.0 stores the header length in 16 bits; longer headers (ranks in
  // the thousands) need 2.0. Pad with spaces so magic + version + length +
  // header ends on a multiple of 64, the last byte a '\n'.
  auto padded_total = [&](size_t prefix) { return (prefix + header.size() + 1 + kAlign - 1) / kAlign * kAlign; };
  const int major = padded_total(kMagicLen + 4) - (kMagicLen + 4) > 65535 ? 2 : 1;
  const size_t prefix = kMagicLen + 2 + (major == 1 ? 2 : 4);
  const size_t total = padded_total(prefix);
  header.append(total - prefix - header.size() - 1, ' ');
  header += '\n';

  std::string pre(kMagic, kMagicLen);
  pre += static_cast<char>(major);
  pre += '\0';
  const uint32_t len = static_cast<uint32_t>(header.size());
  for (int i = 0; i < (major == 1 ? 2 : 4); ++i) pre += static_cast<char>((len >> (8 * i)) & 0xff);

  const Tensor c = t.is_contiguous() ? t : t.contiguous();
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    NIBBLE_CHECK(f.good(), "{}: cannot open for writing ({})", tmp.string(), std::strerror(errno));
    f.write(pre.data(), static_cast<std::streamsize>(pre.size()));
    f.write(header.data(), static_cast<std::streamsize>(header.size()));
    if (c.nbytes()) f.write(static_cast<const char*>(c.raw()), static_cast<std::streamsize>(c.nbytes()));
    f.flush();
    if (!f.good()) {
      const int err = errno;
      f.close();
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      NIBBLE_FAIL("{}: write failed ({})", tmp.string(), std::strerror(err));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ec2;
    std::filesystem::remove(tmp, ec2);
    NIBBLE_FAIL("{}: cannot rename from {} ({})", path.string(), tmp.string(), ec.message());
  }
}

}  // namespace nibble::io
