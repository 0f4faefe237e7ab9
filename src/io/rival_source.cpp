// RivalSource and the rival schemes (include/nibble/rival.h): GPTQ, AWQ and
// compressed-tensors checkpoints read back to the weights they define.
//
// Each scheme's layout was checked against the rival's own packing and
// dequantization code (GPTQModel's TorchLinear, AutoAWQ's WQLinear_GEMM,
// compressed-tensors' compressors): tests/unit/test_rival.cpp holds vectors
// made by those libraries (scripts/make_rival_vectors.py).
#include "nibble/rival.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cmath>
#include <deque>
#include <initializer_list>
#include <set>
#include <string_view>

#include "nibble/arch.h"
#include "nibble/dtype.h"
#include "nibble/error.h"
#include "nibble/format.h"
#include "nibble/regex.h"
#include "formats/common.h"
#include "io/json_file.h"

namespace nibble {
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// The name without `suffix`, when it ends with it.
std::optional<std::string> strip_suffix(const std::string& name, std::string_view suffix) {
  if (!name.ends_with(suffix)) return std::nullopt;
  return name.substr(0, name.size() - suffix.size());
}

// Field `index` of a little-endian bit stream of `bits`-wide unsigned values
// packed into 32-bit words; `word(i)` reads the stream's i-th word. A field
// may straddle two words (3 bits).
template <typename Word>
uint32_t stream_field(const Word& word, int64_t index, int bits) {
  const int64_t pos = index * bits;
  const int64_t w = pos / 32;
  const int off = static_cast<int>(pos % 32);
  uint64_t v = word(w) >> off;
  if (off + bits > 32) v |= static_cast<uint64_t>(word(w + 1)) << (32 - off);
  return static_cast<uint32_t>(v) & ((1u << bits) - 1);
}

// A stored tensor as contiguous packed words: int32 (I32 as stored; U32 does not exist in safetensors), or `word`
// (I16 for AWQ's GEMV-fast codes).
Tensor words_of(const TensorSource& raw, const std::string& name, const std::string& what,
                DType word = DType::I32) {
  NIBBLE_CHECK(raw.contains(name), "{}: {} '{}' is missing", raw.describe(), what, name);
  Tensor t = raw.load(name);
  NIBBLE_CHECK(t.dtype() == word && t.dim() == 2, "{}: '{}' should be a 2-D {} tensor of packed {}, found {} {}",
               raw.describe(), name, dtype_name(word), what, dtype_name(t.dtype()), shape_str(t.shape()));
  return t.is_contiguous() ? t : t.contiguous();
}

// A stored float tensor (scales) as F32, with the shape it must have.
Tensor floats_of(const TensorSource& raw, const std::string& name, const Shape& want) {
  NIBBLE_CHECK(raw.contains(name), "{}: '{}' is missing", raw.describe(), name);
  Tensor t = raw.load(name);
  NIBBLE_CHECK(dtype_is_float(t.dtype()), "{}: '{}' should hold floats, found {}", raw.describe(), name,
               dtype_name(t.dtype()));
  if (!want.empty())
    NIBBLE_CHECK(shape_numel(t.shape()) == shape_numel(want) && (t.dim() == static_cast<int64_t>(want.size()) ||
                                                                  shape_numel(want) == 1),
                 "{}: '{}' should have shape {}, found {}", raw.describe(), name, shape_str(want),
                 shape_str(t.shape()));
  return t.to_f32();
}

// The group of each input column: `g_idx` (act-order checkpoints store it)
// or k / group_size. Checked against the number of groups the scales have.
std::vector<int32_t> groups_of(const TensorSource& raw, const std::string& g_idx_name, int64_t in, int64_t group_size,
                               int64_t n_groups) {
  std::vector<int32_t> g(static_cast<size_t>(in));
  if (!g_idx_name.empty() && raw.contains(g_idx_name)) {
    const Tensor t = raw.load(g_idx_name).to_f32();
    NIBBLE_CHECK(t.numel() == in, "{}: '{}' should have {} entries (one per input), found {}", raw.describe(),
                 g_idx_name, in, t.numel());
    const float* p = t.data<float>();
    for (int64_t k = 0; k < in; ++k) {
      NIBBLE_CHECK(p[k] >= 0 && p[k] < static_cast<float>(n_groups) && p[k] == std::floor(p[k]),
                   "{}: '{}'[{}] = {} is not a group index (there are {} groups of scales)", raw.describe(),
                   g_idx_name, k, p[k], n_groups);
      g[k] = static_cast<int32_t>(p[k]);
    }
  } else {
    for (int64_t k = 0; k < in; ++k) g[k] = static_cast<int32_t>(k / group_size);
  }
  for (int64_t k = 0; k < in; ++k)
    NIBBLE_CHECK(g[k] >= 0 && g[k] < n_groups, "{}: input {} falls in group {}, but there are {} groups of scales",
                 raw.describe(), k, g[k], n_groups);
  return g;
}

// ⌈a / b⌉ for a ≥ 0, b > 0, without overflowing near INT64_MAX.
int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0); }

// The linear's tensors `prefix + suffix`, each of which must be stored.
std::vector<std::string> required_parts(const TensorSource& raw, const std::string& prefix,
                                        std::initializer_list<const char*> suffixes, const char* scheme) {
  std::vector<std::string> p;
  for (const char* s : suffixes) {
    p.push_back(prefix + s);
    NIBBLE_CHECK(raw.contains(p.back()), "{}: {} linear '{}' has no '{}'", raw.describe(), scheme, prefix, p.back());
  }
  return p;
}

// s·(q − z) in f32: a weight of GPTQ (GPTQModel's TorchLinear) and AWQ's GEMM
// and GEMV layouts (AutoAWQ), which round it to fp16 after.
inline float scaled_offset(float s, uint32_t q, float z) { return s * (static_cast<float>(q) - z); }

// Rivals' 4-bit affine linears in nibble formats, exactly (RivalScheme::exact_format).
// A scheme gives each group of `group` inputs in input order (32, 64 or 128) as
// its scale s and the value its own dequantize computes for each of the 16
// codes: s·(q − z), (q − 8 − z)·s (compressed-tensors), q·s + m (AWQ's
// GEMV-fast). A format holds the linear where for every group its decode of
// every code, from the parameters it would store for scale s and min = the
// value of code 0 (which code 0 decodes to), is that value bit for bit; the
// first of int4_sym ((q − 8)·s, f16 s: zero points of 8), int4_asym (q·s + min,
// bf16 pairs) and int4_asym_f32 (the same in f32) that does, else none (the
// linear stays dense). With f16 or bf16 scales the products are exact and
// int4_asym_f32 always holds s·(q − z); with f32 scales fl(q·s) + fl(−z·s) can
// miss fl((q − z)·s), which the check finds. Checking all 16 codes, not the
// stored ones, decides without reading the codes.
struct Affine4Group {
  float scale = 0.0f;
  std::array<float, 16> value{};  // the scheme's weight for each code
};
// exact_format's answer with the parameters it was decided on, which
// exact_parts then packs (each scale and zero tensor read from the file once).
struct Affine4Choice {
  FormatChoice format;
  int64_t out = 0, in = 0;
  std::vector<GroupParams> params;  // [out, groups] as `format` stores them
};

// The parameters `f` stores for a scale and a min (f's own rounding: f16, bf16 or none).
GroupParams affine4_stored(const FormatSpec& f, const GroupParams& raw) {
  return f.affine->store(GroupParams{}, raw.scale, raw.min);
}

// The choice for a linear [out, in] whose group g of output n is group_of(n, g) (an Affine4Group).
template <typename GroupFn>
std::optional<Affine4Choice> affine4_choice(int64_t out, int64_t in, int64_t group, const GroupFn& group_of) {
  if (group != 32 && group != 64 && group != 128) return std::nullopt;
  static constexpr const char* kFamilies[3] = {"int4_sym", "int4_asym", "int4_asym_f32"};  // preferred first
  std::array<const FormatSpec*, 3> spec{};
  for (int f = 0; f < 3; ++f) spec[f] = find_format(kFamilies[f], static_cast<int>(group)).spec;
  const int64_t groups = ceil_div(in, group);
  Affine4Choice c{{}, out, in, std::vector<GroupParams>(static_cast<size_t>(out * groups))};
  bool ok0 = true, ok1 = true, ok2 = true;
#pragma omp parallel for schedule(static) reduction(&& : ok0, ok1, ok2)
  for (int64_t n = 0; n < out; ++n) {
    bool* ok[3] = {&ok0, &ok1, &ok2};
    for (int64_t g = 0; g < groups && (ok0 || ok1 || ok2); ++g) {
      const Affine4Group a = group_of(n, g);
      GroupParams& raw = c.params[static_cast<size_t>(n * groups + g)];
      raw.scale = a.scale;
      raw.min = a.value[0];
      for (int f = 0; f < 3; ++f) {
        if (!*ok[f]) continue;
        const GroupParams p = affine4_stored(*spec[f], raw);
        for (uint8_t q = 0; q < 16 && *ok[f]; ++q)
          *ok[f] = std::bit_cast<uint32_t>(spec[f]->decode(q, p)) == std::bit_cast<uint32_t>(a.value[q]);
      }
    }
  }
  if (!ok0 && !ok1 && !ok2) return std::nullopt;
  c.format = {spec[ok0 ? 0 : ok1 ? 1 : 2], static_cast<int>(group)};
  for (GroupParams& p : c.params) p = affine4_stored(*c.format.spec, p);
  return c;
}

// The choice's parts, with code(n, k) (0..15) the code of output n's input k.
template <typename CodeFn>
std::vector<Tensor> pack_affine4(Affine4Choice c, const CodeFn& code) {
  QuantizedMatrix q = formats::empty_matrix(*c.format.spec, c.out, c.in, c.format.group_size);
  q.params = std::move(c.params);
#pragma omp parallel for schedule(static)
  for (int64_t n = 0; n < c.out; ++n)
    for (int64_t k = 0; k < c.in; ++k) q.codes[static_cast<size_t>(n * c.in + k)] = static_cast<uint8_t>(code(n, k));
  return c.format.spec->pack(q);
}

