// safetensors reader (memory-mapped, validated) and streaming writer.
//
// The reader enforces the format's rules as the reference implementation
// (huggingface/safetensors) states them: header length <= 100 MB and inside
// the file, the header a JSON object starting with '{' (trailing spaces
// allowed), no duplicate keys, every tensor's byte length equal to
// numel x dtype size, and the tensors covering the data buffer exactly:
// sorted by offset, the first at 0, each beginning where the previous ended,
// the last ending at the end of the file. Every violation is one
// nibble::Error line naming the file, the tensor and expected vs found.
#include "nibble/safetensors.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "io/mmap.h"
#include "nibble/error.h"

namespace nibble::io {

namespace {

using json = nlohmann::json;

// The reference implementation's MAX_HEADER_SIZE: anything larger is
// corruption or an attack, not a checkpoint.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
// The writer pads the header so the data buffer starts 8-byte aligned (the
// reference writer does the same), so every dtype's view is aligned in the map.
constexpr size_t kHeaderAlign = 8;
constexpr const char* kMetadataKey = "__metadata__";

// A string from the file made safe for a one-line message: quoted, control
// bytes escaped, long names cut.
std::string qstr(std::string_view s) {
  constexpr size_t kMaxShown = 120;
  std::string out = "'";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == kMaxShown) {
      out += fmt::format("...' ({} bytes)", s.size());
      return out;
    }
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\'' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "'";
}

// A JSON value in a message: scalars as written, containers by kind.
std::string describe(const json& j) {
  if (j.is_string()) return qstr(j.get_ref<const std::string&>());
  if (j.is_array()) return fmt::format("an array of {} element{}", j.size(), j.size() == 1 ? "" : "s");
  if (j.is_object()) return "an object";
  return j.dump();  // number, boolean, null: short
}

// nlohmann's messages quote the offending input, which may hold control or
// non-UTF-8 bytes: escape those so the message stays one printable line.
std::string one_line(const std::string& s) {
  std::string out;
  for (char ch : s) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c >= 0x7f)
      out += fmt::format("\\x{:02x}", c);
    else
      out += ch;
  }
  return out;
}

std::string known_dtypes() {
  std::string out;
  for (int i = 0; i <= static_cast<int>(DType::F8_E5M2); ++i) {
    if (i) out += ", ";
    out += dtype_name(static_cast<DType>(i));
  }
  return out;
}

// A non-negative JSON integer, or nullopt (negative, fractional, not a number).
std::optional<uint64_t> as_u64(const json& j) {
  if (j.is_number_unsigned()) return j.get<uint64_t>();
  if (j.is_number_integer() && j.get<int64_t>() >= 0) return static_cast<uint64_t>(j.get<int64_t>());
  return std::nullopt;
}

// Byte size of a tensor, or nullopt when it does not fit. The product of the
// non-zero dims must fit in int64 (not just the final numel): code that
// computes strides or partial products of a shape like [0, 2^40, 2^40] must
// not overflow either.
std::optional<uint64_t> checked_nbytes(const Shape& shape, DType dt) {
  uint64_t nonzero = 1;
  bool any_zero = false;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d == 0) {
      any_zero = true;
      continue;
    }
    const auto u = static_cast<uint64_t>(d);
    if (nonzero > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / u) return std::nullopt;
    nonzero *= u;
  }
  const uint64_t size = dtype_size(dt);
  if (nonzero > std::numeric_limits<uint64_t>::max() / size) return std::nullopt;
  return any_zero ? 0 : nonzero * size;
}

