// GgufSource: a GGUF file as a Hugging Face-named ModelSource (see gguf.h).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <string_view>

#include "nibble/arch.h"
#include "nibble/dtype.h"
#include "nibble/error.h"
#include "nibble/gguf.h"
#include "nibble/model.h"

namespace nibble {

namespace {

using io::GgmlType;
using io::GgufFile;

// general.architecture values nibble runs, and the model_type each becomes.
// llama.cpp writes Mistral (7B) checkpoints as "llama".
constexpr std::pair<std::string_view, std::string_view> kArchitectures[] = {
    {"llama", "llama"}, {"qwen2", "qwen2"}, {"qwen3", "qwen3"}};

// llama.cpp's tensor names (llama-arch.cpp's LLM_TENSOR_NAMES) -> HF names.
struct NameRow {
  std::string_view gguf, hf;
};
constexpr NameRow kGlobalNames[] = {
    {"token_embd", "model.embed_tokens"}, {"output_norm", "model.norm"}, {"output", "lm_head"}};
constexpr NameRow kLayerNames[] = {
    {"attn_norm", "input_layernorm"},     {"attn_q", "self_attn.q_proj"},
    {"attn_k", "self_attn.k_proj"},       {"attn_v", "self_attn.v_proj"},
    {"attn_output", "self_attn.o_proj"},  {"attn_q_norm", "self_attn.q_norm"},
    {"attn_k_norm", "self_attn.k_norm"},  {"ffn_norm", "post_attention_layernorm"},
    {"ffn_gate", "mlp.gate_proj"},        {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},
};

// Llama 3.1-style RoPE scaling is stored by llama.cpp as this tensor of
// per-frequency divisors rather than as parameters.
constexpr const char* kRopeFreqs = "rope_freqs.weight";

struct MappedName {
  std::string hf;
  int64_t layer = -1;    // -1 for the non-layer tensors
  std::string_view base; // GGUF base name ("attn_q", "token_embd")
};

// "blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight"; nullopt
// for a name outside the table.
std::optional<MappedName> map_name(std::string_view g) {
  std::string_view suffix;
  for (std::string_view s : {".weight", ".bias"})
    if (g.size() > s.size() && g.substr(g.size() - s.size()) == s) suffix = s;
  if (suffix.empty()) return std::nullopt;
  std::string_view base = g.substr(0, g.size() - suffix.size());
  if (base.rfind("blk.", 0) == 0) {
    base.remove_prefix(4);
    const size_t dot = base.find('.');
    if (dot == std::string_view::npos || dot == 0 || dot > 9) return std::nullopt;
    int64_t layer = 0;
    for (char c : base.substr(0, dot)) {
      if (c < '0' || c > '9') return std::nullopt;
      layer = layer * 10 + (c - '0');
    }
    base.remove_prefix(dot + 1);
    for (const NameRow& r : kLayerNames)
      if (r.gguf == base)
        return MappedName{fmt::format("model.layers.{}.{}{}", layer, r.hf, suffix), layer, r.gguf};
    return std::nullopt;
  }
  for (const NameRow& r : kGlobalNames)
    if (r.gguf == base) return MappedName{fmt::format("{}{}", r.hf, suffix), -1, r.gguf};
  return std::nullopt;
}

std::string known_names() {
  std::string out;
  for (const NameRow& r : kGlobalNames) out += fmt::format("{}{}", out.empty() ? "" : ", ", r.gguf);
  for (const NameRow& r : kLayerNames) out += fmt::format(", blk.N.{}", r.gguf);
  return out + " (.weight/.bias)";
}

// Undoes llama.cpp's convert_hf_to_gguf permute() on the rows of a q or k
// projection (weight [rows, cols] or bias [rows]). The converter reshapes the
// HF rows of each head as [2, head_dim/2] and swaps the two axes, so GGUF row
// 2j+h of a head holds HF row h·head_dim/2 + j (interleaved RoPE pairs, as
// Meta's original checkpoints and llama.cpp's NORM rope expect); this puts
// every row back where HF's rotate_half wants it.
Tensor unpermute_rows(const Tensor& t, int64_t heads) {
  const Tensor src = t.is_contiguous() ? t : t.contiguous();
  const int64_t rows = src.size(0), head_dim = rows / heads, half = head_dim / 2;
  const size_t row_bytes = src.nbytes() / static_cast<size_t>(rows);
  Tensor out = Tensor::empty(src.dtype(), src.shape());
  const auto* s = static_cast<const uint8_t*>(src.raw());
  auto* d = static_cast<uint8_t*>(out.raw_mut());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t part = 0; part < 2; ++part)
      for (int64_t j = 0; j < half; ++j)
        std::memcpy(d + static_cast<size_t>(h * head_dim + part * half + j) * row_bytes,
                    s + static_cast<size_t>(h * head_dim + 2 * j + part) * row_bytes, row_bytes);
  return out;
}

// The 32 codes of a Q4_0 / Q4_1 block's qs[16] (input j in the low nibble of
// qs[j], input j + 16 in its high nibble) in nibble order: input 2t in the low
// nibble of out[t].
void legacy_block_codes(const uint8_t* qs, uint8_t* out) {
  auto code = [&](int e) { return e < 16 ? qs[e] & 0x0F : qs[e - 16] >> 4; };
  for (int t = 0; t < 16; ++t) out[t] = static_cast<uint8_t>(code(2 * t) | code(2 * t + 1) << 4);
}

// The little-endian f16 at p, as fp32 (exactly).
float f16_at(const uint8_t* p) { return f16_to_f32(static_cast<uint16_t>(p[0] | p[1] << 8)); }

// A Q4_K / Q5_K super-block's 8 groups (sub-blocks of 32): from its f16 d and dmin (bytes 0-3) and 6-bit scales sc
// and mins mn (bytes 4-15, ggml_k_scale_min), scale d·sc and min −(dmin·mn), the fp32 products ggml's dequantizer
// forms (gguf_quants.cpp's deq_k_super), so code·scale + min is its (d·sc)·q − dmin·mn: the product commutes and
// a + (−b) is a − b in IEEE. A min of −0 (mn = 0) is kept: with d < 0, (d·sc)·0 − 0 is −0, as is −0 + (−0), where
// + (+0) would give +0.
void k_super_groups(const uint8_t* b, float* s, float* m) {
  const float d = f16_at(b), dmin = f16_at(b + 2);
  for (int j = 0; j < 8; ++j) {
    int sc, mn;
    io::ggml_k_scale_min(j, b + 4, sc, mn);
    s[j] = d * static_cast<float>(sc);
    m[j] = -(dmin * static_cast<float>(mn));
  }
}

// The converters below take a [rows, cols] matrix of ggml blocks (rows are whole blocks of `inputs` inputs and
// `bytes` bytes each, block i covering inputs i·inputs .. of the matrix in row-major order) to a nibble format's parts,
// a block at a time in parallel through fill(block, codes, ...) with that block's share of each part.

// int4_asym_f32's (bits 4, two codes a byte) or int8_asym_f32's (bits 8) parts in groups of `group`: fill(block,
// codes, scales, mins) writes inputs·bits/8 code bytes and inputs/group scales and mins.
template <class Fill>
std::vector<Tensor> asym_f32_parts(const uint8_t* blocks, int64_t rows, int64_t cols, int bits, int64_t group,
                                   int64_t inputs, int64_t bytes, Fill fill) {
  Tensor codes = Tensor::empty(DType::U8, {rows, cols * bits / 8});
  Tensor scales = Tensor::empty(DType::F32, {rows, cols / group}), mins = Tensor::empty(DType::F32, {rows, cols / group});
  auto* c = static_cast<uint8_t*>(codes.raw_mut());
  float *s = scales.data_mut<float>(), *m = mins.data_mut<float>();
  const int64_t code_bytes = inputs * bits / 8, groups = inputs / group;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows * (cols / inputs); ++i)
    fill(blocks + i * bytes, c + i * code_bytes, s + i * groups, m + i * groups);
  return {codes, scales, mins};
}

