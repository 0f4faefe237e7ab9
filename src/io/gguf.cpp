// GGUF reader: memory-mapped, every read bounds-checked.
//
// What is validated (each violation is one nibble::Error line naming the
// file and the key or tensor): the magic, the version (2 or 3; 1 and
// big-endian files are refused with a message saying so), every length and
// count against the bytes left (so a truncated or corrupt header can never
// make the reader allocate or read past the end), value types, nesting depth,
// duplicate keys and tensor names, general.alignment (a u32 power of two),
// tensor ranks (at most 4, as ggml), types, the row length a multiple of the
// type's block size, element counts and byte sizes against 64-bit overflow,
// offsets aligned, and every tensor's bytes inside the data section and
// disjoint from the others.
#include "nibble/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>

#include "io/mmap.h"
#include "nibble/error.h"

namespace nibble::io {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes a little-endian host");

namespace {

constexpr uint32_t kDefaultAlignment = 32;  // GGUF_DEFAULT_ALIGNMENT
constexpr uint32_t kMaxDims = 4;            // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;           // nested arrays; real files use 1

// A string from the file made safe for a one-line message: quoted, control
// and non-ASCII bytes escaped, long strings cut.
std::string qstr(std::string_view s) {
  constexpr size_t kMaxShown = 100;
  std::string out = "'";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i == kMaxShown) return out + fmt::format("...' ({} bytes)", s.size());
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '\'' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20 || c >= 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "'";
}

bool valid_value_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::F64); }

// The fewest bytes one element of type t takes (strings and arrays: their
// length/count headers), to bound counts before anything is allocated.
uint64_t min_value_bytes(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::Bool: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: case GgufType::String: return 8;
    case GgufType::Array: return 12;
  }
  return 1;
}

// Sequential little-endian reads with bounds checks. `where` says what is
// being read in messages ("metadata key 'x'", "tensor info 3 ('blk.0...')").
class Reader {
 public:
  Reader(const uint8_t* data, uint64_t size, const std::string& file) : data_(data), size_(size), file_(file) {}
  uint64_t pos = 0;
  std::string where;

  uint64_t left() const { return size_ - pos; }
  void need(uint64_t n, const char* what) const {
    if (n > left())
      NIBBLE_FAIL("{}: truncated: {}{}{} at byte {} needs {} bytes, but the file ends at byte {}", file_, where,
                  where.empty() ? "" : ": ", what, pos, n, size_);
  }
  template <typename T> T read(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos, sizeof(T));
    pos += sizeof(T);
    return v;
  }
  std::string read_string(const char* what) {
    const auto n = read<uint64_t>(what);
    if (n > left())
      NIBBLE_FAIL("{}: truncated or corrupt: {}{}{} at byte {} says it is {} bytes long, but only {} bytes are left",
                  file_, where, where.empty() ? "" : ": ", what, pos - 8, n, left());
    std::string s(reinterpret_cast<const char*>(data_ + pos), n);
    pos += n;
    return s;
  }
  [[noreturn]] void fail(const std::string& msg) const {
    NIBBLE_FAIL("{}: {}{}{}", file_, where, where.empty() ? "" : ": ", msg);
  }

 private:
  const uint8_t* data_;
  uint64_t size_;
  const std::string& file_;
};

GgufValue read_value(Reader& r, GgufType type, int depth) {
  GgufValue v;
  v.type = type;
  switch (type) {
    case GgufType::U8: v.u = r.read<uint8_t>("uint8 value"); break;
    case GgufType::I8: v.i = r.read<int8_t>("int8 value"); break;
    case GgufType::U16: v.u = r.read<uint16_t>("uint16 value"); break;
    case GgufType::I16: v.i = r.read<int16_t>("int16 value"); break;
    case GgufType::U32: v.u = r.read<uint32_t>("uint32 value"); break;
    case GgufType::I32: v.i = r.read<int32_t>("int32 value"); break;
    case GgufType::U64: v.u = r.read<uint64_t>("uint64 value"); break;
    case GgufType::I64: v.i = r.read<int64_t>("int64 value"); break;
    case GgufType::F32: v.f = r.read<float>("float32 value"); break;
    case GgufType::F64: v.f = r.read<double>("float64 value"); break;
    case GgufType::Bool: {
      const auto b = r.read<uint8_t>("bool value");
      if (b > 1) r.fail(fmt::format("bool value is {}, expected 0 or 1", b));
      v.u = b;
      break;
    }
    case GgufType::String: v.s = r.read_string("string value"); break;
    case GgufType::Array: {
      const auto et = r.read<uint32_t>("array element type");
      if (!valid_value_type(et)) r.fail(fmt::format("array element type {} is unknown (expected 0..12)", et));
      v.element_type = static_cast<GgufType>(et);
      if (v.element_type == GgufType::Array && depth + 1 >= kMaxArrayDepth)
        r.fail(fmt::format("arrays nested deeper than {} levels", kMaxArrayDepth));
      const auto n = r.read<uint64_t>("array length");
      const uint64_t min = min_value_bytes(v.element_type);
      if (n > r.left() / min)
        r.fail(fmt::format("truncated or corrupt: an array of {} {} elements needs at least {} bytes, but only {} "
                           "are left",
                           n, gguf_type_name(v.element_type), n > UINT64_MAX / min ? UINT64_MAX : n * min,
                           r.left()));
      v.array.reserve(n);
      for (uint64_t k = 0; k < n; ++k) v.array.push_back(read_value(r, v.element_type, depth + 1));
      break;
    }
  }
  return v;
}

}  // namespace