// A scheme whose 4-bit affine linears a nibble format may hold exactly:
// exact_format is exact_choice's format (each scheme's exact_parts packs that
// choice with its codes).
class Affine4Scheme : public RivalScheme {
 public:
  std::optional<FormatChoice> exact_format(const std::string& prefix, const TensorSource& raw) const final {
    std::optional<Affine4Choice> c = exact_choice(prefix, raw);
    if (!c) return std::nullopt;
    const FormatChoice f = c->format;
    std::lock_guard<std::mutex> lock(last_mutex_);
    std::erase_if(last_, [&](const Last& l) { return l.prefix == prefix && l.raw == &raw; });
    if (last_.size() == kLastChoices) last_.pop_front();
    last_.push_back(Last{prefix, &raw, std::move(c)});
    return f;
  }

 protected:
  virtual std::optional<Affine4Choice> exact_choice(const std::string& prefix, const TensorSource& raw) const = 0;
  // exact_choice for exact_parts: the choice exact_format has made for this linear, where it is among the last
  // kLastChoices asked, else made again. Loaders ask exact_format, then exact_parts, linear by linear, or for the
  // linears that read one input (q, k, v; gate, up) all formats first, then all parts (the GPU's load_linears): the
  // check then runs once per linear, and at most three linears' parameters are held between the two.
  std::optional<Affine4Choice> choice_for_parts(const std::string& prefix, const TensorSource& raw) const {
    {
      std::lock_guard<std::mutex> lock(last_mutex_);
      for (auto it = last_.begin(); it != last_.end(); ++it)
        if (it->prefix == prefix && it->raw == &raw) {
          std::optional<Affine4Choice> c = std::move(it->choice);
          last_.erase(it);
          return c;
        }
    }
    return exact_choice(prefix, raw);
  }

 private:
  static constexpr size_t kLastChoices = 3;
  struct Last {
    std::string prefix;
    const TensorSource* raw;
    std::optional<Affine4Choice> choice;
  };
  mutable std::mutex last_mutex_;
  mutable std::deque<Last> last_;
};

// Whether the group indices (g_idx, when stored) are k / group_size for every input k: groups in input order.
bool groups_in_order(const TensorSource& raw, const std::string& g_idx_name, int64_t in, int64_t group_size) {
  if (!raw.contains(g_idx_name)) return true;
  const Tensor t = raw.load(g_idx_name).to_f32();
  if (t.numel() != in) return false;
  for (int64_t k = 0; k < in; ++k)
    if (t.data<float>()[k] != static_cast<float>(k / group_size)) return false;
  return true;
}

// The config's fields, named in errors as "<where>: quantization_config".
io::JsonFields fields_of(const json& q, const std::string& where) { return {where + ": quantization_config", q}; }

int64_t group_size_from(const json& v, const std::string& where) {
  const int64_t g = io::JsonFields{where, v}.get<int64_t>(v, "group_size");
  NIBBLE_CHECK(g == -1 || g > 0, "{}: group_size should be positive or -1 (one group per row), found {}", where, g);
  return g;
}

// ------------------------------------------------------------------ GPTQ
//
// qweight I32 [in·bits/32, out]: input k of output n is field k of column n's
// bit stream (at 3 bits, 32 fields fill 3 words and fields 10 and 21 straddle
// two). qzeros I32 [groups, out·bits/32]: output n's zero is field n of the
// group's row. scales [groups, out]; g_idx I32 [in] (optional).
// w[n, k] = scale[g, n] · (q − z). Checkpoints in the "gptq" (v1) format
// store every zero minus one. At 2, 4 and 8 bits GPTQModel's export subtracts
// it from the packed word as a whole, so the word plus one in every field
// gives z back exactly; at 3 bits it subtracts it from each field modulo 8.
// GPTQModel's planar layout ("gptq_p", 2-8 bits, zeros as they are) keeps
// the same tensors and shapes but stores each run of 32 codes as `bits` words
// of bit planes (planar_field below), so that no code straddles two words.
class GptqScheme final : public Affine4Scheme {
 public:
  GptqScheme(const json& q, const std::string& where) {
    const io::JsonFields f = fields_of(q, where);
    bits_ = f.required<int>("bits");
    group_size_ = q.contains("group_size") ? group_size_from(q["group_size"], f.where) : 128;
    sym_ = f.optional<bool>("sym", true);
    const std::string fmt = f.optional<std::string>("checkpoint_format", f.optional<std::string>("format", "gptq"));
    NIBBLE_CHECK(fmt == "gptq" || fmt == "gptq_v2" || fmt == "gptq_p",
                 "{}: GPTQ checkpoint_format '{}' is not supported (gptq, gptq_v2 and gptq_p are; marlin, bitblas and "
                 "ipex repack the weights)",
                 where, fmt);
    planar_ = fmt == "gptq_p";
    v1_ = fmt == "gptq";
    NIBBLE_CHECK(planar_ ? bits_ >= 2 && bits_ <= 8 : bits_ == 2 || bits_ == 3 || bits_ == 4 || bits_ == 8,
                 "{}: GPTQ at {} bits is not supported ({}; GPTQModel writes 5-7 bits in its planar gptq_p layout)",
                 where, bits_, planar_ ? "2 to 8 are, planar" : "2, 3, 4 and 8 are");
  }
  std::string describe() const override {
    return fmt::format("GPTQ {}-bit {} {} ({}{} zeros)", bits_,
                       group_size_ > 0 ? fmt::format("g{}", group_size_) : "per-channel", sym_ ? "sym" : "asym",
                       planar_ ? "planar layout, " : "", v1_ ? "v1" : "v2");
  }
  std::optional<std::string> linear_of(const std::string& stored, const TensorSource&) const override {
    return strip_suffix(stored, ".qweight");
  }
  std::vector<std::string> parts(const std::string& prefix, const TensorSource& raw) const override {
    std::vector<std::string> p = required_parts(raw, prefix, {".qweight", ".qzeros", ".scales"}, "GPTQ");
    if (raw.contains(prefix + ".g_idx")) p.push_back(prefix + ".g_idx");
    return p;
  }
  Tensor dequantize(const std::string& prefix, const TensorSource& raw) const override {
    const Tensor qw = words_of(raw, prefix + ".qweight", "GPTQ codes");
    const Tensor qz = words_of(raw, prefix + ".qzeros", "GPTQ zeros");
    NIBBLE_CHECK(qw.size(0) * 32 % bits_ == 0 && (!planar_ || qw.size(0) % bits_ == 0),
                 "{}: '{}.qweight' has {} rows, which hold no whole number of {}-bit codes{}", raw.describe(), prefix,
                 qw.size(0), bits_, planar_ ? " in runs of 32 (planar layout)" : "");
    NIBBLE_CHECK(!planar_ || qz.size(1) % bits_ == 0,
                 "{}: '{}.qzeros' has {} columns, which hold no whole number of {}-bit zeros in runs of 32 (planar "
                 "layout)",
                 raw.describe(), prefix, qz.size(1), bits_);
    const int64_t in = qw.size(0) * 32 / bits_, out = qw.size(1);
    const int64_t gs = group_size_ > 0 ? group_size_ : in;
    const int64_t n_groups = qz.size(0);
    NIBBLE_CHECK(qz.size(1) * 32 == out * bits_, "{}: '{}.qzeros' should have {} columns for {} outputs, found {}",
                 raw.describe(), prefix, out * bits_ / 32.0, out, qz.size(1));
    const Tensor s = floats_of(raw, prefix + ".scales", {n_groups, out});
    const std::vector<int32_t> g = groups_of(raw, prefix + ".g_idx", in, gs, n_groups);
    const uint32_t* q = static_cast<const uint32_t*>(qw.raw());
    const std::vector<float> zero = zeros_of(qz, out);
    Tensor w = Tensor::empty(DType::F32, {out, in});
    float* dst = w.data_mut<float>();
    const float* sc = s.data<float>();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < out; ++n) {
      auto word = [&](int64_t i) { return q[i * out + n]; };
      for (int64_t k = 0; k < in; ++k) {
        const int64_t gi = g[k];
        dst[n * in + k] = scaled_offset(sc[gi * out + n], field(word, k), zero[gi * out + n]);
      }
    }
    return w;
  }
  std::vector<Tensor> exact_parts(const std::string& prefix, const TensorSource& raw) const override {
    std::optional<Affine4Choice> c = choice_for_parts(prefix, raw);
    NIBBLE_CHECK(c, "{}: GPTQ linear '{}' has no exact nibble format", raw.describe(), prefix);
    const Tensor qw = words_of(raw, prefix + ".qweight", "GPTQ codes");
    const uint32_t* q = static_cast<const uint32_t*>(qw.raw());
    const int64_t out = c->out;
    return pack_affine4(std::move(*c), [&](int64_t n, int64_t k) {
      return field([&](int64_t i) { return q[i * out + n]; }, k);
    });
  }

 private:
  // exact_format's answer and the parameters it read: 4-bit codes, groups in
  // input order, each group's weights scaled_offset(s, q, z) as dequantize has them.
  std::optional<Affine4Choice> exact_choice(const std::string& prefix, const TensorSource& raw) const override {
    if (bits_ != 4 || group_size_ <= 0 || !raw.contains(prefix + ".qweight")) return std::nullopt;
    const Shape qs = raw.meta(prefix + ".qweight").shape;
    if (qs.size() != 2) return std::nullopt;
    const int64_t in = qs[0] * 8, out = qs[1], n_groups = ceil_div(in, group_size_);
    const Tensor qz = words_of(raw, prefix + ".qzeros", "GPTQ zeros");
    if (qz.size(0) != n_groups || qz.size(1) * 8 != out) return std::nullopt;
    if (!groups_in_order(raw, prefix + ".g_idx", in, group_size_)) return std::nullopt;
    const std::vector<float> zero = zeros_of(qz, out);
    const Tensor s = floats_of(raw, prefix + ".scales", {n_groups, out});
    const float* sc = s.data<float>();
    return affine4_choice(out, in, group_size_, [&](int64_t n, int64_t g) {
      Affine4Group a;
      a.scale = sc[g * out + n];
      for (uint32_t q = 0; q < 16; ++q) a.value[q] = scaled_offset(a.scale, q, zero[g * out + n]);
      return a;
    });
  }

  // zeros[g, n] of qzeros [groups, out·bits/32]: v1 zeros are the word plus
  // one in every field (2, 4, 8 bits), or each field plus one (3 bits).
  std::vector<float> zeros_of(const Tensor& qz, int64_t out) const {
    const uint32_t* z = static_cast<const uint32_t*>(qz.raw());
    const bool whole_words = 32 % bits_ == 0;
    uint32_t ones = 0;
    if (v1_ && whole_words)
      for (int f = 0; f < 32 / bits_; ++f) ones |= 1u << (f * bits_);
    const uint32_t field_plus = v1_ && !whole_words ? 1 : 0, mask = (1u << bits_) - 1;
    const int64_t n_groups = qz.size(0);
    std::vector<float> zero(static_cast<size_t>(n_groups * out));
    for (int64_t r = 0; r < n_groups; ++r) {
      auto word = [&](int64_t w) { return z[r * qz.size(1) + w] + ones; };
      for (int64_t n = 0; n < out; ++n)
        zero[r * out + n] = static_cast<float>((field(word, n) + field_plus) & mask);
    }
    return zero;
  }

  // Field `index` of a packed run: the continuous bit stream, or the planar layout.
  template <class WordFn>
  uint32_t field(const WordFn& word, int64_t index) const {
    return planar_ ? planar_field(word, index, bits_) : stream_field(word, index, bits_);
  }

  // GPTQModel's planar packing: each run of 32 codes fills `bits` words, its
  // planes one after the other, low plane first. A plane of width w (taking
  // bits o .. o+w-1 of each code) is w words; word i of it holds codes
  // i·(32/w) .. (i+1)·(32/w) − 1 of the run, code j of those at bit j·w.
  template <class WordFn>
  static uint32_t planar_field(const WordFn& word, int64_t index, int bits) {
    struct Plane {
      int width, offset;
    };
    static constexpr Plane kPlanes[9][3] = {{},
                                            {},
                                            {{2, 0}},
                                            {{2, 0}, {1, 2}},
                                            {{4, 0}},
                                            {{4, 0}, {1, 4}},
                                            {{4, 0}, {2, 4}},
                                            {{4, 0}, {2, 4}, {1, 6}},
                                            {{8, 0}}};
    const int64_t t = index % 32;
    int64_t row = index / 32 * bits;
    uint32_t v = 0;
    for (const Plane& p : kPlanes[bits]) {
      if (p.width == 0) break;
      const int64_t per_word = 32 / p.width;
      const uint32_t w = word(row + t / per_word) >> (t % per_word * p.width);
      v |= (w & ((1u << p.width) - 1)) << p.offset;
      row += p.width;
    }
    return v;
  }

  int bits_ = 4;
  int64_t group_size_ = 128;
  bool sym_ = true, v1_ = true, planar_ = false;
};