// int4_sym's (code dtype U8, two codes a byte) or int8_sym's (I8) parts for ggml blocks of 32 inputs that begin
// with their f16 d: d's bits as the group's f16 scale, fill(block, codes) writing the block's code bytes.
template <class Fill>
std::vector<Tensor> sym_f16_parts(const uint8_t* blocks, int64_t rows, int64_t cols, DType code_dtype, int64_t bytes,
                                  Fill fill) {
  constexpr int64_t kQK = 32;
  const int64_t code_bytes = code_dtype == DType::U8 ? kQK / 2 : kQK, nb = cols / kQK;
  Tensor codes = Tensor::empty(code_dtype, {rows, nb * code_bytes}), scales = Tensor::empty(DType::F16, {rows, nb});
  auto* c = static_cast<uint8_t*>(codes.raw_mut());
  auto* s = static_cast<uint16_t*>(scales.raw_mut());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < rows * nb; ++i) {
    const uint8_t* b = blocks + i * bytes;
    std::memcpy(&s[i], b, 2);
    fill(b, c + i * code_bytes);
  }
  return {codes, scales};
}

// Q4_0 blocks (18 bytes per 32 inputs: f16 d, then qs[16] with input j in the low nibble of qs[j] and input j + 16 in
// its high nibble; x = (q − 8)·d) as int4_sym g32's parts: the codes re-ordered to input 2t in the low nibble of byte
// t, d's f16 bits as the group's scale. int4_sym's (code − 8)·scale in fp32 is ggml's dequantized value.
std::vector<Tensor> q4_0_as_int4_sym(const uint8_t* blocks, int64_t rows, int64_t cols) {
  return sym_f16_parts(blocks, rows, cols, DType::U8, 18, [](const uint8_t* b, uint8_t* c) {
    legacy_block_codes(b + 2, c);
  });
}

// Q4_1 blocks (20 bytes per 32 inputs: f16 d, f16 m, then qs[16] nibbled as Q4_0's; x = q·d + m) as int4_asym_f32
// g32's parts: the same codes in int4_asym_f32's nibble order, f32(d) as the scale and f32(m) as the min, so
// code·scale + min is ggml's q·d + m, the same two fp32 operations.
std::vector<Tensor> q4_1_as_int4_asym_f32(const uint8_t* blocks, int64_t rows, int64_t cols) {
  return asym_f32_parts(blocks, rows, cols, 4, 32, 32, 20, [](const uint8_t* b, uint8_t* c, float* s, float* m) {
    s[0] = f16_at(b);
    m[0] = f16_at(b + 2);
    legacy_block_codes(b + 4, c);
  });
}