// ---------------------------------------------------------------- values

std::string_view gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8: return "uint8";
    case GgufType::I8: return "int8";
    case GgufType::U16: return "uint16";
    case GgufType::I16: return "int16";
    case GgufType::U32: return "uint32";
    case GgufType::I32: return "int32";
    case GgufType::F32: return "float32";
    case GgufType::Bool: return "bool";
    case GgufType::String: return "string";
    case GgufType::Array: return "array";
    case GgufType::U64: return "uint64";
    case GgufType::I64: return "int64";
    case GgufType::F64: return "float64";
  }
  return "unknown";
}

bool GgufValue::is_integer() const {
  switch (type) {
    case GgufType::U8: case GgufType::I8: case GgufType::U16: case GgufType::I16:
    case GgufType::U32: case GgufType::I32: case GgufType::U64: case GgufType::I64: return true;
    default: return false;
  }
}

bool GgufValue::is_float() const { return type == GgufType::F32 || type == GgufType::F64; }

std::optional<int64_t> GgufValue::as_int() const {
  if (!is_integer()) return std::nullopt;
  switch (type) {
    case GgufType::I8: case GgufType::I16: case GgufType::I32: case GgufType::I64: return i;
    default:
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
      return static_cast<int64_t>(u);
  }
}

std::string GgufValue::describe() const {
  const std::string_view tn = gguf_type_name(type);
  switch (type) {
    case GgufType::String: return fmt::format("string {}", qstr(s));
    case GgufType::Array: return fmt::format("an array of {} {}", array.size(), gguf_type_name(element_type));
    case GgufType::Bool: return fmt::format("bool {}", u ? "true" : "false");
    case GgufType::F32: case GgufType::F64: return fmt::format("{} {}", tn, f);
    case GgufType::I8: case GgufType::I16: case GgufType::I32: case GgufType::I64: return fmt::format("{} {}", tn, i);
    default: return fmt::format("{} {}", tn, u);
  }
}

Shape GgufTensorInfo::shape() const { return Shape(ne.rbegin(), ne.rend()); }

int64_t GgufTensorInfo::numel() const { return shape_numel(shape()); }

// ---------------------------------------------------------------- reader

GgufFile GgufFile::open(const std::filesystem::path& path) {
  MappedFile m = map_file_readonly(path);
  return from_buffer(std::move(m.owner), m.data, m.size, path);
}