// ------------------------------------------------------------------- AWQ
//
// AutoAWQ's GEMM layout: qweight I32 [in, out/8], qzeros I32 [groups, out/8],
// scales [groups, out]. Word j of a row holds outputs 8j..8j+7, output 8j+i
// in nibble kInterleave[i] (the order AutoAWQ packs them in, 0 2 4 6 1 3 5 7
// by nibble). w[n, k] = scale[g, n] · (q − z), g = k / group_size.
// Its GEMV layout ("version": "gemv"): qweight I32 [out, in/8], input k of
// row n in nibble k % 8 of word k / 8; qzeros I32 [out, ≥ groups/8] the same
// way over the groups; scales [out, ≥ groups] (both padded to AutoAWQ's
// calculate_zeros_width); w[n, k] = scale[n, g] · (q − z).
// Its GEMV-fast layout ("version": "gemv_fast"): qweight I16 [out/4, in], the
// codes of rows 4m..4m+3 over inputs in blocks of 64; scales and qzeros fp16
// [≥ groups, out], the zeros stored as −scale · zero; w[n, k] = code · scale +
// zero (dequantize_gemv_fast gives the code order).
class AwqScheme final : public Affine4Scheme {
 public:
  AwqScheme(const json& q, const std::string& where) {
    const io::JsonFields f = fields_of(q, where);
    const int bits = f.optional<int>("bits", f.optional<int>("w_bit", 4));
    NIBBLE_CHECK(bits == 4, "{}: AWQ at {} bits is not supported (4 is)", where, bits);
    const json& gs = q.contains("group_size")     ? q["group_size"]
                     : q.contains("q_group_size") ? q["q_group_size"]
                                                  : json(128);
    group_size_ = group_size_from(gs, f.where);
    NIBBLE_CHECK(f.optional<bool>("zero_point", true), "{}: AWQ without zero points is not supported", where);
    std::string version = f.optional<std::string>("version", "gemm");
    for (char& c : version) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    NIBBLE_CHECK(version == "gemm" || version == "gemv" || version == "gemv_fast",
                 "{}: AWQ version '{}' is not supported (gemm, gemv and gemv_fast are; marlin and exllama lay the "
                 "codes out differently)",
                 where, version);
    layout_ = version == "gemv" ? Layout::Gemv : version == "gemv_fast" ? Layout::GemvFast : Layout::Gemm;
  }
  std::string describe() const override {
    return fmt::format("AWQ 4-bit {} ({} layout)", group_size_ > 0 ? fmt::format("g{}", group_size_) : "per-channel",
                       layout_ == Layout::Gemv ? "GEMV" : layout_ == Layout::GemvFast ? "GEMV-fast" : "GEMM");
  }
  std::optional<std::string> linear_of(const std::string& stored, const TensorSource&) const override {
    return strip_suffix(stored, ".qweight");
  }
  std::vector<std::string> parts(const std::string& prefix, const TensorSource& raw) const override {
    return required_parts(raw, prefix, {".qweight", ".qzeros", ".scales"}, "AWQ");
  }
  Tensor dequantize(const std::string& prefix, const TensorSource& raw) const override {
    const Tensor qw = codes_of(prefix, raw);
    const Stored st = stored(prefix, raw, qw.shape());
    const Codes code = codes_view(qw);
    Tensor w = Tensor::empty(DType::F32, {st.out, st.in});
    float* dst = w.data_mut<float>();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < st.out; ++n)
      for (int64_t g = 0; g * st.gs < st.in; ++g) {
        const std::pair<float, float> p = st.params(n, g);
        const int64_t end = std::min(st.in, (g + 1) * st.gs);
        for (int64_t k = g * st.gs; k < end; ++k) dst[n * st.in + k] = value(p, code(n, k));
      }
    return w;
  }
  std::vector<Tensor> exact_parts(const std::string& prefix, const TensorSource& raw) const override {
    std::optional<Affine4Choice> c = choice_for_parts(prefix, raw);
    NIBBLE_CHECK(c, "{}: AWQ linear '{}' has no exact nibble format", raw.describe(), prefix);
    const Tensor qw = codes_of(prefix, raw);
    const Codes code = codes_view(qw);
    return pack_affine4(std::move(*c), code);
  }

 private:
  enum class Layout { Gemm, Gemv, GemvFast };
  static constexpr int kInterleave[8] = {0, 4, 1, 5, 2, 6, 3, 7};  // GEMM: the nibble holding output 8j+i

  Tensor codes_of(const std::string& prefix, const TensorSource& raw) const {
    const Tensor qw = layout_ == Layout::GemvFast
                          ? words_of(raw, prefix + ".qweight", "AWQ codes (GEMV-fast layout)", DType::I16)
                          : words_of(raw, prefix + ".qweight", "AWQ codes");
    NIBBLE_CHECK(qw.numel() > 0, "{}: '{}.qweight' {} holds no weights", raw.describe(), prefix,
                 shape_str(qw.shape()));
    return qw;
  }

  // The code of output n's input k in qweight (contiguous).
  struct Codes {
    Layout layout;
    const void* words;
    int64_t row;  // words per row of qweight
    uint32_t operator()(int64_t n, int64_t k) const {
      if (layout == Layout::Gemm)
        return (static_cast<const uint32_t*>(words)[k * row + n / 8] >> (4 * kInterleave[n % 8])) & 15u;
      if (layout == Layout::Gemv) return (static_cast<const uint32_t*>(words)[n * row + k / 8] >> (4 * (k % 8))) & 15u;
      // AutoAWQ's pack_intweight for the GEMV-fast kernel, undone. Within each
      // block of 32 inputs the codes are permuted: input 8u + 2h + v (u, h < 4,
      // v < 2) goes to position 8h + 4v + u. Then rows 4m..4m+3 are interleaved
      // per block of 64 positions: position t of row 4m + r becomes nibble f % 4
      // of I16 word f / 4 of the block in row m of qweight, f = 64r + t.
      const int64_t i = k % 32, u = i / 8, h = i % 8 / 2, v = i % 2;
      const int64_t pos = k - i + 8 * h + 4 * v + u;  // the code's position in row n after the permutation
      const int64_t f = n % 4 * 64 + pos % 64;
      return (static_cast<const uint16_t*>(words)[n / 4 * row + pos - pos % 64 + f / 4] >> (4 * (f % 4))) & 15u;
    }
  };
  Codes codes_view(const Tensor& qw) const { return {layout_, qw.raw(), qw.size(1)}; }

  // A linear's zeros and scales, checked against its codes' shape `qs`: each
  // group's scale and its zero z (GEMM, GEMV) or min m (GEMV-fast).
  struct Stored {
    Layout layout = Layout::Gemm;
    int64_t out = 0, in = 0, gs = 0;
    Tensor zeros, scales;  // GEMM and GEMV zeros as packed I32 words, GEMV-fast's mins as F32
    const float* sc = nullptr;
    const void* z = nullptr;
    int64_t srow = 0, zrow = 0;  // scales and zeros per row
    std::pair<float, float> params(int64_t n, int64_t g) const {
      if (layout == Layout::GemvFast) return {sc[g * out + n], static_cast<const float*>(z)[g * out + n]};
      const uint32_t* w = static_cast<const uint32_t*>(z);
      if (layout == Layout::Gemm)
        return {sc[g * out + n], static_cast<float>((w[g * zrow + n / 8] >> (4 * kInterleave[n % 8])) & 15u)};
      return {sc[n * srow + g], static_cast<float>((w[n * zrow + g / 8] >> (4 * (g % 8))) & 15u)};
    }
  };
  Stored stored(const std::string& prefix, const TensorSource& raw, const Shape& qs) const {
    Stored st;
    st.layout = layout_;
    if (layout_ == Layout::Gemm) {
      st.in = qs[0], st.out = qs[1] * 8;
      st.gs = group_size_ > 0 ? group_size_ : st.in;
      st.zeros = words_of(raw, prefix + ".qzeros", "AWQ zeros");
      const int64_t n_groups = st.zeros.size(0);
      NIBBLE_CHECK(st.zeros.size(1) == qs[1] && n_groups == ceil_div(st.in, st.gs),
                   "{}: '{}.qzeros' should be [{}, {}] for {} inputs in groups of {}, found {}", raw.describe(), prefix,
                   ceil_div(st.in, st.gs), qs[1], st.in, st.gs, shape_str(st.zeros.shape()));
      st.scales = floats_of(raw, prefix + ".scales", {n_groups, st.out});
    } else if (layout_ == Layout::Gemv) {
      st.out = qs[0], st.in = qs[1] * 8;
      st.gs = group_size_ > 0 ? group_size_ : st.in;
      NIBBLE_CHECK(st.in % st.gs == 0, "{}: '{}.qweight' holds {} inputs, not a whole number of groups of {}",
                   raw.describe(), prefix, st.in, st.gs);
      const int64_t n_groups = st.in / st.gs;
      st.zeros = words_of(raw, prefix + ".qzeros", "AWQ zeros");
      NIBBLE_CHECK(st.zeros.size(0) == st.out && st.zeros.size(1) * 8 >= n_groups,
                   "{}: '{}.qzeros' should be [{}, at least {}] for {} groups (GEMV layout), found {}", raw.describe(),
                   prefix, st.out, ceil_div(n_groups, int64_t{8}), n_groups, shape_str(st.zeros.shape()));
      st.scales = floats_of(raw, prefix + ".scales", {});
      NIBBLE_CHECK(st.scales.dim() == 2 && st.scales.size(0) == st.out && st.scales.size(1) >= n_groups,
                   "{}: '{}.scales' should be [{}, at least {}] (GEMV layout), found {}", raw.describe(), prefix,
                   st.out, n_groups, shape_str(st.scales.shape()));
    } else {
      st.out = qs[0] * 4, st.in = qs[1];
      st.gs = group_size_ > 0 ? group_size_ : st.in;
      NIBBLE_CHECK(st.in % 64 == 0 && st.in % st.gs == 0,
                   "{}: '{}.qweight' holds {} inputs, not a whole number of blocks of 64 and of groups of {} "
                   "(GEMV-fast layout)",
                   raw.describe(), prefix, st.in, st.gs);
      const int64_t n_groups = st.in / st.gs;
      st.scales = floats_of(raw, prefix + ".scales", {});
      st.zeros = floats_of(raw, prefix + ".qzeros", {});
      for (const auto& [t, part] :
           {std::pair<const Tensor&, const char*>{st.scales, "scales"}, {st.zeros, "qzeros"}})
        NIBBLE_CHECK(t.dim() == 2 && t.size(0) >= n_groups && t.size(1) == st.out,
                     "{}: '{}.{}' should be [at least {}, {}] (GEMV-fast layout), found {}", raw.describe(), prefix,
                     part, n_groups, st.out, shape_str(t.shape()));
    }
    st.sc = st.scales.data<float>();
    st.z = st.zeros.raw();
    st.srow = st.scales.size(1);
    st.zrow = st.zeros.size(1);
    return st;
  }

  // The weight of code q in a group with parameters p, as AutoAWQ computes it: s·(q − z), or q·s + m (GEMV-fast).
  float value(std::pair<float, float> p, uint32_t q) const {
    if (layout_ == Layout::GemvFast) return static_cast<float>(q) * p.first + p.second;
    return scaled_offset(p.first, q, p.second);
  }

  // exact_format's answer and the parameters it read (qweight's shape, not its codes).
  std::optional<Affine4Choice> exact_choice(const std::string& prefix, const TensorSource& raw) const override {
    if (group_size_ <= 0 || !raw.contains(prefix + ".qweight")) return std::nullopt;
    const TensorMeta m = raw.meta(prefix + ".qweight");
    if (m.dtype != (layout_ == Layout::GemvFast ? DType::I16 : DType::I32) || m.shape.size() != 2 ||
        shape_numel(m.shape) == 0)
      return std::nullopt;
    const Stored st = stored(prefix, raw, m.shape);
    return affine4_choice(st.out, st.in, st.gs, [&](int64_t n, int64_t g) {
      const std::pair<float, float> p = st.params(n, g);
      Affine4Group a;
      a.scale = p.first;
      for (uint32_t q = 0; q < 16; ++q) a.value[q] = value(p, q);
      return a;
    });
  }

  int64_t group_size_ = 128;
  Layout layout_ = Layout::Gemm;
};