// First pass over the header: a SAX handler that builds nothing, rejects
// duplicate keys at any depth (nlohmann's DOM silently keeps the last one)
// and records the order of the top-level keys. nlohmann's parser-callback API
// could do this in the DOM pass, but it rescans the parent object after every
// child object, which is quadratic in the tensor count.
class KeyChecker {
 public:
  std::unordered_map<std::string, size_t> order;  // top-level key -> position in the file
  std::optional<std::string> duplicate;
  std::optional<std::string> error;  // parse error, already phrased
  size_t error_byte = 0;

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(json::number_integer_t) { return true; }
  bool number_unsigned(json::number_unsigned_t) { return true; }
  bool number_float(json::number_float_t, const std::string&) { return true; }
  bool string(std::string&) { return true; }
  bool binary(json::binary_t&) { return true; }
  bool start_array(std::size_t) { return true; }
  bool end_array() { return true; }
  bool start_object(std::size_t) {
    stack_.emplace_back();
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool key(std::string& key) {
    Level& top = stack_.back();
    if (!top.keys.insert(key).second) {
      if (stack_.size() == 1)
        duplicate = fmt::format("duplicate tensor name {}", qstr(key));
      else if (stack_.size() == 2)
        duplicate = fmt::format("tensor {}: duplicate key {}", qstr(stack_[0].last_key), qstr(key));
      else
        duplicate = fmt::format("duplicate key {} in a nested object", qstr(key));
      return false;  // stop parsing
    }
    if (stack_.size() == 1) order.emplace(key, order.size());
    top.last_key = key;
    return true;
  }
  bool parse_error(std::size_t byte, const std::string& /*last_token*/, const nlohmann::detail::exception& e) {
    std::string what = e.what();
    if (auto p = what.find("] "); what.rfind("[json.exception", 0) == 0 && p != std::string::npos)
      what = what.substr(p + 2);
    error = one_line(what);
    error_byte = byte;
    return false;
  }

 private:
  struct Level {
    std::unordered_set<std::string> keys;
    std::string last_key;
  };
  std::vector<Level> stack_;
};

struct HeaderParse {
  json header;
  std::unordered_map<std::string, size_t> order;  // top-level key -> position in the file
};

HeaderParse parse_header(const std::string& file, const char* text, size_t n) {
  KeyChecker checker;
  const bool ok = json::sax_parse(text, text + n, &checker);
  if (checker.error) {
    // The position counts from 1 and is n + 1 when the text ended too early.
    if (checker.error_byte > n)
      NIBBLE_FAIL("{}: header JSON is malformed: it ends too early ({} bytes): {}", file, n, *checker.error);
    NIBBLE_FAIL("{}: header JSON is malformed at byte {} of {}: {}", file, checker.error_byte, n, *checker.error);
  }
  NIBBLE_CHECK(!checker.duplicate, "{}: {} in the header (duplicate keys are not allowed)", file, *checker.duplicate);
  NIBBLE_CHECK(ok, "{}: header JSON could not be parsed", file);
  HeaderParse out;
  out.order = std::move(checker.order);
  try {
    out.header = json::parse(text, text + n);
  } catch (const json::exception& e) {  // the first pass accepted it; should not happen
    NIBBLE_FAIL("{}: header JSON is malformed: {}", file, one_line(e.what()));
  }
  return out;
}

TensorInfo parse_entry(const std::string& file, const std::string& name, const json& entry,
                       uint64_t buffer_size) {
  const std::string where = fmt::format("{}: tensor {}", file, qstr(name));
  NIBBLE_CHECK(entry.is_object(), "{}: expected an object with dtype, shape and data_offsets, found {}", where,
               describe(entry));
  auto field = [&](const char* key) -> const json& {
    auto it = entry.find(key);
    NIBBLE_CHECK(it != entry.end(), "{}: missing \"{}\" (expected dtype, shape and data_offsets)", where, key);
    return *it;
  };
  TensorInfo t;
  t.name = name;

  const json& jdtype = field("dtype");
  NIBBLE_CHECK(jdtype.is_string(), "{}: \"dtype\" must be a string, found {}", where, describe(jdtype));
  const auto dt = dtype_from_name(jdtype.get_ref<const std::string&>());
  NIBBLE_CHECK(dt.has_value(), "{}: unknown dtype {}; expected one of {}", where, describe(jdtype), known_dtypes());
  t.dtype = *dt;

  const json& jshape = field("shape");
  NIBBLE_CHECK(jshape.is_array(), "{}: \"shape\" must be an array of non-negative integers, found {}", where,
               describe(jshape));
  for (size_t i = 0; i < jshape.size(); ++i) {
    const auto d = as_u64(jshape[i]);
    NIBBLE_CHECK(d.has_value(), "{}: shape[{}] must be a non-negative integer, found {}", where, i,
                 describe(jshape[i]));
    NIBBLE_CHECK(*d <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                 "{}: shape overflow: shape[{}] is {}, expected at most 2^63-1", where, i, *d);
    t.shape.push_back(static_cast<int64_t>(*d));
  }
  const auto nbytes = checked_nbytes(t.shape, t.dtype);
  NIBBLE_CHECK(nbytes.has_value(), "{}: shape overflow: {} elements of {} ({} bytes each) do not fit in 64 bits",
               where, shape_str(t.shape), dtype_name(t.dtype), dtype_size(t.dtype));

  const json& joff = field("data_offsets");
  NIBBLE_CHECK(joff.is_array() && joff.size() == 2, "{}: \"data_offsets\" must be [begin, end], found {}", where,
               describe(joff));
  const auto begin = as_u64(joff[0]);
  const auto end = as_u64(joff[1]);
  NIBBLE_CHECK(begin && end, "{}: \"data_offsets\" must be two non-negative integers, found [{}, {}]", where,
               describe(joff[0]), describe(joff[1]));
  NIBBLE_CHECK(*begin <= *end, "{}: data_offsets [{}, {}]: expected begin <= end", where, *begin, *end);
  NIBBLE_CHECK(*end <= buffer_size,
               "{}: data_offsets [{}, {}] run beyond the data buffer: expected end <= {}, found {}", where, *begin,
               *end, buffer_size, *end);
  NIBBLE_CHECK(*end - *begin == *nbytes,
               "{}: data_offsets [{}, {}] span {} bytes, expected {} (shape {} of {}, {} bytes each)", where,
               *begin, *end, *end - *begin, *nbytes, shape_str(t.shape), dtype_name(t.dtype),
               dtype_size(t.dtype));
  t.begin = *begin;
  t.end = *end;
  return t;
}

}  // namespace