// Q4_K super-blocks (144 bytes per 256 inputs: f16 d, f16 dmin, 12 bytes of 6-bit scales sc and mins mn for 8
// sub-blocks of 32, qs[128]; in each 64 inputs, sub-block 2k is the low nibbles of qs[32k .. 32k+31] and 2k+1 their
// high nibbles; x = (d·sc)·q − dmin·mn) as int4_asym_f32 g32's parts, one group per sub-block (k_super_groups).
std::vector<Tensor> q4_k_as_int4_asym_f32(const uint8_t* blocks, int64_t rows, int64_t cols) {
  return asym_f32_parts(blocks, rows, cols, 4, 32, 256, 144, [](const uint8_t* b, uint8_t* c, float* s, float* m) {
    k_super_groups(b, s, m);
    for (int j = 0; j < 8; ++j) {
      const uint8_t* q = b + 16 + 32 * (j / 2);
      const int shift = 4 * (j % 2);
      for (int t = 0; t < 16; ++t)
        c[16 * j + t] = static_cast<uint8_t>(((q[2 * t] >> shift) & 0x0F) | (((q[2 * t + 1] >> shift) & 0x0F) << 4));
    }
  });
}

// Q8_0 blocks (34 bytes per 32 inputs: f16 d, then int8 qs[32] in input order; x = q·d) as int8_g32_sym's parts:
// the codes as they are, d's f16 bits as the group's scale, so code·scale in fp32 is ggml's q·d.
std::vector<Tensor> q8_0_as_int8_sym(const uint8_t* blocks, int64_t rows, int64_t cols) {
  return sym_f16_parts(blocks, rows, cols, DType::I8, 34, [](const uint8_t* b, uint8_t* c) {
    std::memcpy(c, b + 2, 32);
  });
}

// The 5-bit code of input e (0..31) of a Q5_0 / Q5_1 block: the low 4 bits as Q4_0's nibbles (input e < 16 in the
// low nibble of qs[e], e >= 16 in the high nibble of qs[e − 16]), the 5th bit from bit e of the little-endian qh.
int q5_code(const uint8_t* qh, const uint8_t* qs, int e) {
  const int lo = e < 16 ? qs[e] & 0x0F : qs[e - 16] >> 4;
  return lo | ((qh[e / 8] >> (e % 8)) & 1) << 4;
}

// Q5_0 blocks (22 bytes per 32 inputs: f16 d, u32 qh, qs[16]; x = (q − 16)·d) as int8_g32_sym's parts: the codes
// q − 16 in −16..15, d's f16 bits as the scale, so code·scale is ggml's (q − 16)·d, the same product.
std::vector<Tensor> q5_0_as_int8_sym(const uint8_t* blocks, int64_t rows, int64_t cols) {
  return sym_f16_parts(blocks, rows, cols, DType::I8, 22, [](const uint8_t* b, uint8_t* c) {
    for (int e = 0; e < 32; ++e) c[e] = static_cast<uint8_t>(static_cast<int8_t>(q5_code(b + 2, b + 6, e) - 16));
  });
}

// Q5_1 blocks (24 bytes per 32 inputs: f16 d, f16 m, u32 qh, qs[16]; x = q·d + m) as int8_g32_asym_f32's parts:
// the codes 0..31, f32(d) as the scale and f32(m) as the min, so code·scale + min is ggml's q·d + m.
std::vector<Tensor> q5_1_as_int8_asym_f32(const uint8_t* blocks, int64_t rows, int64_t cols) {
  return asym_f32_parts(blocks, rows, cols, 8, 32, 32, 24, [](const uint8_t* b, uint8_t* c, float* s, float* m) {
    s[0] = f16_at(b);
    m[0] = f16_at(b + 2);
    for (int e = 0; e < 32; ++e) c[e] = static_cast<uint8_t>(q5_code(b + 4, b + 8, e));
  });
}

// Q5_K super-blocks (176 bytes per 256 inputs: f16 d, f16 dmin, scales[12] as Q4_K's, qh[32], qs[128]) as
// int8_g32_asym_f32's parts, a group per sub-block of 32 as for Q4_K (k_super_groups). Sub-block j's input l takes
// its low 4 bits from qs[32·(j/2) + l] (the low nibble for even j, the high one for odd j) and its 5th bit from bit
// j of qh[l].
std::vector<Tensor> q5_k_as_int8_asym_f32(const uint8_t* blocks, int64_t rows, int64_t cols) {
  return asym_f32_parts(blocks, rows, cols, 8, 32, 256, 176, [](const uint8_t* b, uint8_t* c, float* s, float* m) {
    k_super_groups(b, s, m);
    const uint8_t *qh = b + 16, *qs = b + 48;
    for (int j = 0; j < 8; ++j)
      for (int l = 0; l < 32; ++l) {
        const int lo = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 0x0F;
        c[32 * j + l] = static_cast<uint8_t>(lo | ((qh[l] >> j) & 1) << 4);
      }
  });
}