GgufFile GgufFile::from_buffer(std::shared_ptr<const void> owner, const uint8_t* data, size_t size,
                               std::filesystem::path display_name) {
  GgufFile f;
  f.path_ = std::move(display_name);
  f.mapping_ = std::move(owner);
  f.base_ = data;
  f.size_ = size;
  const std::string file = f.path_.string();
  NIBBLE_CHECK(data != nullptr || size == 0, "{}: no data", file);
  Reader r(data, size, file);

  NIBBLE_CHECK(size >= 4, "{}: not a GGUF file: it is {} bytes, too short for the magic 'GGUF'", file, size);
  if (std::memcmp(data, "GGUF", 4) != 0)
    NIBBLE_FAIL("{}: not a GGUF file: expected the magic 'GGUF' (47 47 55 46), found {}", file,
                qstr(std::string_view(reinterpret_cast<const char*>(data), 4)));
  r.pos = 4;
  f.version_ = r.read<uint32_t>("version");
  NIBBLE_CHECK(f.version_ != 1,
               "{}: GGUF version 1 is not supported (only 2 and 3; version 1 files predate August 2023 and need "
               "re-conversion)",
               file);
  // A big-endian file has the same magic but its version reads byte-swapped.
  const uint32_t swapped = (f.version_ >> 24) | ((f.version_ >> 8) & 0xFF00) | ((f.version_ << 8) & 0xFF0000) |
                           (f.version_ << 24);
  NIBBLE_CHECK(swapped < 1 || swapped > 3,
               "{}: big-endian GGUF (version {} byte-swapped) is not supported: nibble reads little-endian files",
               file, swapped);
  NIBBLE_CHECK(f.version_ == 2 || f.version_ == 3, "{}: GGUF version {} is not supported (expected 2 or 3)", file,
               f.version_);
  const auto n_tensors = r.read<uint64_t>("tensor count");
  const auto n_kv = r.read<uint64_t>("metadata count");
  // Each KV takes at least 13 bytes, each tensor info at least 24: bound the
  // counts by the bytes left before reserving anything.
  NIBBLE_CHECK(n_kv <= r.left() / 13, "{}: corrupt header: {} metadata entries cannot fit in the {} bytes left",
               file, n_kv, r.left());
  NIBBLE_CHECK(n_tensors <= r.left() / 24, "{}: corrupt header: {} tensor infos cannot fit in the {} bytes left",
               file, n_tensors, r.left());

  f.kv_.reserve(n_kv);
  for (uint64_t k = 0; k < n_kv; ++k) {
    r.where = fmt::format("metadata entry {}", k);
    std::string key = r.read_string("key");
    r.where = fmt::format("metadata key {}", qstr(key));
    const auto vt = r.read<uint32_t>("value type");
    if (!valid_value_type(vt)) r.fail(fmt::format("value type {} is unknown (expected 0..12)", vt));
    GgufValue v = read_value(r, static_cast<GgufType>(vt), 0);
    if (!f.kv_index_.emplace(key, f.kv_.size()).second) r.fail("duplicate key");
    f.kv_.emplace_back(std::move(key), std::move(v));
  }
  r.where.clear();

  f.alignment_ = kDefaultAlignment;
  if (const GgufValue* a = f.find("general.alignment")) {
    NIBBLE_CHECK(a->type == GgufType::U32, "{}: metadata key 'general.alignment' is {}, expected a uint32", file,
                 a->describe());
    NIBBLE_CHECK(a->u != 0 && std::has_single_bit(a->u),
                 "{}: metadata key 'general.alignment' is {}, expected a power of two", file, a->u);
    f.alignment_ = a->u;
  }

  f.tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    r.where = fmt::format("tensor info {}", k);
    GgufTensorInfo t;
    t.name = r.read_string("name");
    r.where = fmt::format("tensor {}", qstr(t.name));
    if (f.index_.count(t.name)) r.fail("duplicate tensor name");
    const auto n_dims = r.read<uint32_t>("n_dims");
    if (n_dims > kMaxDims) r.fail(fmt::format("n_dims is {}, expected at most {}", n_dims, kMaxDims));
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto ne = r.read<uint64_t>("ne");
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        r.fail(fmt::format("ne[{}] is {}, expected at most 2^63-1", d, ne));
      t.ne.push_back(static_cast<int64_t>(ne));
    }
    t.type = r.read<uint32_t>("type");
    const GgmlTypeTraits* tt = ggml_type_traits(t.type);
    if (!tt) r.fail(fmt::format("ggml type {} is unknown", t.type));
    const auto numel = checked_numel(t.ne);
    if (!numel) r.fail(fmt::format("ne {} overflows 64 bits", fmt::join(t.ne, " x ")));
    if (t.ne.empty() && tt->block_size != 1)  // a 0-d tensor's one element cannot fill a block
      r.fail(fmt::format("a 0-d tensor (one element) cannot be of {}, whose blocks hold {} elements", tt->name,
                         tt->block_size));
    if (!t.ne.empty() && t.ne[0] % tt->block_size != 0)
      r.fail(fmt::format("the row length ne[0] = {} is not a multiple of {}'s block size {}", t.ne[0], tt->name,
                         tt->block_size));
    const int64_t blocks = *numel / tt->block_size;
    if (blocks > std::numeric_limits<int64_t>::max() / tt->type_size)
      r.fail(fmt::format("{} elements of {} overflow 64 bits", *numel, tt->name));
    t.nbytes = static_cast<uint64_t>(blocks * tt->type_size);
    t.offset = r.read<uint64_t>("offset");
    if (t.offset % f.alignment_ != 0)
      r.fail(fmt::format("data offset {} is not a multiple of the alignment {}", t.offset, f.alignment_));
    f.index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }
  r.where.clear();

  // The data section starts at the next multiple of the alignment (a file
  // without tensors may end before it).
  f.data_offset_ = (r.pos + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  const uint64_t data_size = f.data_offset_ <= size ? size - f.data_offset_ : 0;
  std::vector<const GgufTensorInfo*> by_offset;
  for (const GgufTensorInfo& t : f.tensors_) {
    NIBBLE_CHECK(t.offset <= data_size && t.nbytes <= data_size - t.offset,
                 "{}: tensor {} data out of bounds: bytes [{}, {}) of the data section (at file offset {}), which "
                 "has only {} bytes (file is {} bytes; truncated?)",
                 file, qstr(t.name), t.offset, t.offset + t.nbytes, f.data_offset_, data_size, size);
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const GgufTensorInfo& a = *by_offset[k - 1];
    const GgufTensorInfo& b = *by_offset[k];
    NIBBLE_CHECK(b.offset >= a.offset + a.nbytes, "{}: tensors {} [{}, {}) and {} [{}, {}) overlap", file,
                 qstr(a.name), a.offset, a.offset + a.nbytes, qstr(b.name), b.offset, b.offset + b.nbytes);
  }
  return f;
}