// ---------------------------------------------------------------- reader

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path) {
  MappedFile m = map_file_readonly(path);
  return from_buffer(std::move(m.owner), m.data, m.size, path);
}

SafetensorsFile SafetensorsFile::from_buffer(std::shared_ptr<const void> owner, const uint8_t* data, size_t size,
                                             std::filesystem::path display_name) {
  SafetensorsFile f;
  f.path_ = std::move(display_name);
  f.mapping_ = std::move(owner);
  f.file_size_ = size;
  const std::string file = f.path_.string();
  NIBBLE_CHECK(data != nullptr || size == 0, "{}: no data", file);

  NIBBLE_CHECK(size >= 8, "{}: truncated: the file is {} bytes, expected at least 8 (the header length)", file,
               size);
  uint64_t n = 0;  // little-endian u64, whatever the host byte order
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  NIBBLE_CHECK(n <= kMaxHeaderBytes,
               "{}: header length {} is absurd: expected at most {} bytes (is it a safetensors file at all?)", file, n,
               kMaxHeaderBytes);
  NIBBLE_CHECK(n <= size - 8,
               "{}: header length {} runs past the end of the file: expected at most {} (file is {} bytes)", file,
               n, size - 8, size);
  const char* text = reinterpret_cast<const char*>(data + 8);
  NIBBLE_CHECK(n > 0, "{}: header is empty: expected a JSON object", file);
  NIBBLE_CHECK(text[0] == '{', "{}: header is not a JSON object: expected it to begin with '{{', found {}", file,
               std::isprint(static_cast<unsigned char>(text[0]))
                   ? fmt::format("'{}'", text[0])
                   : fmt::format("byte 0x{:02x}", static_cast<unsigned char>(text[0])));

  HeaderParse parsed = parse_header(file, text, n);
  const json& header = parsed.header;
  NIBBLE_CHECK(header.is_object(), "{}: header is not a JSON object, found {}", file, describe(header));

  f.buffer_ = data + 8 + n;
  const uint64_t buffer_size = size - 8 - n;
  std::vector<std::pair<TensorInfo, size_t>> found;  // with the key's position in the header
  for (const auto& [key, value] : header.items()) {
    if (key == kMetadataKey) {
      NIBBLE_CHECK(value.is_object(), "{}: __metadata__ must be an object of string to string, found {}", file,
                   describe(value));
      for (const auto& [mk, mv] : value.items()) {
        NIBBLE_CHECK(mv.is_string(), "{}: __metadata__ must map strings to strings, but key {} has {}", file,
                     qstr(mk), describe(mv));
        f.metadata_.emplace(mk, mv.get<std::string>());
      }
      continue;
    }
    found.emplace_back(parse_entry(file, key, value, buffer_size), parsed.order.at(key));
  }

  // Data-offset order; empty tensors (begin == end) sort before a tensor
  // starting at the same offset, and ties keep the header's order.
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) {
    if (a.first.begin != b.first.begin) return a.first.begin < b.first.begin;
    if (a.first.end != b.first.end) return a.first.end < b.first.end;
    return a.second < b.second;
  });

  // Coverage: each tensor begins exactly where the previous one ended.
  uint64_t covered = 0;
  const TensorInfo* prev = nullptr;
  for (const auto& [t, pos] : found) {
    NIBBLE_CHECK(t.begin >= covered, "{}: tensors {} [{}, {}) and {} [{}, {}) overlap", file,
                 qstr(prev ? prev->name : ""), prev ? prev->begin : 0, covered, qstr(t.name), t.begin, t.end);
    if (t.begin > covered) {
      if (prev)
        NIBBLE_FAIL("{}: hole in the data buffer: bytes [{}, {}) between tensors {} and {} belong to no tensor; "
                    "expected {} to begin at {}, found {}",
                    file, covered, t.begin, qstr(prev->name), qstr(t.name), qstr(t.name), covered, t.begin);
      NIBBLE_FAIL("{}: hole in the data buffer: bytes [0, {}) before tensor {} belong to no tensor; "
                  "expected the first tensor to begin at 0, found {}",
                  file, t.begin, qstr(t.name), t.begin);
    }
    covered = t.end;
    prev = &t;
  }
  NIBBLE_CHECK(covered == buffer_size,
               "{}: hole in the data buffer: it has {} bytes but the tensors cover only {}; bytes [{}, {}) at the "
               "end belong to no tensor",
               file, buffer_size, covered, covered, buffer_size);

  f.tensors_.reserve(found.size());
  for (auto& [t, pos] : found) {
    f.index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }
  return f;
}