// Q6_K super-blocks (210 bytes per 256 inputs: ql[128], qh[64], int8 sc[16], f16 d; x = (d·sc)·(q − 32) per
// sub-block of 16) as int8_g16_asym_f32's parts: code q in 0..63, scale S = d·sc (exact in fp32: 11 + 7
// significant bits) and min −32·S, so code·scale + min = (q − 32)·S, exact (at most 24 significant bits) as ggml's
// product is. The one difference: where that product is zero (q = 32 or sc = 0) ggml's zero carries the sign of
// its factors and this one is +0. Input e = 128h + 32r + l (half h, run r, l < 32) takes its low 4 bits from
// ql[64h + 32·(r % 2) + l] (the low nibble for r < 2) and its top 2 from bits 2r, 2r + 1 of qh[32h + l].
std::vector<Tensor> q6_k_as_int8_asym_f32(const uint8_t* blocks, int64_t rows, int64_t cols) {
  return asym_f32_parts(blocks, rows, cols, 8, 16, 256, 210, [](const uint8_t* b, uint8_t* c, float* s, float* m) {
    const float d = f16_at(b + 208);
    for (int t = 0; t < 16; ++t) {
      s[t] = d * static_cast<float>(static_cast<int8_t>(b[192 + t]));
      m[t] = -32.0f * s[t];
    }
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, r = (e / 32) % 4, l = e % 32;
      const int lo = (b[64 * h + 32 * (r % 2) + l] >> (4 * (r / 2))) & 0x0F;
      const int hi = (b[128 + 32 * h + l] >> (2 * r)) & 3;
      c[e] = static_cast<uint8_t>(lo | hi << 4);
    }
  });
}

// The 2-bit field of input e (0..255) in a Q2_K / Q3_K super-block's qs[64]: the inputs come in two halves of 128, and
// in half h the four 32-input runs r take bits 2r, 2r + 1 of qs[32h + (e mod 32)].
int k_two_bits(const uint8_t* qs, int e) { return (qs[32 * (e / 128) + e % 32] >> (2 * (e / 32 % 4))) & 3; }

// Q2_K super-blocks (84 bytes per 256 inputs: scales[16], qs[64], f16 d, f16 dmin; per sub-block of 16 a byte with
// a 4-bit scale sc (low nibble) and min mn (high nibble): x = (d·sc)·q − dmin·mn, q in 0..3) as int8_g16_asym_f32's
// parts: code q, scale d·sc and min −(dmin·mn), the products ggml forms, so code·scale + min is its value bit for bit
// (as for Q4_K: k_super_groups).
std::vector<Tensor> q2_k_as_int8_asym_f32(const uint8_t* blocks, int64_t rows, int64_t cols) {
  return asym_f32_parts(blocks, rows, cols, 8, 16, 256, 84, [](const uint8_t* b, uint8_t* c, float* s, float* m) {
    const float d = f16_at(b + 80), dmin = f16_at(b + 82);
    for (int t = 0; t < 16; ++t) {
      s[t] = d * static_cast<float>(b[t] & 0x0F);
      m[t] = -(dmin * static_cast<float>(b[t] >> 4));
    }
    for (int e = 0; e < 256; ++e) c[e] = static_cast<uint8_t>(k_two_bits(b + 16, e));
  });
}

// Q3_K super-blocks (110 bytes per 256 inputs: hmask[32], qs[64], 12 bytes of 6-bit scales, f16 d; x = d·(sc −
// 32)·q per sub-block of 16, q = the 2-bit field − 4 unless input e's high bit, bit e / 32 of hmask[e mod 32], is
// set) as int8_g16_asym_f32's parts: code q + 4 in 0..7 (the 2-bit field with the high bit as bit 2), scale S =
// d·(sc − 32) and min −4·S, exact in fp32 as for Q6_K (S has at most 17 significant bits), so code·S + (−4·S) is
// ggml's S·q, a zero product aside (+0 here, signed as its factors there). Sub-block j's scale: its low 4 bits are
// nibble j / 8 of scale byte j mod 8, its top 2 bits 2·(j / 4), 2·(j / 4) + 1 of byte 8 + j mod 4.
std::vector<Tensor> q3_k_as_int8_asym_f32(const uint8_t* blocks, int64_t rows, int64_t cols) {
  return asym_f32_parts(blocks, rows, cols, 8, 16, 256, 110, [](const uint8_t* b, uint8_t* c, float* s, float* m) {
    const uint8_t* sb = b + 96;
    const float d = f16_at(b + 108);
    for (int j = 0; j < 16; ++j) {
      const int lo = (sb[j % 8] >> (4 * (j / 8))) & 0x0F, hi = (sb[8 + j % 4] >> (2 * (j / 4))) & 3;
      s[j] = d * static_cast<float>((lo | hi << 4) - 32);
      m[j] = -4.0f * s[j];
    }
    for (int e = 0; e < 256; ++e) {
      const int high = (b[e % 32] >> (e / 32)) & 1;
      c[e] = static_cast<uint8_t>(k_two_bits(b + 32, e) | high << 2);
    }
  });
}