// ---------------------------------------------------- compressed-tensors
//
// Read from the stored tensors of each linear (a checkpoint may mix formats
// across config groups):
//   weight_packed I32 [out, ⌈in·bits/32⌉] + weight_shape: integers, a bit
//     stream per row holding q + 2^(bits−1); weight_zero_point (asymmetric)
//     I32 packed the same way down each column [⌈out·bits/32⌉, groups], or
//     unpacked [out, groups]; bits follow from the packed width.
//   weight_packed U8 [out, in/2] + weight_global_scale: NVFP4, e2m1 codes
//     (element 2j in the low nibble), FP8 E4M3 scales per 16 inputs, and
//     w = code · scale / global_scale.
//   weight_packed U8 without a global scale: MXFP4, E8M0 scales per 32.
//   weight I8 / F8_E4M3 [out, in] + weight_scale: int-quantized / float-quantized.
//   compressed + bitmask + shape (sparsity_config's sparse-bitmask and
//     sparse-24-bitmask): the weight's nonzero entries alone, dense_of_sparse
//     says how; they are the plain weights, or with weight_scale the
//     int-quantized / float-quantized codes.
// Integer and FP8 weights: w = (q − zero) · scale[group of the input] with
// scales [out, groups] (group or channel), [1] (tensor) or, for block
// quantization, [⌈out/bo⌉, ⌈in/bi⌉] (block_structure of the config group
// whose targets match the linear, else the block implied by the shapes).
class CompressedTensorsScheme final : public Affine4Scheme {
 public:
  CompressedTensorsScheme(const json& q, const std::string& where) {
    const io::JsonFields f = fields_of(q, where);
    format_ = f.optional<std::string>("format", "dense");
    if (q.contains("sparsity_config") && q["sparsity_config"].is_object() && !q["sparsity_config"].empty()) {
      const io::JsonFields sf = fields_of(q["sparsity_config"], f.where + ": sparsity_config");
      sparsity_ = sf.optional<std::string>("format", "dense");
      NIBBLE_CHECK(sparsity_ == "dense" || sparsity_ == "sparse-bitmask" || sparsity_ == "sparse-24-bitmask",
                   "{}: compressed-tensors sparsity format '{}' is not supported (sparse-bitmask and "
                   "sparse-24-bitmask are)",
                   where, sparsity_);
    }
    // The "dense" quantization format with a sparse format: a pruned checkpoint of plain weights.
    if (format_ == "dense" && sparsity_ != "dense") return;
    static const std::vector<std::string> known = {
        "pack-quantized",       "int-quantized",        "float-quantized", "naive-quantized", "nvfp4-pack-quantized",
        "mxfp4-pack-quantized", "mxfp6-pack-quantized", "mxfp8-quantized", "mixed-precision"};
    NIBBLE_CHECK(std::find(known.begin(), known.end(), format_) != known.end(),
                 "{}: compressed-tensors format '{}' is not supported (pack-quantized, int-quantized, "
                 "float-quantized, naive-quantized, nvfp4-pack-quantized, mxfp4-pack-quantized, mxfp6-pack-quantized, "
                 "mxfp8-quantized and mixed-precision are)",
                 where, format_);
    if (q.contains("config_groups") && q["config_groups"].is_object())
      for (const auto& [name, group] : q["config_groups"].items()) {
        if (!group.is_object()) continue;
        const std::string gwhere = fmt::format("{}: config group '{}'", f.where, name);
        Group g;
        if (group.contains("targets") && group["targets"].is_array())
          for (const json& t : group["targets"]) {
            NIBBLE_CHECK(t.is_string(), "{}: targets should be strings, found {}", gwhere, t.dump());
            const std::string target = t.get<std::string>();
            if (target.rfind("re:", 0) == 0)  // Python's re.match: anchored at the name's start only
              g.regexes.push_back(std::make_shared<const Regex>("\\A(?:" + target.substr(3) + ")", gwhere));
            else
              g.names.push_back(target);
          }
        if (group.contains("weights") && group["weights"].is_object()) {
          const json& wa = group["weights"];
          if (wa.contains("num_bits") && wa["num_bits"].is_number_integer()) g.num_bits = wa["num_bits"].get<int>();
          if (wa.contains("block_structure") && wa["block_structure"].is_array() && wa["block_structure"].size() == 2) {
            const json& b = wa["block_structure"];
            g.block = {f.get<int64_t>(b[0], "block_structure"), f.get<int64_t>(b[1], "block_structure")};
            NIBBLE_CHECK(g.block->first > 0 && g.block->second > 0,
                         "{}: block_structure should be two positive sizes, found {}", gwhere, b.dump());
          }
        }
        groups_.push_back(std::move(g));
      }
  }
  std::string describe() const override {
    return "compressed-tensors (" +
           (sparsity_ == "dense" ? format_ : format_ == "dense" ? sparsity_ : format_ + ", " + sparsity_) + ")";
  }
  std::optional<std::string> linear_of(const std::string& stored, const TensorSource& raw) const override {
    if (auto prefix = strip_suffix(stored, ".weight_packed")) return prefix;
    if (auto prefix = strip_suffix(stored, ".compressed")) return prefix;
    if (auto prefix = strip_suffix(stored, ".weight")) {
      const DType dt = raw.meta(stored).dtype;
      if ((dt == DType::I8 || dt == DType::F8_E4M3) && raw.contains(*prefix + ".weight_scale")) return prefix;
    }
    return std::nullopt;
  }
  std::vector<std::string> parts(const std::string& prefix, const TensorSource& raw) const override {
    std::vector<std::string> p;
    for (const char* s : {".weight_packed", ".weight", ".weight_shape", ".weight_scale", ".weight_zero_point",
                          ".weight_global_scale", ".weight_g_idx", ".compressed", ".bitmask", ".shape", ".row_offsets"})
      if (raw.contains(prefix + s)) p.push_back(prefix + s);
    return p;
  }
  Tensor dequantize(const std::string& prefix, const TensorSource& raw) const override {
    if (raw.contains(prefix + ".weight_packed") && raw.meta(prefix + ".weight_packed").dtype == DType::U8) {
      const Group* group = group_of(prefix, raw);
      const bool six = group ? group->num_bits == 6 : format_ == "mxfp6-pack-quantized";
      return six ? fp6(prefix, raw) : fp4(prefix, raw);
    }
    Tensor codes;  // F32 [out, in]: the integer or FP8 values
    int bits = 8;
    if (raw.contains(prefix + ".weight_packed")) {
      const Tensor packed = words_of(raw, prefix + ".weight_packed", "compressed-tensors codes");
      const Tensor shape_t = raw.load(prefix + ".weight_shape").to_f32();
      NIBBLE_CHECK(shape_t.numel() == 2, "{}: '{}.weight_shape' should hold [out, in]", raw.describe(), prefix);
      // At least one bit per input: at most 32 inputs per word.
      const float* dims = shape_t.data<float>();
      NIBBLE_CHECK(dims[0] == static_cast<float>(packed.size(0)) && dims[1] >= 1 &&
                       dims[1] <= 32.0f * static_cast<float>(packed.size(1)) && dims[1] == std::floor(dims[1]),
                   "{}: '{}.weight_shape' [{}, {}] does not match the packed words {}", raw.describe(), prefix, dims[0],
                   dims[1], shape_str(packed.shape()));
      const int64_t out = packed.size(0), in = static_cast<int64_t>(dims[1]);
      bits = 0;
      for (int b = 1; b <= 8 && !bits; ++b)
        if ((in * b + 31) / 32 == packed.size(1)) bits = b;
      NIBBLE_CHECK(bits, "{}: '{}.weight_packed' has {} words per row, which fits no width of 1-8 bits for {} inputs",
                   raw.describe(), prefix, packed.size(1), in);
      codes = Tensor::empty(DType::F32, {out, in});
      const uint32_t* p = static_cast<const uint32_t*>(packed.raw());
      float* c = codes.data_mut<float>();
      const int64_t wpr = packed.size(1);
      const float offset = static_cast<float>(1 << (bits - 1));
#pragma omp parallel for schedule(static)
      for (int64_t n = 0; n < out; ++n) {
        auto word = [&](int64_t i) { return p[n * wpr + i]; };
        for (int64_t k = 0; k < in; ++k) c[n * in + k] = static_cast<float>(stream_field(word, k, bits)) - offset;
      }
    } else if (raw.contains(prefix + ".compressed")) {
      codes = dense_of_sparse(prefix, raw);
      if (!raw.contains(prefix + ".weight_scale")) return codes;  // sparse plain weights
    } else {
      codes = raw.load(prefix + ".weight").to_f32();
      NIBBLE_CHECK(codes.dim() == 2, "{}: '{}.weight' should be 2-D", raw.describe(), prefix);
    }
    const int64_t out = codes.size(0), in = codes.size(1);
    // Scales as stored, or MXFP8's E8M0 exponents (U8).
    const Tensor scale = raw.contains(prefix + ".weight_scale") && raw.meta(prefix + ".weight_scale").dtype == DType::U8
                             ? e8m0_scales(raw.load(prefix + ".weight_scale"))
                             : floats_of(raw, prefix + ".weight_scale", {});
    // Scales: one (tensor), [out] or [out, groups] (channel, group), or
    // [row blocks, column blocks] (block).
    int64_t srows = 1, scols = 1;
    if (scale.dim() == 2) {
      srows = scale.size(0), scols = scale.size(1);
    } else {
      NIBBLE_CHECK(scale.numel() == 1 || scale.numel() == out,
                   "{}: '{}.weight_scale' has shape {}, which fits no strategy for a [{}, {}] weight", raw.describe(),
                   prefix, shape_str(scale.shape()), out, in);
      srows = scale.numel();
    }
    const bool blocks = srows != out && srows != 1;
    const Group* group = group_of(prefix, raw);
    const std::pair<int64_t, int64_t>* block = group && group->block ? &*group->block : nullptr;
    const int64_t row_block = srows == out ? 1 : srows == 1 ? out : block ? block->first : (out + srows - 1) / srows;
    NIBBLE_CHECK((out + row_block - 1) / row_block == srows, "{}: '{}.weight_scale' has {} rows for {} outputs",
                 raw.describe(), prefix, srows, out);
    const int64_t gs = blocks && block ? block->second : (in + scols - 1) / scols;
    NIBBLE_CHECK((in + gs - 1) / gs == scols, "{}: '{}.weight_scale' has {} columns, which fits no group size for {} "
                 "inputs", raw.describe(), prefix, scols, in);
    const std::vector<int32_t> g = groups_of(raw, prefix + ".weight_g_idx", in, gs, scols);
    std::vector<float> zero;  // [srows, scols] when asymmetric
    if (raw.contains(prefix + ".weight_zero_point"))
      zero = zero_points(raw, prefix, raw.contains(prefix + ".weight_packed") ? bits : 0, srows, scols);
    const float* c = codes.data<float>();
    const float* s = scale.data<float>();
    Tensor w = Tensor::empty(DType::F32, {out, in});
    float* dst = w.data_mut<float>();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < out; ++n) {
      const int64_t r = n / row_block;
      for (int64_t k = 0; k < in; ++k) {
        const int64_t i = r * scols + g[k];
        dst[n * in + k] = int_value(c[n * in + k], zero.empty() ? 0.0f : zero[i], s[i]);
      }
    }
    return w;
  }
  // pack-quantized 4-bit codes (the field is q + 8), zero points or none, scales [out, groups].
  std::vector<Tensor> exact_parts(const std::string& prefix, const TensorSource& raw) const override {
    std::optional<Affine4Choice> c = choice_for_parts(prefix, raw);
    NIBBLE_CHECK(c, "{}: compressed-tensors linear '{}' has no exact nibble format", raw.describe(), prefix);
    const Tensor packed = words_of(raw, prefix + ".weight_packed", "compressed-tensors codes");
    const int64_t wpr = packed.size(1);
    const uint32_t* p = static_cast<const uint32_t*>(packed.raw());
    return pack_affine4(std::move(*c), [&](int64_t n, int64_t k) {
      return stream_field([&](int64_t i) { return p[n * wpr + i]; }, k, 4);
    });
  }

 private:
  // An integer weight: (c − zero) · scale in f32, c the code less 2^(bits−1) (compressed-tensors' dequantize).
  static float int_value(float c, float zero, float scale) { return (c - zero) * scale; }

  // exact_format's answer and the parameters it read.
  std::optional<Affine4Choice> exact_choice(const std::string& prefix, const TensorSource& raw) const override {
    const std::string packed = prefix + ".weight_packed";
    if (!raw.contains(packed) || raw.meta(packed).dtype != DType::I32 || raw.contains(prefix + ".compressed") ||
        !raw.contains(prefix + ".weight_shape") || !raw.contains(prefix + ".weight_scale") ||
        raw.meta(prefix + ".weight_scale").dtype == DType::U8)
      return std::nullopt;
    const Shape ps = raw.meta(packed).shape;
    const Tensor shape_t = raw.load(prefix + ".weight_shape").to_f32();
    if (ps.size() != 2 || shape_t.numel() != 2 || shape_t.data<float>()[0] != static_cast<float>(ps[0]))
      return std::nullopt;
    const float dim_in = shape_t.data<float>()[1];  // as dequantize checks it
    if (!(dim_in >= 1.0f && dim_in <= 32.0f * static_cast<float>(ps[1]) && dim_in == std::floor(dim_in)))
      return std::nullopt;
    const int64_t out = ps[0], in = static_cast<int64_t>(dim_in);
    int bits = 0;  // as dequantize finds it: the narrowest width that fills the packed words
    for (int b = 1; b <= 8 && !bits; ++b)
      if ((in * b + 31) / 32 == ps[1]) bits = b;
    if (bits != 4) return std::nullopt;
    const Tensor scale = floats_of(raw, prefix + ".weight_scale", {});
    const int64_t scols = scale.dim() == 2 ? scale.size(1) : 1;
    if (scale.numel() != out * scols) return std::nullopt;
    const int64_t gs = (in + scols - 1) / scols;
    if ((in + gs - 1) / gs != scols || !groups_in_order(raw, prefix + ".weight_g_idx", in, gs)) return std::nullopt;
    std::vector<float> zero;
    if (raw.contains(prefix + ".weight_zero_point")) zero = zero_points(raw, prefix, bits, out, scols);
    const float* s = scale.data<float>();
    return affine4_choice(out, in, gs, [&](int64_t n, int64_t g) {
      const int64_t i = n * scols + g;
      Affine4Group a;
      a.scale = s[i];
      for (uint32_t q = 0; q < 16; ++q)
        a.value[q] = int_value(static_cast<float>(q) - 8.0f, zero.empty() ? 0.0f : zero[i], s[i]);
      return a;
    });
  }

  // weight_zero_point as F32 [rows, cols]: with `packed_bits` (pack-quantized
  // weights) I32 bit streams of that width down each column, else plain integers.
  static std::vector<float> zero_points(const TensorSource& raw, const std::string& prefix, int packed_bits,
                                        int64_t rows, int64_t cols) {
    const std::string name = prefix + ".weight_zero_point";
    const Tensor t = raw.load(name);
    std::vector<float> z(static_cast<size_t>(rows * cols));
    const int bits = packed_bits;
    if (bits > 0 && t.dtype() == DType::I32 && t.dim() == 2 && t.size(0) == (rows * bits + 31) / 32 &&
        t.size(1) == cols) {
      const Tensor words = t.is_contiguous() ? t : t.contiguous();
      const uint32_t* p = static_cast<const uint32_t*>(words.raw());
      const float offset = static_cast<float>(1 << (bits - 1));
      for (int64_t c = 0; c < cols; ++c) {
        auto word = [&](int64_t i) { return p[i * cols + c]; };
        for (int64_t r = 0; r < rows; ++r) z[r * cols + c] = static_cast<float>(stream_field(word, r, bits)) - offset;
      }
      return z;
    }
    NIBBLE_CHECK(t.numel() == rows * cols, "{}: '{}' has shape {}, expected {} values ([{}, {}])", raw.describe(),
                 name, shape_str(t.shape()), rows * cols, rows, cols);
    const Tensor f = t.to_f32();
    std::copy(f.data<float>(), f.data<float>() + rows * cols, z.begin());
    return z;
  }

  // E8M0 exponents (U8) as F32 scales 2^(b − 127), in the stored shape: the
  // shared scales of MXFP4, MXFP6 and MXFP8.
  static Tensor e8m0_scales(const Tensor& bytes) {
    const Tensor t = bytes.contiguous();
    Tensor f = Tensor::empty(DType::F32, t.shape());
    const uint8_t* b = static_cast<const uint8_t*>(t.raw());
    for (int64_t i = 0; i < t.numel(); ++i) f.data_mut<float>()[i] = e8m0_to_f32(b[i]);
    return f;
  }

  // MXFP6 (E2M3): four 6-bit codes in three bytes, little-endian (code i of a
  // 24-bit word in bits 6i..6i+5), E8M0 scales per 32 inputs.
  static Tensor fp6(const std::string& prefix, const TensorSource& raw) {
    const Tensor packed = raw.load(prefix + ".weight_packed");
    NIBBLE_CHECK(packed.dim() == 2 && packed.size(1) % 3 == 0,
                 "{}: '{}.weight_packed' should be 2-D with a multiple of 3 bytes a row (four FP6 codes in three), "
                 "found {}",
                 raw.describe(), prefix, shape_str(packed.shape()));
    const int64_t out = packed.size(0), in = packed.size(1) / 3 * 4, blocks = (in + 31) / 32;
    const Tensor scale_t = raw.load(prefix + ".weight_scale");
    NIBBLE_CHECK(scale_t.dtype() == DType::U8 && scale_t.numel() == out * blocks,
                 "{}: MXFP6 scales '{}.weight_scale' should be U8 (E8M0), one per 32 inputs of each row ({}), found "
                 "{} {}",
                 raw.describe(), prefix, out * blocks, dtype_name(scale_t.dtype()), shape_str(scale_t.shape()));
    const Tensor sc = e8m0_scales(scale_t);
    const Tensor pc = packed.is_contiguous() ? packed : packed.contiguous();
    const uint8_t* p = static_cast<const uint8_t*>(pc.raw());
    const float* s = sc.data<float>();
    Tensor w = Tensor::empty(DType::F32, {out, in});
    float* dst = w.data_mut<float>();
    const int64_t row_bytes = packed.size(1);
    for (int64_t n = 0; n < out; ++n)
      for (int64_t j = 0; j < in / 4; ++j) {
        const uint8_t* b = p + n * row_bytes + 3 * j;
        const uint32_t word = b[0] | (static_cast<uint32_t>(b[1]) << 8) | (static_cast<uint32_t>(b[2]) << 16);
        for (int64_t i = 0; i < 4; ++i) {
          const int64_t k = 4 * j + i;
          dst[n * in + k] = e2m3_to_f32(static_cast<uint8_t>(word >> (6 * i))) * s[n * blocks + k / 32];
        }
      }
    return w;
  }

  // NVFP4 (global scale) and MXFP4 (E8M0 scales).
  static Tensor fp4(const std::string& prefix, const TensorSource& raw) {
    const Tensor packed = raw.load(prefix + ".weight_packed");
    NIBBLE_CHECK(packed.dim() == 2, "{}: '{}.weight_packed' should be 2-D", raw.describe(), prefix);
    const int64_t out = packed.size(0), in = packed.size(1) * 2;
    const bool nv = raw.contains(prefix + ".weight_global_scale");
    const int64_t block = nv ? 16 : 32;
    const Tensor scale_t = raw.load(prefix + ".weight_scale");
    NIBBLE_CHECK(scale_t.numel() == out * ((in + block - 1) / block),
                 "{}: '{}.weight_scale' should hold {} scales (one per {} inputs of each row), found {}",
                 raw.describe(), prefix, out * ((in + block - 1) / block), block, shape_str(scale_t.shape()));
    std::vector<float> scale(static_cast<size_t>(scale_t.numel()));
    if (nv) {
      const Tensor f = scale_t.to_f32();
      const float global = raw.load(prefix + ".weight_global_scale").to_f32().data<float>()[0];
      for (size_t i = 0; i < scale.size(); ++i) scale[i] = f.data<float>()[i] / global;
    } else {
      NIBBLE_CHECK(scale_t.dtype() == DType::U8, "{}: MXFP4 scales '{}.weight_scale' should be U8 (E8M0), found {}",
                   raw.describe(), prefix, dtype_name(scale_t.dtype()));
      const Tensor f = e8m0_scales(scale_t);
      std::copy(f.data<float>(), f.data<float>() + f.numel(), scale.begin());
    }
    const Tensor pc = packed.is_contiguous() ? packed : packed.contiguous();
    const uint8_t* p = static_cast<const uint8_t*>(pc.raw());
    const int64_t blocks = (in + block - 1) / block;
    Tensor w = Tensor::empty(DType::F32, {out, in});
    float* dst = w.data_mut<float>();
    for (int64_t n = 0; n < out; ++n)
      for (int64_t k = 0; k < in; ++k) {
        const uint8_t b = p[n * (in / 2) + k / 2];
        dst[n * in + k] = e2m1_to_f32(k % 2 ? b >> 4 : b & 15) * scale[n * blocks + k / block];
      }
    return w;
  }

  // A weight stored sparse (sparse-bitmask, sparse-24-bitmask) as F32
  // [out, in]: `shape` (I64 [2, 1]) gives [out, in]; bit k % 8 of byte k / 8
  // of `bitmask` row n (U8 [out, ⌈in/8⌉], numpy's little-endian packbits) marks
  // entry (n, k) as stored, and `compressed` holds the marked entries in row-major
  // order ([nnz] for sparse-bitmask, [out, in/2] for 2:4), every other entry
  // is zero. sparse-bitmask also stores `row_offsets` [out], each row's first
  // value, checked here. Bits past `in` are padding and ignored, as the library does.
  static Tensor dense_of_sparse(const std::string& prefix, const TensorSource& raw) {
    NIBBLE_CHECK(!raw.contains(prefix + ".weight_packed") && !raw.contains(prefix + ".weight"),
                 "{}: linear '{}' is stored both sparse ('{}.compressed') and dense", raw.describe(), prefix, prefix);
    required_parts(raw, prefix, {".bitmask", ".shape"}, "sparse");
    const Tensor shape_t = raw.load(prefix + ".shape").to_f32();
    NIBBLE_CHECK(shape_t.numel() == 2, "{}: '{}.shape' should hold [out, in], found shape {}", raw.describe(), prefix,
                 shape_str(shape_t.shape()));
    const float* dims = shape_t.data<float>();
    const Tensor mask = raw.load(prefix + ".bitmask").contiguous();
    NIBBLE_CHECK(mask.dtype() == DType::U8 && mask.dim() == 2 && dims[1] >= 1 && dims[1] == std::floor(dims[1]) &&
                     dims[0] == static_cast<float>(mask.size(0)) &&
                     std::ceil(dims[1] / 8.0f) == static_cast<float>(mask.size(1)),
                 "{}: '{}.bitmask' should be U8 [out, ⌈in / 8⌉] for the shape [{}, {}], found {} {}", raw.describe(),
                 prefix, dims[0], dims[1], dtype_name(mask.dtype()), shape_str(mask.shape()));
    const int64_t out = mask.size(0), in = static_cast<int64_t>(dims[1]), bpr = mask.size(1);
    const uint8_t* bits = static_cast<const uint8_t*>(mask.raw());
    auto marked = [&](int64_t n, int64_t k) { return (bits[n * bpr + k / 8] >> (k % 8)) & 1; };
    std::vector<int64_t> first(static_cast<size_t>(out) + 1, 0);  // each row's first stored value
    for (int64_t n = 0; n < out; ++n) {
      int64_t count = 0;
      for (int64_t k = 0; k < in; ++k) count += marked(n, k);
      first[n + 1] = first[n] + count;
    }
    const Tensor values = raw.load(prefix + ".compressed").to_f32();
    NIBBLE_CHECK(values.numel() == first[out], "{}: '{}.compressed' holds {} values, but its bitmask marks {}",
                 raw.describe(), prefix, values.numel(), first[out]);
    if (raw.contains(prefix + ".row_offsets")) {
      const Tensor offsets = raw.load(prefix + ".row_offsets").to_f32();
      NIBBLE_CHECK(offsets.numel() == out, "{}: '{}.row_offsets' should have {} entries, found {}", raw.describe(),
                   prefix, out, offsets.numel());
      for (int64_t n = 0; n < out; ++n)
        NIBBLE_CHECK(offsets.data<float>()[n] == static_cast<float>(first[n]),
                     "{}: '{}.row_offsets' gives row {} its first value at {}, but its bitmask puts it at {}",
                     raw.describe(), prefix, n, offsets.data<float>()[n], first[n]);
    }
    Tensor w = Tensor::zeros(DType::F32, {out, in});
    const float* v = values.data<float>();
    float* dst = w.data_mut<float>();
#pragma omp parallel for schedule(static)
    for (int64_t n = 0; n < out; ++n) {
      int64_t i = first[n];
      for (int64_t k = 0; k < in; ++k)
        if (marked(n, k)) dst[n * in + k] = v[i++];
    }
    return w;
  }

  struct Group {
    std::vector<std::string> names;                      // module names and class names
    std::vector<std::shared_ptr<const Regex>> regexes;  // "re:" targets
    std::optional<std::pair<int64_t, int64_t>> block;    // weights.block_structure
    int num_bits = 0;                                    // weights.num_bits (0: not given)
  };

  // The config group that quantized linear `prefix`, chosen as compressed-tensors matches modules to targets:
  // an exact name first, then a "re:" pattern (re.match), then the class name ("Linear", which every linear here
  // is); among targets of one kind, the alphabetically first. Null when no group's targets match. A pattern that
  // fails on the name (PCRE2's match limit) is refused naming the source and the linear.
  const Group* group_of(const std::string& prefix, const TensorSource& raw) const {
    std::optional<std::pair<int, std::string>> best;  // (kind, target)
    const Group* chosen = nullptr;
    auto consider = [&](int kind, const std::string& target, const Group& g) {
      const std::pair<int, std::string> key{kind, target};
      if (best && !(key < *best)) return;
      best = key;
      chosen = &g;
    };
    try {
      for (const Group& g : groups_) {
        for (const std::string& n : g.names) {
          if (n == prefix) consider(0, n, g);
          if (n == "Linear") consider(2, n, g);
        }
        for (const auto& r : g.regexes)
          if (r->search(prefix)) consider(1, r->pattern(), g);
      }
    } catch (const Error& e) {
      NIBBLE_FAIL("{}: linear '{}': matching it to a config group's targets: {}", raw.describe(), prefix, e.what());
    }
    return chosen;
  }

  std::string format_;
  std::string sparsity_ = "dense";  // sparsity_config's format
  std::vector<Group> groups_;
};