bool SafetensorsFile::contains(const std::string& name) const { return index_.count(name) != 0; }

const TensorInfo& SafetensorsFile::info(const std::string& name) const {
  auto it = index_.find(name);
  NIBBLE_CHECK(it != index_.end(), "{}: no tensor named {}", path_.string(), qstr(name));
  return tensors_[it->second];
}

Tensor SafetensorsFile::tensor(const std::string& name) const {
  const TensorInfo& t = info(name);
  const uint8_t* p = buffer_ + t.begin;
  const size_t nbytes = t.end - t.begin;
  // Files from writers that do not pad the header leave the buffer unaligned;
  // a typed view there would be undefined behaviour, so those get a copy.
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(t.dtype) != 0) {
    Tensor copy = Tensor::zeros(t.dtype, t.shape);
    if (nbytes) std::memcpy(copy.raw_mut(), p, nbytes);
    return copy;
  }
  return Tensor::view(t.dtype, t.shape, p, mapping_);
}

// ---------------------------------------------------------------- writer

struct SafetensorsWriter::Impl {
  struct Decl {
    std::string name;
    DType dtype;
    Shape shape;
    uint64_t begin, end;
  };
  std::filesystem::path path, tmp;
  std::map<std::string, std::string> metadata;
  std::vector<Decl> decls;
  std::unordered_map<std::string, size_t> index;
  int fd = -1;
  std::vector<bool> written;  // per declaration
  size_t num_written = 0;
  uint64_t data_start = 0;  // the header's size: where the data buffer begins
  bool header_written = false;
  bool finished = false;
  bool failed = false;  // an I/O error happened; the temp file is not trustworthy

  std::string where() const { return path.string(); }

  void check_usable() const {
    NIBBLE_CHECK(!finished, "{}: the writer is already finished", where());
    NIBBLE_CHECK(!failed, "{}: the writer failed earlier and cannot continue", where());
  }