// IQ4_NL blocks (18 bytes per 32 inputs: f16 d, qs[16] nibbled as Q4_0's; x = d·kvalues[q], the fixed 16-level
// grid in −127..113) as int8_g32_sym's parts: the grid values themselves as the int8 codes, d's f16 bits as the
// scale, so code·scale is ggml's d·kvalues[q], the same product.
std::vector<Tensor> iq4_nl_as_int8_sym(const uint8_t* blocks, int64_t rows, int64_t cols) {
  return sym_f16_parts(blocks, rows, cols, DType::I8, 18, [](const uint8_t* b, uint8_t* c) {
    for (int e = 0; e < 32; ++e)
      c[e] = static_cast<uint8_t>(io::kGgmlIq4nlValues[e < 16 ? b[2 + e] & 0x0F : b[2 + e - 16] >> 4]);
  });
}

// IQ4_XS super-blocks (136 bytes per 256 inputs: f16 d, u16 scales_h, scales_l[4], qs[128]; per sub-block k of 32
// a 6-bit scale ls (low 4 bits: nibble k mod 2 of scales_l[k / 2]; top 2: bits 2k, 2k + 1 of scales_h), x =
// (d·(ls − 32))·kvalues[q], inputs 32k + j and 32k + 16 + j the low and high nibbles of qs[16k + j]) as
// int8_g32_asym_f32's parts: code kvalues[q] + 128 in 1..241, scale S = d·(ls − 32) (at most 16 significant bits)
// and min −128·S, so code·S is exact (at most 24) and code·S + (−128·S) is ggml's S·kvalues[q] exactly. No grid
// value is 0, so only S = ±0 gives a zero: +0 here, signed as its factors in ggml.
std::vector<Tensor> iq4_xs_as_int8_asym_f32(const uint8_t* blocks, int64_t rows, int64_t cols) {
  return asym_f32_parts(blocks, rows, cols, 8, 32, 256, 136, [](const uint8_t* b, uint8_t* c, float* s, float* m) {
    const float d = f16_at(b);
    const unsigned high = b[2] | b[3] << 8;
    for (int k = 0; k < 8; ++k) {
      const int ls = ((b[4 + k / 2] >> (4 * (k % 2))) & 0x0F) | ((high >> (2 * k)) & 3) << 4;
      s[k] = d * static_cast<float>(ls - 32);
      m[k] = -128.0f * s[k];
      const uint8_t* qs = b + 8 + 16 * k;
      for (int j = 0; j < 16; ++j) {
        c[32 * k + j] = static_cast<uint8_t>(io::kGgmlIq4nlValues[qs[j] & 0x0F] + 128);
        c[32 * k + 16 + j] = static_cast<uint8_t>(io::kGgmlIq4nlValues[qs[j] >> 4] + 128);
      }
    }
  });
}

// ggml block types that a nibble format holds exactly (GgufSource::exact_format), one row each:
//   Q4_0 -> int4_g32_sym       (codes around 8, d's f16 bits as the scale)
//   Q4_1 -> int4_g32_asym_f32  (scale d, min m)
//   Q4_K -> int4_g32_asym_f32  (a group per sub-block of 32: scale d·sc, min −dmin·mn)
//   Q2_K -> int8_g16_asym_f32  (a group per sub-block of 16: scale d·sc, min −dmin·mn)
//   Q3_K -> int8_g16_asym_f32  (a group per sub-block of 16: scale d·(sc − 32), min −4·d·(sc − 32); zeros are +0)
//   Q5_0 -> int8_g32_sym       (codes q − 16, d's f16 bits as the scale)
//   Q5_1 -> int8_g32_asym_f32  (scale d, min m)
//   Q5_K -> int8_g32_asym_f32  (as Q4_K)
//   Q6_K -> int8_g16_asym_f32  (a group per sub-block of 16: scale d·sc, min −32·d·sc; zeros are +0)
//   Q8_0 -> int8_g32_sym       (the codes, d's f16 bits as the scale)
//   IQ4_NL -> int8_g32_sym     (the grid values as codes, d's f16 bits as the scale)
//   IQ4_XS -> int8_g32_asym_f32 (a group per sub-block of 32: codes grid value + 128, scale d·(ls − 32), min −128·that)
// `block` is ggml's block (Q4_K: super-block) size, which ne[0] must be a
// multiple of; `group` is the nibble format's group size.
struct ExactBlockType {
  GgmlType type;
  int64_t block;
  std::string_view family;
  int group;
  std::vector<Tensor> (*parts)(const uint8_t* blocks, int64_t rows, int64_t cols);
};
constexpr ExactBlockType kExactBlockTypes[] = {
    {GgmlType::Q4_0, 32, "int4_sym", 32, q4_0_as_int4_sym},
    {GgmlType::Q4_1, 32, "int4_asym_f32", 32, q4_1_as_int4_asym_f32},
    {GgmlType::Q4_K, 256, "int4_asym_f32", 32, q4_k_as_int4_asym_f32},
    {GgmlType::Q2_K, 256, "int8_asym_f32", 16, q2_k_as_int8_asym_f32},
    {GgmlType::Q3_K, 256, "int8_asym_f32", 16, q3_k_as_int8_asym_f32},
    {GgmlType::Q5_0, 32, "int8_sym", 32, q5_0_as_int8_sym},
    {GgmlType::Q5_1, 32, "int8_asym_f32", 32, q5_1_as_int8_asym_f32},
    {GgmlType::Q5_K, 256, "int8_asym_f32", 32, q5_k_as_int8_asym_f32},
    {GgmlType::Q6_K, 256, "int8_asym_f32", 16, q6_k_as_int8_asym_f32},
    {GgmlType::Q8_0, 32, "int8_sym", 32, q8_0_as_int8_sym},
    {GgmlType::IQ4_NL, 32, "int8_sym", 32, iq4_nl_as_int8_sym},
    {GgmlType::IQ4_XS, 256, "int8_asym_f32", 32, iq4_xs_as_int8_asym_f32},
};