// The table: quant_method -> scheme.
// ----------------------------------------------------------- bitsandbytes
//
// transformers' serialization of bitsandbytes layers. Read from the stored
// tensors of each linear:
//   4-bit (Linear4bit): P.weight holds the codes of the flattened weight, two
//     per byte, element 2j in the HIGH nibble (its dtype is the storage dtype;
//     only its bytes count). P.weight.quant_map F32 [16]: each code's value (the
//     NF4 or FP4 table, as the file stores it). P.weight.absmax: F32, one per
//     `blocksize` elements (the last block may be short); with double
//     quantization U8 codes, with P.weight.nested_quant_map F32 [256] and
//     P.weight.nested_absmax F32 per `nested_blocksize` blocks:
//     absmax[b] = nested_quant_map[code] · nested_absmax[b / nested_blocksize]
//     + nested_offset. P.weight.quant_state.bitsandbytes__nf4 (or __fp4): U8
//     bytes of JSON {quant_type, blocksize, dtype, shape, nested_*}.
//     w[i] = quant_map[code_i] · absmax[i / blocksize].
//   8-bit (Linear8bitLt, LLM.int8): P.weight I8 [out, in], P.SCB F32 [out]
//     (each row's absmax), P.weight_format U8 (0: row-major).
//     w[n, k] = q · SCB[n] · (1/127 rounded to f32).
// All in f32 as the library computes them (it then rounds to the model's
// dtype). The 8-bit layer also quantizes its inputs at run time: the
// checkpoint declares the activation quantizer "llm_int8" (its default
// llm_int8_threshold of 6; act_quant.cpp) or, with threshold 0 (no outlier
// columns), "int8_token", which the forward then simulates.
class BitsAndBytesScheme final : public RivalScheme {
 public:
  BitsAndBytesScheme(const json& q, const std::string& where) {
    const io::JsonFields f = fields_of(q, where);
    const bool in4 = f.optional<bool>("load_in_4bit", false), in8 = f.optional<bool>("load_in_8bit", false);
    NIBBLE_CHECK(in4 != in8, "{}: a bitsandbytes quantization_config should set one of load_in_4bit and load_in_8bit",
                 where);
    if (in8) {
      const double threshold = f.optional<double>("llm_int8_threshold", 6.0);
      NIBBLE_CHECK(threshold == 6.0 || threshold == 0.0,
                   "{}: llm_int8_threshold {}: nibble simulates LLM.int8's activations at the default threshold 6 "
                   "and without outliers (0) only",
                   where, threshold);
      activations_ = threshold == 0.0 ? "int8_token" : "llm_int8";
    }
    describe_ = in8 ? std::string("bitsandbytes 8-bit (LLM.int8)")
                    : fmt::format("bitsandbytes 4-bit ({}{})", f.optional<std::string>("bnb_4bit_quant_type", "fp4"),
                                  f.optional<bool>("bnb_4bit_use_double_quant", false) ? ", double quant" : "");
  }
  std::string describe() const override { return describe_; }
  std::string activation_quant() const override { return activations_; }
  std::optional<std::string> linear_of(const std::string& stored, const TensorSource& raw) const override {
    for (const char* suffix : {".weight.quant_state.bitsandbytes__nf4", ".weight.quant_state.bitsandbytes__fp4"})
      if (auto prefix = strip_suffix(stored, suffix)) return prefix;
    if (auto prefix = strip_suffix(stored, ".SCB"))
      if (raw.contains(*prefix + ".weight") && raw.meta(*prefix + ".weight").dtype == DType::I8) return prefix;
    return std::nullopt;
  }
  std::vector<std::string> parts(const std::string& prefix, const TensorSource& raw) const override {
    if (raw.contains(prefix + ".SCB")) {
      std::vector<std::string> p = required_parts(raw, prefix, {".weight", ".SCB"}, "bitsandbytes");
      if (raw.contains(prefix + ".weight_format")) p.push_back(prefix + ".weight_format");
      return p;
    }
    std::vector<std::string> p =
        required_parts(raw, prefix, {".weight", ".weight.absmax", ".weight.quant_map"}, "bitsandbytes");
    for (const char* s : {".weight.nested_absmax", ".weight.nested_quant_map", ".weight.quant_state.bitsandbytes__nf4",
                          ".weight.quant_state.bitsandbytes__fp4"})
      if (raw.contains(prefix + s)) p.push_back(prefix + s);
    return p;
  }
  Tensor dequantize(const std::string& prefix, const TensorSource& raw) const override {
    return raw.contains(prefix + ".SCB") ? int8(prefix, raw) : nf4(prefix, raw);
  }