// ---------------------------------------------------------------- metadata access

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufValue& GgufFile::get(const std::string& key) const {
  const GgufValue* v = find(key);
  NIBBLE_CHECK(v, "{}: metadata key {} is missing", path_.string(), qstr(key));
  return *v;
}

int64_t GgufFile::get_int(const std::string& key) const {
  const GgufValue& v = get(key);
  const auto x = v.as_int();
  NIBBLE_CHECK(x, "{}: metadata key {} is {}, expected an integer{}", path_.string(), qstr(key), v.describe(),
               v.is_integer() ? " that fits int64" : "");
  return *x;
}

int64_t GgufFile::get_int(const std::string& key, int64_t fallback) const {
  return has(key) ? get_int(key) : fallback;
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = get(key);
  NIBBLE_CHECK(v.is_float(), "{}: metadata key {} is {}, expected a float32 or float64", path_.string(), qstr(key),
               v.describe());
  return v.f;
}

double GgufFile::get_float(const std::string& key, double fallback) const {
  return has(key) ? get_float(key) : fallback;
}

bool GgufFile::get_bool(const std::string& key) const {
  const GgufValue& v = get(key);
  NIBBLE_CHECK(v.type == GgufType::Bool, "{}: metadata key {} is {}, expected a bool", path_.string(), qstr(key),
               v.describe());
  return v.u != 0;
}

const std::string& GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = get(key);
  NIBBLE_CHECK(v.type == GgufType::String, "{}: metadata key {} is {}, expected a string", path_.string(), qstr(key),
               v.describe());
  return v.s;
}

std::string GgufFile::get_string(const std::string& key, const std::string& fallback) const {
  return has(key) ? get_string(key) : fallback;
}

std::vector<std::string> GgufFile::get_string_array(const std::string& key) const {
  const GgufValue& v = get(key);
  NIBBLE_CHECK(v.type == GgufType::Array && v.element_type == GgufType::String,
               "{}: metadata key {} is {}, expected an array of string", path_.string(), qstr(key), v.describe());
  std::vector<std::string> out;
  out.reserve(v.array.size());
  for (const GgufValue& e : v.array) out.push_back(e.s);
  return out;
}

std::vector<int64_t> GgufFile::get_int_array(const std::string& key) const {
  const GgufValue& v = get(key);
  NIBBLE_CHECK(v.type == GgufType::Array && (v.array.empty() || v.array[0].is_integer()),
               "{}: metadata key {} is {}, expected an array of integers", path_.string(), qstr(key), v.describe());
  std::vector<int64_t> out;
  out.reserve(v.array.size());
  for (size_t k = 0; k < v.array.size(); ++k) {
    const auto x = v.array[k].as_int();
    NIBBLE_CHECK(x, "{}: metadata key {}: element {} is {}, expected an integer that fits int64", path_.string(),
                 qstr(key), k, v.array[k].describe());
    out.push_back(*x);
  }
  return out;
}

std::vector<float> GgufFile::get_float_array(const std::string& key) const {
  const GgufValue& v = get(key);
  NIBBLE_CHECK(v.type == GgufType::Array && (v.element_type == GgufType::F32 || v.element_type == GgufType::F64),
               "{}: metadata key {} is {}, expected an array of float32", path_.string(), qstr(key), v.describe());
  std::vector<float> out;
  out.reserve(v.array.size());
  for (const GgufValue& e : v.array) out.push_back(static_cast<float>(e.f));
  return out;
}

