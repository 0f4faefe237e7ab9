// GGUF test files shared by the GGUF tests and the CPU packed-linear tests:
// llama.cpp's tensor names, and a one-layer llama whose every matrix is Q4_K, Q5_K or Q6_K.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "gguf_builder.h"
#include "nibble/arch.h"
#include "nibble/gguf.h"
#include "nibble/model.h"

namespace nibble::test {

// HF name -> GGUF name (llama.cpp's tensor names).
inline std::string to_gguf_name(const std::string& hf) {
  static const std::vector<std::pair<std::string, std::string>> whole = {
      {"model.embed_tokens.weight", "token_embd.weight"}, {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}};
  for (const auto& [a, b] : whole)
    if (hf == a) return b;
  static const std::vector<std::pair<std::string, std::string>> parts = {
      {"input_layernorm", "attn_norm"}, {"self_attn.q_proj", "attn_q"},   {"self_attn.k_proj", "attn_k"},
      {"self_attn.v_proj", "attn_v"},   {"self_attn.o_proj", "attn_output"}, {"self_attn.q_norm", "attn_q_norm"},
      {"self_attn.k_norm", "attn_k_norm"}, {"post_attention_layernorm", "ffn_norm"}, {"mlp.gate_proj", "ffn_gate"},
      {"mlp.up_proj", "ffn_up"},        {"mlp.down_proj", "ffn_down"}};
  const std::string rest = hf.substr(std::string("model.layers.").size());  // "N.part.weight"
  const size_t dot = rest.find('.');
  const std::string layer = rest.substr(0, dot), tail = rest.substr(dot + 1);
  for (const auto& [a, b] : parts)
    if (tail.rfind(a + ".", 0) == 0) return "blk." + layer + "." + b + tail.substr(a.size());
  ADD_FAILURE() << "no GGUF name for " << hf;
  return hf;
}

// No stories260K file holds a K-quant matrix (none there is whole 256-wide blocks), so this writes a one-layer
// llama (hidden 256, intermediate 512, 4 and 2 heads) whose every matrix is `type` (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K
// or IQ4_XS) of pseudo-random blocks; norms are 1. Q4_K / Q5_K: d and dmin of both signs, subnormal and zero among them,
// every pair of 6-bit scale and min (0 included) and every code (Q5_K's 5th bits random). Q2_K, Q3_K, Q6_K: d (and
// Q2_K's dmin) likewise, every code, and every sub-block scale: Q2_K's (scale, min) nibble pairs and Q6_K's int8
// scales in turn (-128 and 0 included), Q3_K's and IQ4_XS's 6-bit ones at random. Returns the matrices written (8: the
// embedding; q, k, v, o, gate, up, down) and the sub-blocks written (Q4_K / Q5_K: of 32, at least 64 · 64,
// sub-block 64a + r having scale r and min 29r + a mod 64; IQ4_XS: of 32; the others: of 16, sub-block t having
// the scale byte t mod 256 for Q2_K and Q6_K).
// `runnable`: d and dmin in [2^-10, 2^-6) (still of both signs, with zeros), so
// that a forward stays finite and non-zero; otherwise any finite f16 (subnormals
// and 65504 included), whose activations overflow within the layer.
inline std::pair<int, int64_t> write_k_quant_llama(const std::filesystem::path& file,
                                                   io::GgmlType type = io::GgmlType::Q4_K, bool runnable = false) {
  ModelConfig c;
  c.model_type = "llama";
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_layers = 1;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.vocab_size = 32;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = true;

  GgufBuilder b;
  b.kv_str("general.architecture", "llama");
  b.kv_u32("llama.context_length", static_cast<uint32_t>(c.max_position_embeddings));
  b.kv_u32("llama.embedding_length", static_cast<uint32_t>(c.hidden_size));
  b.kv_u32("llama.block_count", static_cast<uint32_t>(c.num_layers));
  b.kv_u32("llama.feed_forward_length", static_cast<uint32_t>(c.intermediate_size));
  b.kv_u32("llama.attention.head_count", static_cast<uint32_t>(c.num_heads));
  b.kv_u32("llama.attention.head_count_kv", static_cast<uint32_t>(c.num_kv_heads));
  b.kv_f32("llama.attention.layer_norm_rms_epsilon", 1e-5f);

  std::mt19937 rng(7);
  int64_t sub = 0;  // sub-blocks written so far: scale and min cycle through 0..63 with it
  // A finite f16 of sign `neg`: ±0, else any exponent but 31 (subnormals included).
  auto f16 = [&](bool neg, bool zero) {
    const uint32_t exponent = runnable ? 5 + rng() % 4 : rng() % 31, mantissa = rng() & 0x3FF;
    return static_cast<uint16_t>((neg ? 0x8000u : 0u) | (zero ? 0u : (exponent << 10) | mantissa));
  };
  auto put16 = [](std::string& bytes, uint16_t h) {
    bytes += static_cast<char>(h & 0xFF);
    bytes += static_cast<char>(h >> 8);
  };
  auto random_bytes = [&](std::string& bytes, int n) {
    for (int k = 0; k < n; ++k) bytes += static_cast<char>(rng() & 0xFF);
  };
  // Q4_K / Q5_K super-blocks: d, dmin, 12 bytes of scales and mins, (Q5_K) qh[32], qs[128].
  auto k_bytes = [&](int64_t n_super, bool q5) {
    std::string bytes;
    for (int64_t i = 0; i < n_super; ++i) {
      // Signs and zeros on periods prime to the scales' 8 super-blocks, so that
      // sc = 0 and mn = 0 meet d and dmin of either sign.
      const int64_t sb = sub / 8;
      put16(bytes, f16(sb % 3 == 1, sb % 97 == 5));
      put16(bytes, f16(sb % 5 >= 3, sb % 89 == 7));
      // 8 six-bit scales and mins, packed from ggml-common.h's layout: bytes
      // 0-3 (scales) and 4-7 (mins) hold sub-blocks 0-3 in their low 6 bits and
      // the top 2 bits of sub-blocks 4-7 in their top 2; bytes 8-11 hold the low
      // 4 bits of sub-block 4+j's scale (low nibble) and min (high nibble).
      int sc[8], mn[8];
      for (int j = 0; j < 8; ++j, ++sub) {
        sc[j] = static_cast<int>(sub % 64);
        mn[j] = static_cast<int>((sub * 29 + sub / 64) % 64);
      }
      char packed[12];
      for (int j = 0; j < 4; ++j) {
        packed[j] = static_cast<char>(sc[j] | ((sc[j + 4] >> 4) << 6));
        packed[j + 4] = static_cast<char>(mn[j] | ((mn[j + 4] >> 4) << 6));
        packed[j + 8] = static_cast<char>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
      }
      bytes.append(packed, 12);
      random_bytes(bytes, q5 ? 32 + 128 : 128);
    }
    return bytes;
  };
  // Q6_K super-blocks: ql[128], qh[64], int8 scales[16], d.
  auto q6_k_bytes = [&](int64_t n_super) {
    std::string bytes;
    for (int64_t i = 0; i < n_super; ++i) {
      random_bytes(bytes, 128 + 64);
      for (int t = 0; t < 16; ++t, ++sub) bytes += static_cast<char>(sub % 256);
      put16(bytes, f16(i % 3 == 1, i % 97 == 5));
    }
    return bytes;
  };
  // Q2_K super-blocks: a (scale, min) nibble pair per sub-block of 16, qs[64], d, dmin.
  auto q2_k_bytes = [&](int64_t n_super) {
    std::string bytes;
    for (int64_t i = 0; i < n_super; ++i) {
      for (int t = 0; t < 16; ++t, ++sub) bytes += static_cast<char>(sub % 256);
      random_bytes(bytes, 64);
      put16(bytes, f16(i % 3 == 1, i % 97 == 5));
      put16(bytes, f16(i % 5 >= 3, i % 89 == 7));
    }
    return bytes;
  };
  // Q3_K super-blocks: hmask[32], qs[64], 12 bytes of 6-bit scales (random: every scale among them), d.
  auto q3_k_bytes = [&](int64_t n_super) {
    std::string bytes;
    for (int64_t i = 0; i < n_super; ++i, sub += 16) {
      random_bytes(bytes, 32 + 64 + 12);
      put16(bytes, f16(i % 3 == 1, i % 97 == 5));
    }
    return bytes;
  };
  // IQ4_XS super-blocks: d, scales_h (2 bytes), scales_l[4] (random: every 6-bit scale among them), qs[128].
  auto iq4_xs_bytes = [&](int64_t n_super) {
    std::string bytes;
    for (int64_t i = 0; i < n_super; ++i, sub += 8) {
      put16(bytes, f16(i % 3 == 1, i % 97 == 5));
      random_bytes(bytes, 2 + 4 + 128);
    }
    return bytes;
  };
  auto blocks = [&](int64_t n_super) {
    switch (type) {
      case io::GgmlType::IQ4_XS: return iq4_xs_bytes(n_super);
      case io::GgmlType::Q2_K: return q2_k_bytes(n_super);
      case io::GgmlType::Q3_K: return q3_k_bytes(n_super);
      case io::GgmlType::Q6_K: return q6_k_bytes(n_super);
      default: return k_bytes(n_super, type == io::GgmlType::Q5_K);
    }
  };
  int written = 0;
  for (const ExpectedTensor& e : expected_tensors(c)) {
    const std::string g = to_gguf_name(e.name);
    if (e.shape.size() == 2) {
      EXPECT_EQ(e.shape[1] % 256, 0) << e.name;
      b.tensor(g, {static_cast<uint64_t>(e.shape[1]), static_cast<uint64_t>(e.shape[0])},
               static_cast<uint32_t>(type), blocks(e.shape[0] * e.shape[1] / 256));
      ++written;
    } else {
      Tensor t = Tensor::empty(DType::F32, e.shape);
      for (int64_t i = 0; i < t.numel(); ++i) t.data_mut<float>()[i] = 1.0f;
      b.tensor_f32(g, t);
    }
  }
  b.write(file);
  return {written, sub};

}

}  // namespace nibble::test