 private:
  static Tensor int8(const std::string& prefix, const TensorSource& raw) {
    const Tensor q = raw.load(prefix + ".weight").contiguous();
    NIBBLE_CHECK(q.dtype() == DType::I8 && q.dim() == 2, "{}: '{}.weight' should be a 2-D I8 tensor, found {} {}",
                 raw.describe(), prefix, dtype_name(q.dtype()), shape_str(q.shape()));
    if (raw.contains(prefix + ".weight_format")) {
      const Tensor layout = raw.load(prefix + ".weight_format").to_f32();
      NIBBLE_CHECK(layout.numel() == 1 && layout.data<float>()[0] == 0,
                   "{}: '{}.weight_format' names a tiled GPU layout; only row-major (0) is read", raw.describe(),
                   prefix);
    }
    const int64_t out = q.size(0), in = q.size(1);
    const Tensor scb = floats_of(raw, prefix + ".SCB", {out});
    Tensor w = Tensor::empty(DType::F32, {out, in});
    const int8_t* src = q.data<int8_t>();
    const float* s = scb.data<float>();
    float* dst = w.data_mut<float>();
    const float inv127 = static_cast<float>(7.874015718698502e-3);
    for (int64_t n = 0; n < out; ++n)
      for (int64_t k = 0; k < in; ++k) dst[n * in + k] = static_cast<float>(src[n * in + k]) * s[n] * inv127;
    return w;
  }