  // n bytes at `offset` of the file (positioned writes: tensors may come in
  // any order).
  void write_all(const void* data, size_t n, uint64_t offset) {
    auto p = static_cast<const char*>(data);
    size_t done = 0;
    while (done < n) {
      const ssize_t w = ::pwrite(fd, p + done, std::min<size_t>(n - done, size_t{1} << 30),
                                 static_cast<off_t>(offset + done));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) {
        failed = true;
        NIBBLE_FAIL("{}: cannot write {}: {}", where(), tmp.string(), w < 0 ? std::strerror(errno) : "no progress");
      }
      done += static_cast<size_t>(w);
    }
  }

  size_t first_unwritten() const {
    size_t i = 0;
    while (i < written.size() && written[i]) ++i;
    return i;
  }

  void write_header() {
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    if (!metadata.empty()) {
      nlohmann::ordered_json m = nlohmann::ordered_json::object();
      for (const auto& [k, v] : metadata) m[k] = v;
      h[kMetadataKey] = std::move(m);
    }
    for (const Decl& d : decls)
      h[d.name] = {{"dtype", std::string(dtype_name(d.dtype))},
                   {"shape", d.shape},
                   {"data_offsets", {d.begin, d.end}}};
    std::string text;
    try {
      text = h.dump();
    } catch (const nlohmann::json::exception& e) {
      NIBBLE_FAIL("{}: cannot encode the header: {}", where(), one_line(e.what()));
    }
    text.append((kHeaderAlign - text.size() % kHeaderAlign) % kHeaderAlign, ' ');
    uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(static_cast<uint64_t>(text.size()) >> (8 * i));
    header_written = true;
    write_all(len, sizeof len, 0);
    write_all(text.data(), text.size(), sizeof len);
    data_start = sizeof len + text.size();
    // The full size up front: the data is written in any order.
    if (!decls.empty() && ::ftruncate(fd, static_cast<off_t>(data_start + decls.back().end)) != 0) {
      failed = true;
      NIBBLE_FAIL("{}: cannot size {}: {}", where(), tmp.string(), std::strerror(errno));
    }
  }

  void discard() noexcept {
    if (fd >= 0) ::close(fd);
    fd = -1;
    std::error_code ec;
    std::filesystem::remove(tmp, ec);
  }
};

namespace {
// Names and metadata become JSON strings, which must be valid UTF-8.
void check_utf8(const std::string& path, const std::string& s, const char* what) {
  try {
    (void)json(s).dump();
  } catch (const json::exception&) {
    NIBBLE_FAIL("{}: {} {} is not valid UTF-8", path, what, qstr(s));
  }
}
}  // namespace