GgufVocab GgufFile::vocab() const {
  GgufVocab voc;
  voc.model = get_string("tokenizer.ggml.model", "");
  voc.pre = get_string("tokenizer.ggml.pre", "");
  if (has("tokenizer.ggml.tokens")) voc.tokens = get_string_array("tokenizer.ggml.tokens");
  if (has("tokenizer.ggml.scores")) voc.scores = get_float_array("tokenizer.ggml.scores");
  if (has("tokenizer.ggml.token_type"))
    for (int64_t t : get_int_array("tokenizer.ggml.token_type")) voc.token_types.push_back(static_cast<int32_t>(t));
  if (has("tokenizer.ggml.merges")) voc.merges = get_string_array("tokenizer.ggml.merges");
  for (auto [key, len] : {std::pair{"tokenizer.ggml.scores", voc.scores.size()},
                          {"tokenizer.ggml.token_type", voc.token_types.size()}})
    NIBBLE_CHECK(len == 0 || len == voc.tokens.size(),
                 "{}: metadata key '{}' has {} entries, but tokenizer.ggml.tokens has {}", path_.string(), key, len,
                 voc.tokens.size());
  // Ids of absent tokens are written as -1 (0xFFFFFFFF in a uint32): those
  // mean "none".
  auto id = [&](const char* key) -> std::optional<int64_t> {
    if (!has(key)) return std::nullopt;
    const int64_t v = get_int(key);
    if (v < 0 || v == 0xFFFFFFFF) return std::nullopt;
    return v;
  };
  voc.bos_id = id("tokenizer.ggml.bos_token_id");
  voc.eos_id = id("tokenizer.ggml.eos_token_id");
  voc.eot_id = id("tokenizer.ggml.eot_token_id");
  voc.unknown_id = id("tokenizer.ggml.unknown_token_id");
  voc.padding_id = id("tokenizer.ggml.padding_token_id");
  if (has("tokenizer.ggml.add_bos_token")) voc.add_bos = get_bool("tokenizer.ggml.add_bos_token");
  if (has("tokenizer.ggml.add_eos_token")) voc.add_eos = get_bool("tokenizer.ggml.add_eos_token");
  if (has("tokenizer.ggml.add_space_prefix")) voc.add_space_prefix = get_bool("tokenizer.ggml.add_space_prefix");
  voc.chat_template = get_string("tokenizer.chat_template", "");
  return voc;
}

// ---------------------------------------------------------------- tensor access

const GgufTensorInfo& GgufFile::info(const std::string& name) const {
  auto it = index_.find(name);
  NIBBLE_CHECK(it != index_.end(), "{}: no tensor named {}", path_.string(), qstr(name));
  return tensors_[it->second];
}

Tensor GgufFile::view(const std::string& name) const {
  const GgufTensorInfo& t = info(name);
  std::optional<DType> dt;
  switch (static_cast<GgmlType>(t.type)) {
    case GgmlType::F32: dt = DType::F32; break;
    case GgmlType::F16: dt = DType::F16; break;
    case GgmlType::BF16: dt = DType::BF16; break;
    case GgmlType::F64: dt = DType::F64; break;
    case GgmlType::I8: dt = DType::I8; break;
    case GgmlType::I16: dt = DType::I16; break;
    case GgmlType::I32: dt = DType::I32; break;
    case GgmlType::I64: dt = DType::I64; break;
    default: break;
  }
  NIBBLE_CHECK(dt, "{}: tensor {} is {}, a block-quantized type: dequantize it instead of viewing it",
               path_.string(), qstr(name), ggml_type_name(t.type));
  const uint8_t* p = data(t);
  if (reinterpret_cast<uintptr_t>(p) % dtype_size(*dt) != 0) {  // misaligned buffer: copy
    Tensor copy = Tensor::empty(*dt, t.shape());
    if (t.nbytes) std::memcpy(copy.raw_mut(), p, t.nbytes);
    return copy;
  }
  return Tensor::view(*dt, t.shape(), p, mapping_);
}

void GgufFile::require_dequantizable(const std::string& name) const {
  const GgufTensorInfo& t = info(name);
  const GgmlTypeTraits* tt = ggml_type_traits(t.type);
  NIBBLE_CHECK(tt && tt->dequantize, "{}: tensor {} has ggml type {}, which nibble cannot dequantize (supported: {})",
               path_.string(), qstr(name), ggml_type_name(t.type), ggml_dequantizable_types());
}

Tensor GgufFile::dequantize(const std::string& name) const {
  require_dequantizable(name);
  const GgufTensorInfo& t = info(name);
  Tensor out = Tensor::empty(DType::F32, t.shape());
  ggml_dequantize(t.type, data(t), t.nbytes, out.data_mut<float>(), t.numel());
  return out;
}

}  // namespace nibble::io