  static Tensor nf4(const std::string& prefix, const TensorSource& raw) {
    const std::string state_name = raw.contains(prefix + ".weight.quant_state.bitsandbytes__nf4")
                                       ? prefix + ".weight.quant_state.bitsandbytes__nf4"
                                       : prefix + ".weight.quant_state.bitsandbytes__fp4";
    NIBBLE_CHECK(raw.contains(state_name), "{}: bitsandbytes linear '{}' has no quant_state", raw.describe(), prefix);
    const Tensor state_bytes = raw.load(state_name).contiguous();
    const json st = json::parse(std::string_view(static_cast<const char*>(state_bytes.raw()), state_bytes.nbytes()),
                                nullptr, /*allow_exceptions=*/false);
    NIBBLE_CHECK(st.is_object(), "{}: '{}' should hold a JSON object", raw.describe(), state_name);
    const io::JsonFields f{raw.describe() + ": " + state_name, st};
    const int64_t blocksize = f.required<int64_t>("blocksize");
    NIBBLE_CHECK(blocksize > 0, "{}: blocksize should be positive, found {}", f.where, blocksize);
    NIBBLE_CHECK(st.contains("shape") && st["shape"].is_array() && st["shape"].size() == 2,
                 "{}: 'shape' should be [out, in]", f.where);
    const int64_t out = f.get<int64_t>(st["shape"][0], "shape"), in = f.get<int64_t>(st["shape"][1], "shape");
    const Tensor codes = raw.load(prefix + ".weight").contiguous();
    const int64_t max_dim = 2 * static_cast<int64_t>(codes.nbytes());  // bounds each side before the product
    NIBBLE_CHECK(out > 0 && in > 0 && out <= max_dim && in <= max_dim &&
                     (out * in + 1) / 2 == static_cast<int64_t>(codes.nbytes()),
                 "{}: shape [{}, {}] does not fit the {} bytes of codes in '{}.weight' (two codes per byte)", f.where,
                 out, in, codes.nbytes(), prefix);
    const int64_t n = out * in, blocks = ceil_div(n, blocksize);
    const Tensor map = floats_of(raw, prefix + ".weight.quant_map", {16});
    std::vector<float> absmax(static_cast<size_t>(blocks));
    const Tensor am = raw.load(prefix + ".weight.absmax").contiguous();
    NIBBLE_CHECK(am.numel() == blocks, "{}: '{}.weight.absmax' should have {} entries (one per block of {}), found {}",
                 raw.describe(), prefix, blocks, blocksize, am.numel());
    if (am.dtype() == DType::U8) {  // double quantization
      const int64_t nested = f.required<int64_t>("nested_blocksize");
      NIBBLE_CHECK(nested > 0, "{}: nested_blocksize should be positive, found {}", f.where, nested);
      const float offset = static_cast<float>(f.required<double>("nested_offset"));
      const Tensor nmap = floats_of(raw, prefix + ".weight.nested_quant_map", {256});
      const Tensor nabs = floats_of(raw, prefix + ".weight.nested_absmax", {ceil_div(blocks, nested)});
      const uint8_t* c = am.data<uint8_t>();
      for (int64_t b = 0; b < blocks; ++b)
        absmax[b] = nmap.data<float>()[c[b]] * nabs.data<float>()[b / nested] + offset;
    } else {
      const Tensor a = floats_of(raw, prefix + ".weight.absmax", {blocks});
      std::copy(a.data<float>(), a.data<float>() + blocks, absmax.begin());
    }
    const uint8_t* packed = static_cast<const uint8_t*>(codes.raw());
    const float* m = map.data<float>();
    Tensor w = Tensor::empty(DType::F32, {out, in});
    float* dst = w.data_mut<float>();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const uint8_t byte = packed[i / 2];
      dst[i] = m[i % 2 ? byte & 15 : byte >> 4] * absmax[i / blocksize];
    }
    return w;
  }

  std::string describe_;
  std::string activations_;  // 8-bit: llm_int8 or int8_token
};