const ExactBlockType* exact_block_type(const io::GgufTensorInfo& t) {
  if (t.ne.size() != 2) return nullptr;
  for (const ExactBlockType& r : kExactBlockTypes)
    if (static_cast<uint32_t>(r.type) == t.type && t.ne[0] % r.block == 0) return &r;
  return nullptr;
}

// The stored dtype of a plain (unquantized) GGUF tensor; nullopt for block types.
std::optional<DType> plain_dtype(uint32_t type) {
  switch (static_cast<GgmlType>(type)) {
    case GgmlType::F32: return DType::F32;
    case GgmlType::F16: return DType::F16;
    case GgmlType::BF16: return DType::BF16;
    default: return std::nullopt;
  }
}

// rope_freqs.weight holds, per frequency, the divisor llama 3's rule applies
// to it. nibble's config carries the rule's parameters instead, so the
// divisors are matched against the rule with Meta's published parameters
// (low_freq_factor 1, high_freq_factor 4, original context 8192: Llama 3.1,
// 3.2 and 3.3 all use them) and the largest divisor as the factor.
RopeScaling rope_scaling_from_freqs(const GgufFile& f, const ModelConfig& c) {
  const std::string file = f.path().string();
  const Tensor freqs = f.dequantize(kRopeFreqs);
  NIBBLE_CHECK(freqs.numel() == c.head_dim / 2, "{}: tensor '{}' has {} entries, expected head_dim/2 = {}", file,
               kRopeFreqs, freqs.numel(), c.head_dim / 2);
  const float* div = freqs.data<float>();
  float factor = 1;
  for (int64_t i = 0; i < freqs.numel(); ++i) factor = std::max(factor, div[i]);
  RopeScaling s;
  if (factor == 1) return s;  // all ones: no scaling
  s.type = "llama3";
  s.factor = factor;
  s.low_freq_factor = 1;
  s.high_freq_factor = 4;
  s.original_max_position_embeddings = 8192;
  ModelConfig plain = c, scaled = c;
  plain.rope_scaling = RopeScaling{};
  scaled.rope_scaling = s;
  const std::vector<float> f0 = rope_inv_freq(plain), f1 = rope_inv_freq(scaled);
  for (size_t i = 0; i < f0.size(); ++i) {
    const double expected = static_cast<double>(f0[i]) / f1[i];
    // f32 storage of the divisor and f32 inverse frequencies: 1e-4 relative
    // is far inside the gap between distinct rules.
    NIBBLE_CHECK(std::abs(expected - div[i]) <= 1e-4 * expected,
                 "{}: tensor '{}' (RoPE frequency divisors) does not follow llama 3's scaling rule with factor {}, "
                 "low/high frequency factors 1/4 and original context 8192: entry {} is {}, the rule gives {}; "
                 "this RoPE scaling is not supported",
                 file, kRopeFreqs, factor, i, div[i], expected);
  }
  return s;
}