SafetensorsWriter::SafetensorsWriter(std::filesystem::path path, std::map<std::string, std::string> metadata)
    : impl_(std::make_unique<Impl>()) {
  impl_->path = std::move(path);
  impl_->tmp = impl_->path;
  impl_->tmp += ".tmp";
  impl_->metadata = std::move(metadata);
  for (const auto& [k, v] : impl_->metadata) {
    check_utf8(impl_->where(), k, "metadata key");
    check_utf8(impl_->where(), v, "metadata value");
  }
  do {
    impl_->fd = ::open(impl_->tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  } while (impl_->fd < 0 && errno == EINTR);
  NIBBLE_CHECK(impl_->fd >= 0, "{}: cannot open output {} for writing: {}", impl_->where(), impl_->tmp.string(),
               std::strerror(errno));
}

SafetensorsWriter::~SafetensorsWriter() {
  if (impl_ && !impl_->finished) impl_->discard();
}

void SafetensorsWriter::declare(const std::string& name, DType dtype, const Shape& shape) {
  Impl& w = *impl_;
  w.check_usable();
  NIBBLE_CHECK(!w.header_written,
               "{}: cannot declare tensor {} after the first write: declare every tensor before writing any",
               w.where(), qstr(name));
  NIBBLE_CHECK(name != kMetadataKey, "{}: the tensor name __metadata__ is reserved", w.where());
  NIBBLE_CHECK(!w.index.count(name), "{}: duplicate tensor name {}", w.where(), qstr(name));
  check_utf8(w.where(), name, "tensor name");
  for (size_t i = 0; i < shape.size(); ++i)
    NIBBLE_CHECK(shape[i] >= 0, "{}: tensor {}: shape[{}] is {}, expected a non-negative integer", w.where(),
                 qstr(name), i, shape[i]);
  const auto nbytes = checked_nbytes(shape, dtype);
  NIBBLE_CHECK(nbytes.has_value(), "{}: tensor {}: shape overflow: {} of {} does not fit in 64 bits", w.where(),
               qstr(name), shape_str(shape), dtype_name(dtype));
  const uint64_t begin = w.decls.empty() ? 0 : w.decls.back().end;
  NIBBLE_CHECK(*nbytes <= std::numeric_limits<uint64_t>::max() - begin, "{}: tensor {}: data buffer overflow",
               w.where(), qstr(name));
  w.index.emplace(name, w.decls.size());
  w.decls.push_back({name, dtype, shape, begin, begin + *nbytes});
  w.written.push_back(false);
}

void SafetensorsWriter::write(const std::string& name, const void* data, size_t nbytes) {
  Impl& w = *impl_;
  w.check_usable();
  auto it = w.index.find(name);
  NIBBLE_CHECK(it != w.index.end(), "{}: cannot write tensor {}: it was not declared", w.where(), qstr(name));
  NIBBLE_CHECK(!w.written[it->second], "{}: tensor {} is already written", w.where(), qstr(name));
  const Impl::Decl& d = w.decls[it->second];
  const uint64_t expected = d.end - d.begin;
  NIBBLE_CHECK(nbytes == expected, "{}: tensor {}: expected {} bytes ({} of {}), found {}", w.where(), qstr(name),
               expected, shape_str(d.shape), dtype_name(d.dtype), nbytes);
  NIBBLE_CHECK(data != nullptr || nbytes == 0, "{}: tensor {}: null data", w.where(), qstr(name));
  if (!w.header_written) w.write_header();
  w.write_all(data, nbytes, w.data_start + d.begin);
  w.written[it->second] = true;
  ++w.num_written;
}

void SafetensorsWriter::write(const std::string& name, const Tensor& t) {
  Impl& w = *impl_;
  if (auto it = w.index.find(name); it != w.index.end()) {
    const Impl::Decl& d = w.decls[it->second];
    NIBBLE_CHECK(t.dtype() == d.dtype, "{}: tensor {}: declared dtype {}, found {}", w.where(), qstr(name),
                 dtype_name(d.dtype), dtype_name(t.dtype()));
    NIBBLE_CHECK(t.shape() == d.shape, "{}: tensor {}: declared shape {}, found {}", w.where(), qstr(name),
                 shape_str(d.shape), shape_str(t.shape()));
  }
  if (t.numel() == 0) return write(name, nullptr, 0);
  if (!t.is_contiguous()) {
    const Tensor c = t.contiguous();
    return write(name, c.raw(), c.nbytes());
  }
  write(name, t.raw(), t.nbytes());
}

void SafetensorsWriter::finish() {
  Impl& w = *impl_;
  w.check_usable();
  const size_t unwritten = w.first_unwritten();
  NIBBLE_CHECK(w.num_written == w.decls.size(), "{}: finish() with {} of {} declared tensors unwritten (first: {})",
               w.where(), w.decls.size() - w.num_written, w.decls.size(),
               qstr(unwritten < w.decls.size() ? w.decls[unwritten].name : ""));
  if (!w.header_written) w.write_header();  // no tensors: the header alone
  auto io_fail = [&](const char* what) {
    const int err = errno;
    w.failed = true;
    w.discard();
    NIBBLE_FAIL("{}: cannot {} {}: {}", w.where(), what, w.tmp.string(), std::strerror(err));
  };
  if (::fsync(w.fd) != 0) io_fail("fsync");
  const int fd = w.fd;
  w.fd = -1;
  if (::close(fd) != 0) io_fail("close");
  if (std::rename(w.tmp.c_str(), w.path.c_str()) != 0) io_fail("rename into place");
  w.finished = true;
  // Make the rename itself durable; best effort (some filesystems refuse).
  const auto dir = w.path.has_parent_path() ? w.path.parent_path() : std::filesystem::path(".");
  if (int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
}

void save_safetensors(const std::filesystem::path& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  SafetensorsWriter w(path, metadata);
  for (const auto& [name, t] : tensors) w.declare(name, t.dtype(), t.shape());
  for (const auto& [name, t] : tensors) w.write(name, t);
  w.finish();
}

}  // namespace nibble::io