// ------------------------------------------------------------- auto-round
//
// Intel's auto-round writes its own quant_method ("auto-round", earlier
// "intel/auto-round") over the layouts of other tools, named by
// `packing_format`: "auto_round:auto_gptq" (its default for symmetric weights)
// is GPTQ's layout with v1 zeros, stored minus one and clamped at 0;
// "auto_round" and "auto_round:gptqmodel" are GPTQ's layout with the zeros as
// they are (v2); "auto_round:auto_awq" is AWQ's GEMM layout. This row reads
// each through that tool's scheme.
class AutoRoundScheme final : public RivalScheme {
 public:
  AutoRoundScheme(const json& q, const std::string& where) {
    const io::JsonFields f = fields_of(q, where);
    NIBBLE_CHECK(f.optional<std::string>("data_type", "int") == "int",
                 "{}: auto-round data_type '{}' is not supported (int is)", where,
                 f.optional<std::string>("data_type", "int"));
    const bool sym = f.optional<bool>("sym", true);
    packing_ = f.optional<std::string>("packing_format", sym ? "auto_round:auto_gptq" : "auto_round");
    json inner = {{"bits", f.optional<int64_t>("bits", 4)}, {"sym", sym}};
    if (q.contains("group_size")) inner["group_size"] = q["group_size"];
    if (packing_ == "auto_round:auto_awq") {
      inner["zero_point"] = true;  // AWQ's GEMM layout always stores zeros (8 for symmetric weights)
      inner["version"] = "gemm";
      inner_ = std::make_unique<AwqScheme>(inner, where);
    } else if (packing_ == "auto_round:auto_gptq" || packing_ == "auto_round" || packing_ == "auto_round:gptqmodel") {
      inner["checkpoint_format"] = packing_ == "auto_round:auto_gptq" ? "gptq" : "gptq_v2";
      inner_ = std::make_unique<GptqScheme>(inner, where);
    } else {
      NIBBLE_FAIL(
          "{}: auto-round packing_format '{}' is not supported (auto_round, auto_round:auto_gptq, "
          "auto_round:gptqmodel and auto_round:auto_awq are)",
          where, packing_);
    }
  }
  std::string describe() const override { return "auto-round " + packing_ + ": " + inner_->describe(); }
  std::optional<std::string> linear_of(const std::string& stored, const TensorSource& raw) const override {
    return inner_->linear_of(stored, raw);
  }
  std::vector<std::string> parts(const std::string& prefix, const TensorSource& raw) const override {
    return inner_->parts(prefix, raw);
  }
  Tensor dequantize(const std::string& prefix, const TensorSource& raw) const override {
    return inner_->dequantize(prefix, raw);
  }
  std::optional<FormatChoice> exact_format(const std::string& prefix, const TensorSource& raw) const override {
    return inner_->exact_format(prefix, raw);
  }
  std::vector<Tensor> exact_parts(const std::string& prefix, const TensorSource& raw) const override {
    return inner_->exact_parts(prefix, raw);
  }

 private:
  std::string packing_;
  std::unique_ptr<RivalScheme> inner_;
};

struct SchemeRow {
  const char* quant_method;
  std::unique_ptr<RivalScheme> (*make)(const json& q, const std::string& where);
};
template <typename S>
std::unique_ptr<RivalScheme> make_scheme(const json& q, const std::string& where) {
  return std::make_unique<S>(q, where);
}
const SchemeRow kSchemes[] = {
    {"gptq", make_scheme<GptqScheme>},
    {"awq", make_scheme<AwqScheme>},
    {"compressed-tensors", make_scheme<CompressedTensorsScheme>},
    {"bitsandbytes", make_scheme<BitsAndBytesScheme>},
    {"auto-round", make_scheme<AutoRoundScheme>},
    {"intel/auto-round", make_scheme<AutoRoundScheme>},
};

}  // namespace

std::unique_ptr<RivalScheme> make_rival_scheme(const json& q, const std::string& where) {
  NIBBLE_CHECK(q.is_object() && q.contains("quant_method") && q["quant_method"].is_string(),
               "{}: quantization_config should be an object naming its quant_method", where);
  const std::string method = q["quant_method"].get<std::string>();
  for (const SchemeRow& r : kSchemes)
    if (method == r.quant_method) return r.make(q, where);
  NIBBLE_FAIL("{}: quantization method '{}' is not supported (nibble reads {})", where, method, rival_method_names());
}

std::string rival_method_names() {
  std::string names;
  for (const SchemeRow& r : kSchemes) names += fmt::format("{}{}", names.empty() ? "" : ", ", r.quant_method);
  return names;
}

std::optional<json> rival_quantization_config(const fs::path& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  if (fs::exists(dir / "config.json")) {
    const json c = io::read_json_file(dir / "config.json");
    if (c.is_object() && c.contains("quantization_config") && c["quantization_config"].is_object()) {
      const json& q = c["quantization_config"];
      NIBBLE_CHECK(!q.contains("quant_method") || q["quant_method"].is_string(),
                   "{}: quantization_config's quant_method should be a string, found {}",
                   (dir / "config.json").string(), q["quant_method"].dump());
      // compressed-tensors' "dense" format stores plain weights (a checkpoint saved unquantized), unless its
      // sparsity_config stores them sparse.
      if (q.value("quant_method", json()) == "compressed-tensors" && q.value("format", json("dense")) == "dense") {
        const json s = q.value("sparsity_config", json::object());
        if (!s.is_object() || s.value("format", json("dense")) == "dense") return std::nullopt;
      }
      return q;
    }
  }
  // AutoGPTQ (before transformers' integration) wrote its settings beside the config.
  if (fs::exists(dir / "quantize_config.json")) {
    json q = io::read_json_file(dir / "quantize_config.json");
    if (q.is_object()) {
      NIBBLE_CHECK(!q.contains("quant_method") || q["quant_method"].is_string(),
                   "{}: quant_method should be a string, found {}", (dir / "quantize_config.json").string(),
                   q["quant_method"].dump());
      if (!q.contains("quant_method")) q["quant_method"] = "gptq";
      return q;
    }
  }
  return std::nullopt;
}

std::unique_ptr<RivalSource> RivalSource::open(const fs::path& dir) {
  const std::optional<json> q = rival_quantization_config(dir);
  NIBBLE_CHECK(q.has_value(), "{}: no quantization_config in config.json (not a checkpoint of {})", dir.string(),
               rival_method_names());
  return open(dir, *q);
}

std::unique_ptr<RivalSource> RivalSource::open(const fs::path& dir, const json& q) {
  auto src = std::unique_ptr<RivalSource>(new RivalSource());
  src->scheme_ = make_rival_scheme(q, dir.string());
  src->raw_ = CheckpointDir::open(dir);
  const TensorSource& raw = *src->raw_;
  const std::vector<std::string> stored_names = raw.names();
  std::vector<std::optional<std::string>> prefixes;  // per stored name: the linear it marks, if any
  std::set<std::string> consumed;
  std::vector<std::string> linears;
  for (const std::string& stored : stored_names) {
    prefixes.push_back(src->scheme_->linear_of(stored, raw));
    if (!prefixes.back()) continue;
    linears.push_back(*prefixes.back());
    for (const std::string& p : src->scheme_->parts(*prefixes.back(), raw)) consumed.insert(p);
  }
  for (size_t i = 0; i < stored_names.size(); ++i) {
    const std::string& stored = stored_names[i];
    const std::optional<std::string>& prefix = prefixes[i];
    if (!prefix && consumed.count(stored)) continue;
    Entry e;
    if (prefix) {
      e.prefix = *prefix;
      e.stored = src->scheme_->parts(*prefix, raw);
      e.meta.name = *prefix + ".weight";
      e.meta.dtype = DType::F32;
      for (const std::string& p : e.stored) e.meta.stored_bytes += raw.meta(p).stored_bytes;
    } else {
      e.meta = raw.meta(stored);
      e.stored = {stored};
    }
    NIBBLE_CHECK(!src->entries_.count(e.meta.name), "{}: tensor '{}' is stored both plain and quantized", dir.string(),
                 e.meta.name);
    src->order_.push_back(e.meta.name);
    src->entries_[e.meta.name] = std::move(e);
  }
  NIBBLE_CHECK(!linears.empty(), "{}: config.json says {}, but no tensor is stored that way", dir.string(),
               src->scheme_->describe());
  // Shapes of the quantized linears: from the config's expectations where it
  // has them (cheap), else by dequantizing once.
  std::map<std::string, Shape> expected;
  for (const ExpectedTensor& t : expected_tensors(src->config())) expected[t.name] = t.shape;
  for (const std::string& prefix : linears) {
    Entry& e = src->entries_.at(prefix + ".weight");
    auto it = expected.find(e.meta.name);
    e.meta.shape = it != expected.end() ? it->second : src->scheme_->dequantize(prefix, raw).shape();
  }
  return src;
}

std::string RivalSource::describe() const {
  const std::string act = scheme_->activation_quant();
  return raw_->dir().string() + " (" + scheme_->describe() + (act.empty() ? "" : ", activations " + act) + ")";
}

const RivalSource::Entry& RivalSource::entry(const std::string& name) const {
  auto it = entries_.find(name);
  NIBBLE_CHECK(it != entries_.end(), "{}: no tensor '{}'", describe(), name);
  return it->second;
}

std::vector<std::string> RivalSource::stored_parts(const std::string& name) const { return entry(name).stored; }

bool RivalSource::activations_quantized(const std::string& prefix) const {
  auto it = entries_.find(prefix + ".weight");
  return it != entries_.end() && !it->second.prefix.empty();
}

TensorMeta RivalSource::meta(const std::string& name) const { return entry(name).meta; }

std::vector<Tensor> RivalScheme::exact_parts(const std::string& prefix, const TensorSource& raw) const {
  NIBBLE_FAIL("{}: {} linear '{}' has no exact nibble format", raw.describe(), describe(), prefix);
}

std::optional<FormatChoice> RivalSource::exact_format(const std::string& name) const {
  const Entry& e = entry(name);
  if (e.prefix.empty()) return e.meta.format;
  std::lock_guard<std::mutex> lock(exact_mutex_);
  auto it = exact_.find(name);
  if (it == exact_.end()) it = exact_.emplace(name, scheme_->exact_format(e.prefix, *raw_)).first;
  return it->second;
}

std::string RivalSource::foreign_format(const std::string& name) const {
  return entry(name).prefix.empty() ? std::string() : scheme_->describe();
}

std::vector<Tensor> RivalSource::exact_parts(const std::string& name) const {
  const Entry& e = entry(name);
  const std::optional<FormatChoice> f = exact_format(name);
  NIBBLE_CHECK(f && !e.prefix.empty(), "{}: '{}' has no exact nibble format", describe(), name);
  std::vector<Tensor> parts = scheme_->exact_parts(e.prefix, *raw_);
  check_parts(*f, parts, e.meta.shape[0], e.meta.shape[1]);
  return parts;
}

Tensor RivalSource::load(const std::string& name) const {
  const Entry& e = entry(name);
  if (e.prefix.empty()) return raw_->load(e.stored[0]);
  Tensor w = scheme_->dequantize(e.prefix, *raw_);
  NIBBLE_CHECK(w.shape() == e.meta.shape, "{}: '{}' dequantizes to {}, but the config implies {}", describe(), name,
               shape_str(w.shape()), shape_str(e.meta.shape));
  return w;
}

}  // namespace nibble