ModelConfig config_from_metadata(const GgufFile& f) {
  const std::string file = f.path().string();
  const std::string& arch = f.get_string("general.architecture");
  std::string_view model_type;
  std::string supported;
  for (const auto& [a, mt] : kArchitectures) {
    supported += fmt::format("{}{}", supported.empty() ? "" : ", ", a);
    if (a == arch) model_type = mt;
  }
  NIBBLE_CHECK(!model_type.empty(), "{}: general.architecture '{}' is not supported (supported: {})", file, arch,
               supported);
  auto key = [&](const char* k) { return fmt::format("{}.{}", arch, k); };

  ModelConfig c;
  c.model_type = model_type;
  c.hidden_size = f.get_int(key("embedding_length"));
  c.num_layers = f.get_int(key("block_count"));
  c.intermediate_size = f.get_int(key("feed_forward_length"));
  c.num_heads = f.get_int(key("attention.head_count"));
  c.num_kv_heads = f.get_int(key("attention.head_count_kv"), c.num_heads);
  c.rms_norm_eps = f.get_float(key("attention.layer_norm_rms_epsilon"));
  c.rope_theta = f.get_float(key("rope.freq_base"), 10000.0);
  c.max_position_embeddings = f.get_int(key("context_length"));
  for (auto [k, v] : {std::pair{"embedding_length", c.hidden_size}, {"block_count", c.num_layers},
                      {"feed_forward_length", c.intermediate_size}, {"attention.head_count", c.num_heads},
                      {"attention.head_count_kv", c.num_kv_heads}, {"context_length", c.max_position_embeddings}})
    NIBBLE_CHECK(v > 0, "{}: metadata key '{}.{}' must be positive, found {}", file, arch, k, v);
  NIBBLE_CHECK(c.num_heads % c.num_kv_heads == 0, "{}: {}.attention.head_count ({}) is not a multiple of "
               "{}.attention.head_count_kv ({})", file, arch, c.num_heads, arch, c.num_kv_heads);
  if (f.has(key("attention.key_length"))) {
    c.head_dim = f.get_int(key("attention.key_length"));
  } else {
    NIBBLE_CHECK(c.hidden_size % c.num_heads == 0, "{}: {}.embedding_length ({}) is not a multiple of "
                 "{}.attention.head_count ({}) and there is no {}.attention.key_length", file, arch, c.hidden_size,
                 arch, c.num_heads, arch);
    c.head_dim = c.hidden_size / c.num_heads;
  }
  NIBBLE_CHECK(c.head_dim > 0 && c.head_dim % 2 == 0, "{}: the head dimension must be positive and even, found {}",
               file, c.head_dim);
  const int64_t value_length = f.get_int(key("attention.value_length"), c.head_dim);
  NIBBLE_CHECK(value_length == c.head_dim, "{}: {}.attention.value_length ({}) differs from the key length ({}); "
               "nibble's forward needs them equal", file, arch, value_length, c.head_dim);
  const int64_t rope_dims = f.get_int(key("rope.dimension_count"), c.head_dim);
  NIBBLE_CHECK(rope_dims == c.head_dim, "{}: {}.rope.dimension_count is {}, but the head dimension is {}: partial "
               "rotary embeddings are not supported", file, arch, rope_dims, c.head_dim);
  NIBBLE_CHECK(c.rms_norm_eps > 0, "{}: {}.attention.layer_norm_rms_epsilon must be positive, found {}", file, arch,
               c.rms_norm_eps);
  NIBBLE_CHECK(c.rope_theta > 0, "{}: {}.rope.freq_base must be positive, found {}", file, arch, c.rope_theta);

  // RoPE scaling: linear from the parameters; llama 3 from rope_freqs.weight.
  const std::string scaling = f.get_string(key("rope.scaling.type"), "none");
  if (scaling == "linear") {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = f.get_float(key("rope.scaling.factor"));
    NIBBLE_CHECK(c.rope_scaling.factor > 0, "{}: {}.rope.scaling.factor must be positive, found {}", file, arch,
                 c.rope_scaling.factor);
  } else if (f.has(key("rope.scale_linear"))) {  // the older spelling
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = f.get_float(key("rope.scale_linear"));
  } else {
    NIBBLE_CHECK(scaling == "none", "{}: {}.rope.scaling.type '{}' is not supported (none, linear)", file, arch,
                 scaling);
  }
  if (f.contains(kRopeFreqs)) {
    NIBBLE_CHECK(c.rope_scaling.type == "default", "{}: both {}.rope.scaling.type and '{}' are set", file, arch,
                 kRopeFreqs);
    c.rope_scaling = rope_scaling_from_freqs(f, c);
  }

  NIBBLE_CHECK(f.contains("token_embd.weight"), "{}: tensor 'token_embd.weight' is missing", file);
  const io::GgufTensorInfo& embd = f.info("token_embd.weight");
  NIBBLE_CHECK(embd.ne.size() == 2, "{}: tensor 'token_embd.weight' has {} dimensions, expected 2", file,
               embd.ne.size());
  c.vocab_size = embd.ne[1];
  c.tie_word_embeddings = !f.contains("output.weight");
  const bool qkv_bias = f.contains("blk.0.attn_q.bias");
  c.attention_bias = qkv_bias && model_type != "qwen2";  // qwen2's q/k/v biases are implied by the architecture
  c.mlp_bias = f.contains("blk.0.ffn_gate.bias");
  c.layer_windows.assign(static_cast<size_t>(c.num_layers), 0);

  const io::GgufVocab voc = f.vocab();
  c.bos_token_id = voc.bos_id;
  if (voc.eos_id) c.eos_token_ids.push_back(*voc.eos_id);
  if (voc.eot_id && voc.eot_id != voc.eos_id) c.eos_token_ids.push_back(*voc.eot_id);
  return c;
}

}  // namespace

std::unique_ptr<GgufSource> GgufSource::open(const std::filesystem::path& path) {
  auto src = std::unique_ptr<GgufSource>(new GgufSource());
  src->file_ = GgufFile::open(path);
  const GgufFile& f = src->file_;
  const std::string file = path.string();
  src->config_ = config_from_metadata(f);
  const ModelConfig& c = src->config_;
  const bool permuted = c.model_type == "llama";  // qwen2/qwen3 use NEOX rope: rows are stored in HF order

  for (const io::GgufTensorInfo& t : f.tensors()) {
    if (t.name == kRopeFreqs) continue;  // folded into config().rope_scaling
    const auto m = map_name(t.name);
    NIBBLE_CHECK(m, "{}: tensor '{}' has no Hugging Face counterpart for a {} model (known: {})", file, t.name,
                 c.model_type, known_names());
    NIBBLE_CHECK(m->layer < c.num_layers, "{}: tensor '{}' is in block {}, but {}.block_count is {}", file, t.name,
                 m->layer, f.get_string("general.architecture"), c.num_layers);
    Entry e;
    e.gguf_name = t.name;
    e.meta.name = m->hf;
    e.meta.shape = t.shape();
    e.meta.dtype = plain_dtype(t.type).value_or(DType::F32);
    e.meta.stored_bytes = t.nbytes;
    if (permuted && m->base == "attn_q") e.unpermute_heads = c.num_heads;
    if (permuted && m->base == "attn_k") e.unpermute_heads = c.num_kv_heads;
    src->order_.push_back(m->hf);
    src->entries_.emplace(m->hf, std::move(e));
  }
  // Shapes checked here, before any load, so that the row permutation below
  // only ever sees q/k rows of heads × head_dim.
  src->validate_against_config();
  return src;
}

std::unique_ptr<ModelSource> open_gguf(const std::filesystem::path& path) { return GgufSource::open(path); }

std::string GgufSource::describe() const { return file_.path().string(); }

std::optional<GgufSource::TokenizerSpec> GgufSource::tokenizer_spec() const {
  const io::GgufVocab v = vocab();
  if (v.tokens.empty()) return std::nullopt;
  TokenizerSpec spec;
  // First: it checks the BOS/EOS ids against the tokens that are indexed below.
  spec.json = io::tokenizer_json_from_gguf(v, describe());
  TokenizerConfig& tc = spec.config;
  if (v.bos_id) tc.bos_token = v.tokens[*v.bos_id];
  if (v.eos_id) tc.eos_token = v.tokens[*v.eos_id];
  if (v.padding_id && *v.padding_id < static_cast<int64_t>(v.tokens.size())) tc.pad_token = v.tokens[*v.padding_id];
  tc.add_bos_token = v.add_bos;
  tc.add_eos_token = v.add_eos;
  tc.chat_template = v.chat_template;
  return spec;
}

std::optional<Tokenizer> GgufSource::tokenizer() const {
  const std::optional<TokenizerSpec> spec = tokenizer_spec();
  if (!spec) return std::nullopt;
  return Tokenizer::from_json(spec->json, describe() + " (tokenizer.ggml.*)", spec->config);
}

const GgufSource::Entry& GgufSource::entry(const std::string& name) const {
  auto it = entries_.find(name);
  NIBBLE_CHECK(it != entries_.end(), "{}: no tensor named '{}'", describe(), name);
  return it->second;
}

const std::string& GgufSource::gguf_name(const std::string& name) const { return entry(name).gguf_name; }

TensorMeta GgufSource::meta(const std::string& name) const { return entry(name).meta; }

bool GgufSource::is_plain(const std::string& name) const {
  return plain_dtype(file_.info(entry(name).gguf_name).type).has_value();
}

std::string GgufSource::foreign_format(const std::string& name) const {
  const uint32_t type = file_.info(entry(name).gguf_name).type;
  return plain_dtype(type) ? std::string() : io::ggml_type_name(type);
}

std::optional<FormatChoice> GgufSource::exact_format(const std::string& name) const {
  const ExactBlockType* r = exact_block_type(file_.info(entry(name).gguf_name));
  if (r == nullptr) return std::nullopt;
  return find_format(r->family, r->group);
}

std::vector<Tensor> GgufSource::exact_parts(const std::string& name) const {
  const Entry& e = entry(name);
  const io::GgufTensorInfo& t = file_.info(e.gguf_name);
  const ExactBlockType* r = exact_block_type(t);
  NIBBLE_CHECK(r != nullptr, "{}: '{}' ({}) has no exact nibble format", describe(), e.gguf_name,
               io::ggml_type_name(t.type));
  const int64_t rows = t.ne[1], cols = t.ne[0];
  std::vector<Tensor> parts = r->parts(file_.data(t), rows, cols);
  if (e.unpermute_heads > 0)
    for (Tensor& p : parts) p = unpermute_rows(p, e.unpermute_heads);
  check_parts(find_format(r->family, r->group), parts, rows, cols);
  return parts;
}

Tensor GgufSource::load(const std::string& name) const {
  const Entry& e = entry(name);
  const io::GgufTensorInfo& t = file_.info(e.gguf_name);
  Tensor out = plain_dtype(t.type) ? file_.view(e.gguf_name) : file_.dequantize(e.gguf_name);
  if (e.unpermute_heads > 0) {
    NIBBLE_CHECK(out.dim() >= 1 && out.size(0) % (2 * e.unpermute_heads) == 0,
                 "{}: tensor '{}' has {} rows, not a whole number of {} heads of even size", describe(), e.gguf_name,
                 out.dim() ? out.size(0) : 0, e.unpermute_heads);
    out = unpermute_rows(out, e.unpermute_heads);
  }
  return out;
}

void GgufSource::check_loadable() const {
  for (const std::string& name : order_)
    if (!is_plain(name)) file_.require_dequantizable(gguf_name(name));
}

bool is_gguf_file(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return false;
  std::ifstream f(path, std::ios::binary);
  char magic[4] = {};
  return f.read(magic, 4) && std::string_view(magic, 4) == "GGUF";
}

}  // namespace nibble
