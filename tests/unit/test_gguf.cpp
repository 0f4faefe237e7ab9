// GGUF reader and dequantizers: hand-made blocks worked from each type's
// definition, every tensor and metadata value of real llama.cpp files and of
// a synthetic file of random blocks against gguf-py (llama.cpp's own Python
// reader and numpy dequantizers, an independent implementation), and
// malformed files, each with the one-line error it must give.
#include <gtest/gtest.h>

#include <bit>
#include <cctype>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include <nlohmann/json.hpp>

#include "gguf_builder.h"
#include "nibble/dtype.h"
#include "nibble/gguf.h"
#include "nibble/npy.h"
#include "test_util.h"

namespace nibble::io {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::GgufBuilder;
using test::TempDir;

fs::path gguf_dir() { return test::model_dir("stories260K") / "gguf"; }

std::string f16_bytes(float v) {
  const uint16_t h = f32_to_f16(v);
  return {static_cast<char>(h & 0xff), static_cast<char>(h >> 8)};
}

std::vector<float> dequant(GgmlType type, const std::string& block, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  ggml_dequantize(static_cast<uint32_t>(type), reinterpret_cast<const uint8_t*>(block.data()), block.size(),
                  out.data(), n);
  return out;
}

// Bit-for-bit equality of two floats (so -0 vs 0 counts as a difference).
void expect_same_bits(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << "element " << i << ": got " << got[i] << ", want " << want[i];
}

// ---------------------------------------------------------------- hand-made blocks
// Each block is packed here from the layout ggml-common.h describes (the
// encode direction, which the reader never does) and the expected values are
// the definition's formula evaluated in f32.

TEST(GgufDequant, HandMadeLegacyBlocks) {
  {  // Q8_0: f16 d, int8 q[32]; x = q·d
    std::string b = f16_bytes(0.25f);
    std::vector<float> want;
    for (int j = 0; j < 32; ++j) {
      b += static_cast<char>(static_cast<int8_t>(j * 8 - 128));
      want.push_back(static_cast<float>(j * 8 - 128) * 0.25f);
    }
    SCOPED_TRACE("Q8_0");
    expect_same_bits(dequant(GgmlType::Q8_0, b, 32), want);
  }
  // Q4_0 / Q4_1 / IQ4_NL: x[j] from the low nibble of byte j, x[j+16] from its high nibble.
  int codes[32];
  for (int j = 0; j < 16; ++j) codes[j] = j, codes[j + 16] = 15 - j;
  std::string nibbles;
  for (int j = 0; j < 16; ++j) nibbles += static_cast<char>(codes[j] | (codes[j + 16] << 4));
  {
    std::vector<float> want;
    for (int c : codes) want.push_back(static_cast<float>(c - 8) * 0.5f);
    SCOPED_TRACE("Q4_0");
    expect_same_bits(dequant(GgmlType::Q4_0, f16_bytes(0.5f) + nibbles, 32), want);
  }
  {
    std::vector<float> want;
    for (int c : codes) want.push_back(static_cast<float>(c) * 0.25f + -1.5f);
    SCOPED_TRACE("Q4_1");
    expect_same_bits(dequant(GgmlType::Q4_1, f16_bytes(0.25f) + f16_bytes(-1.5f) + nibbles, 32), want);
  }
  {
    // kvalues_iq4nl, the 16-level grid IQ4_NL indexes.
    const int grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
    std::vector<float> want;
    for (int c : codes) want.push_back(2.0f * static_cast<float>(grid[c]));
    SCOPED_TRACE("IQ4_NL");
    expect_same_bits(dequant(GgmlType::IQ4_NL, f16_bytes(2.0f) + nibbles, 32), want);
  }
  // Q5_0 / Q5_1: 5-bit codes; bit i of the little-endian u32 qh is the 5th bit of x[i].
  int q5[32];
  for (int i = 0; i < 32; ++i) q5[i] = (i * 7 + 3) % 32;
  uint32_t qh = 0;
  std::string qs;
  for (int i = 0; i < 32; ++i) qh |= static_cast<uint32_t>((q5[i] >> 4) & 1) << i;
  for (int j = 0; j < 16; ++j) qs += static_cast<char>((q5[j] & 15) | ((q5[j + 16] & 15) << 4));
  std::string qh_bytes;
  test::put_u32(qh_bytes, qh);
  {
    std::vector<float> want;
    for (int c : q5) want.push_back(static_cast<float>(c - 16) * 1.5f);
    SCOPED_TRACE("Q5_0");
    expect_same_bits(dequant(GgmlType::Q5_0, f16_bytes(1.5f) + qh_bytes + qs, 32), want);
  }
  {
    std::vector<float> want;
    for (int c : q5) want.push_back(static_cast<float>(c) * 0.5f + 2.0f);
    SCOPED_TRACE("Q5_1");
    expect_same_bits(dequant(GgmlType::Q5_1, f16_bytes(0.5f) + f16_bytes(2.0f) + qh_bytes + qs, 32), want);
  }
}

TEST(GgufDequant, HandMadePlainValues) {
  const std::vector<float> v = {0.0f, -0.0f, 1.0f, -2.5f, 65504.0f, 5.9604645e-8f /* smallest f16 subnormal */};
  std::string f16s, bf16s, f32s;
  for (float x : v) {
    f16s += f16_bytes(x);
    const uint16_t b = f32_to_bf16(x);
    bf16s += static_cast<char>(b & 0xff);
    bf16s += static_cast<char>(b >> 8);
    test::put_f32(f32s, x);
  }
  expect_same_bits(dequant(GgmlType::F16, f16s, 6), v);
  expect_same_bits(dequant(GgmlType::F32, f32s, 6), v);
  std::vector<float> vb;
  for (float x : v) vb.push_back(round_to_bf16(x));
  expect_same_bits(dequant(GgmlType::BF16, bf16s, 6), vb);
}

// Q4_K / Q5_K scales: 8 six-bit scales and mins in 12 bytes. Bytes 0-3: the
// low 6 bits of scales 0-3 and, in their top 2 bits, the top bits of scales
// 4-7; bytes 4-7 the same for the mins; bytes 8-11: low nibble = low 4 bits of
// scale 4+j, high nibble = low 4 bits of min 4+j.
std::string pack_k_scales(const int sc[8], const int mn[8]) {
  std::string s(12, '\0');
  for (int j = 0; j < 4; ++j) {
    s[j] = static_cast<char>((sc[j] & 63) | ((sc[j + 4] >> 4) << 6));
    s[j + 4] = static_cast<char>((mn[j] & 63) | ((mn[j + 4] >> 4) << 6));
    s[j + 8] = static_cast<char>((sc[j + 4] & 15) | ((mn[j + 4] & 15) << 4));
  }
  return s;
}

// Element i = 32·s + l of a Q4_K/Q5_K super-block is in sub-block s; its low 4
// bits are the low (s even) or high (s odd) nibble of qs[32·(s/2) + l], and
// Q5_K's 5th bit is bit s of qh[l].
TEST(GgufDequant, HandMadeQ4KAndQ5K) {
  const int sc[8] = {1, 63, 17, 32, 5, 44, 60, 2}, mn[8] = {0, 7, 63, 31, 48, 1, 12, 33};
  const float d = 0.5f, dmin = 0.25f;
  for (bool five : {false, true}) {
    SCOPED_TRACE(five ? "Q5_K" : "Q4_K");
    int q[256];
    for (int i = 0; i < 256; ++i) q[i] = five ? (i * 11 + 7) % 32 : (i * 5 + 3) % 16;
    std::string qs(128, '\0'), qh(32, '\0');
    for (int i = 0; i < 256; ++i) {
      const int s = i / 32, l = i % 32;
      auto& byte = qs[32 * (s / 2) + l];
      byte = static_cast<char>(byte | ((q[i] & 15) << (s % 2 ? 4 : 0)));
      if (five) qh[l] = static_cast<char>(qh[l] | (((q[i] >> 4) & 1) << s));
    }
    std::vector<float> want;
    for (int i = 0; i < 256; ++i) {
      const int s = i / 32;
      want.push_back(d * static_cast<float>(sc[s]) * static_cast<float>(q[i]) - dmin * static_cast<float>(mn[s]));
    }
    const std::string block = f16_bytes(d) + f16_bytes(dmin) + pack_k_scales(sc, mn) + (five ? qh : "") + qs;
    ASSERT_EQ(block.size(), five ? 176u : 144u);
    expect_same_bits(dequant(five ? GgmlType::Q5_K : GgmlType::Q4_K, block, 256), want);
  }
}

// Q6_K: element i = 128·h + 32·r + l (half h, run r, lane l). Low 4 bits: run
// 0/1 the low nibble of ql[64h + l] / ql[64h + 32 + l], run 2/3 their high
// nibbles; top 2 bits: bits 2r..2r+1 of qh[32h + l]; int8 scale of each 16
// elements; x = (d·scale)·(q − 32). The f16 d comes last in the block.
TEST(GgufDequant, HandMadeQ6K) {
  int q[256];
  for (int i = 0; i < 256; ++i) q[i] = (i * 13 + 5) % 64;
  int8_t sc[16];
  for (int k = 0; k < 16; ++k) sc[k] = static_cast<int8_t>(k % 2 ? 127 - 9 * k : -128 + 11 * k);
  std::string ql(128, '\0'), qh(64, '\0'), scales(16, '\0');
  for (int i = 0; i < 256; ++i) {
    const int h = i / 128, r = (i % 128) / 32, l = i % 32;
    auto& lo = ql[64 * h + 32 * (r % 2) + l];
    lo = static_cast<char>(lo | ((q[i] & 15) << (r >= 2 ? 4 : 0)));
    qh[32 * h + l] = static_cast<char>(qh[32 * h + l] | ((q[i] >> 4) << (2 * r)));
  }
  for (int k = 0; k < 16; ++k) scales[k] = static_cast<char>(sc[k]);
  const float d = 0.125f;
  std::vector<float> want;
  for (int i = 0; i < 256; ++i) want.push_back(d * static_cast<float>(sc[i / 16]) * static_cast<float>(q[i] - 32));
  expect_same_bits(dequant(GgmlType::Q6_K, ql + qh + scales + f16_bytes(d), 256), want);
}

// The 2-bit fields of Q2_K, Q3_K and TQ2_0 (64 bytes per 256 elements): element
// i = 128·h + 32·s + l is bits 2s..2s+1 of qs[32h + l].
void put_two_bit(std::string& qs, int i, int q) {
  auto& byte = qs[32 * (i / 128) + i % 32];
  byte = static_cast<char>(byte | ((q & 3) << (2 * ((i / 32) % 4))));
}

// Q2_K: the scales byte of sub-block i / 16 holds a 4-bit scale (low nibble)
// and min (high nibble); f16 d and dmin come last; x = (d·scale)·q − dmin·min.
TEST(GgufDequant, HandMadeQ2K) {
  int q[256], sc[16], mn[16];
  for (int i = 0; i < 256; ++i) q[i] = (i * 7 + 1) % 4;
  for (int k = 0; k < 16; ++k) sc[k] = (5 * k + 3) % 16, mn[k] = (3 * k + 1) % 16;
  std::string scales(16, '\0'), qs(64, '\0');
  for (int k = 0; k < 16; ++k) scales[k] = static_cast<char>(sc[k] | (mn[k] << 4));
  for (int i = 0; i < 256; ++i) put_two_bit(qs, i, q[i]);
  const float d = 0.5f, dmin = 0.25f;
  std::vector<float> want;
  for (int i = 0; i < 256; ++i)
    want.push_back(d * static_cast<float>(sc[i / 16]) * static_cast<float>(q[i]) - dmin * static_cast<float>(mn[i / 16]));
  expect_same_bits(dequant(GgmlType::Q2_K, scales + qs + f16_bytes(d) + f16_bytes(dmin), 256), want);
}

// Q3_K: q in −4..3, stored as its low 2 bits (the 2-bit fields) and a high
// bit in hmask (bit i / 32 of hmask[i % 32]) that is set when q ≥ 0 (a clear
// bit subtracts 4). 16 six-bit scales in 12 bytes: the low nibble of byte
// k % 8 (k < 8) or its high nibble (k ≥ 8), and bits 2(k / 4)..+1 of byte
// 8 + k % 4 on top; x = (d·(scale − 32))·q.
TEST(GgufDequant, HandMadeQ3K) {
  int q[256], sc[16];
  for (int i = 0; i < 256; ++i) q[i] = (i * 5 + 2) % 8 - 4;
  for (int k = 0; k < 16; ++k) sc[k] = (k * 23 + 9) % 64;
  std::string hmask(32, '\0'), qs(64, '\0'), scales(12, '\0');
  for (int i = 0; i < 256; ++i) {
    put_two_bit(qs, i, q[i]);  // the low 2 bits (two's complement)
    if (q[i] >= 0) hmask[i % 32] = static_cast<char>(hmask[i % 32] | (1 << (i / 32)));
  }
  for (int k = 0; k < 16; ++k) {
    scales[k % 8] = static_cast<char>(scales[k % 8] | ((sc[k] & 15) << (k < 8 ? 0 : 4)));
    scales[8 + k % 4] = static_cast<char>(scales[8 + k % 4] | ((sc[k] >> 4) << (2 * (k / 4))));
  }
  const float d = 0.25f;
  std::vector<float> want;
  for (int i = 0; i < 256; ++i) want.push_back(d * static_cast<float>(sc[i / 16] - 32) * static_cast<float>(q[i]));
  expect_same_bits(dequant(GgmlType::Q3_K, hmask + qs + scales + f16_bytes(d), 256), want);
}

// IQ4_XS: f16 d, u16 scales_h, scales_l[4], qs[128]; sub-block k of 32 has the
// six-bit scale (nibble k % 2 of scales_l[k / 2]) | (bits 2k..2k+1 of
// scales_h) << 4, and IQ4_NL's packing of its codes in qs[16k..16k + 15];
// x = (d·(scale − 32))·kvalues[q].
TEST(GgufDequant, HandMadeIq4Xs) {
  const int grid[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
  int c[256], ls[8];
  for (int i = 0; i < 256; ++i) c[i] = (i * 9 + 4) % 16;
  for (int k = 0; k < 8; ++k) ls[k] = (k * 29 + 5) % 64;
  std::string scales_l(4, '\0'), qs(128, '\0');
  unsigned scales_h = 0;
  for (int k = 0; k < 8; ++k) {
    scales_l[k / 2] = static_cast<char>(scales_l[k / 2] | ((ls[k] & 15) << (4 * (k % 2))));
    scales_h |= static_cast<unsigned>(ls[k] >> 4) << (2 * k);
  }
  for (int k = 0; k < 8; ++k)
    for (int j = 0; j < 16; ++j) qs[16 * k + j] = static_cast<char>(c[32 * k + j] | (c[32 * k + 16 + j] << 4));
  const float d = 0.0625f;
  std::vector<float> want;
  for (int i = 0; i < 256; ++i) want.push_back(d * static_cast<float>(ls[i / 32] - 32) * static_cast<float>(grid[c[i]]));
  const std::string block = f16_bytes(d) + std::string{static_cast<char>(scales_h & 0xff), static_cast<char>(scales_h >> 8)} +
                            scales_l + qs;
  expect_same_bits(dequant(GgmlType::IQ4_XS, block, 256), want);
}

// The ternary types: t in {−1, 0, 1}, x = t·d. TQ2_0 stores t + 1 in the
// 2-bit fields. TQ1_0 packs base-3 digits t + 1 into bytes as
// v = ⌈n·256 / 243⌉ for n = 81 t0 + 27 t1 + 9 t2 + 3 t3 + t4 (qh: four digits,
// t4 = 0); digit j of qs[l] (l < 32) is element 32j + l, of qs[32 + l]
// element 160 + 16j + l, of qh[l] element 240 + 4j + l.
TEST(GgufDequant, HandMadeTernary) {
  int t[256];
  for (int i = 0; i < 256; ++i) t[i] = (i * 7 + i / 11) % 3 - 1;
  const float d = 1.5f;
  std::vector<float> want;
  for (int i = 0; i < 256; ++i) want.push_back(static_cast<float>(t[i]) * d);
  {
    std::string qs(64, '\0');
    for (int i = 0; i < 256; ++i) put_two_bit(qs, i, t[i] + 1);
    SCOPED_TRACE("TQ2_0");
    expect_same_bits(dequant(GgmlType::TQ2_0, qs + f16_bytes(d), 256), want);
  }
  auto pack = [&](std::initializer_list<int> elements) {
    int n = 0, digits = 0;
    for (int e : elements) n = 3 * n + t[e] + 1, ++digits;
    for (; digits < 5; ++digits) n *= 3;
    return static_cast<char>((n * 256 + 242) / 243);
  };
  std::string qs, qh;
  for (int l = 0; l < 32; ++l) qs += pack({l, 32 + l, 64 + l, 96 + l, 128 + l});
  for (int l = 0; l < 16; ++l) qs += pack({160 + l, 176 + l, 192 + l, 208 + l, 224 + l});
  for (int l = 0; l < 4; ++l) qh += pack({240 + l, 244 + l, 248 + l, 252 + l});
  SCOPED_TRACE("TQ1_0");
  expect_same_bits(dequant(GgmlType::TQ1_0, qs + qh + f16_bytes(d), 256), want);
}

// MXFP4: one E8M0 byte e (scale 2^(e − 127)) and 16 bytes of E2M1 codes, x[j]
// the low nibble of byte j, x[j + 16] its high nibble. ggml decodes through
// integers (the E2M1 values doubled, times 2^(e − 128)), so code 8 (−0) gives
// +0. e = 0 and 1 make the scale subnormal.
TEST(GgufDequant, HandMadeMxfp4) {
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, 0, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  int codes[32];
  for (int j = 0; j < 32; ++j) codes[j] = (j * 5 + 1) % 16;
  std::string nibbles;
  for (int j = 0; j < 16; ++j) nibbles += static_cast<char>(codes[j] | (codes[j + 16] << 4));
  for (int e : {0, 1, 120, 127, 130, 254}) {
    SCOPED_TRACE(e);
    std::vector<float> want;
    for (int c : codes) want.push_back(std::ldexp(e2m1[c], e - 127));
    expect_same_bits(dequant(GgmlType::MXFP4, std::string(1, static_cast<char>(e)) + nibbles, 32), want);
  }
}

// NVFP4: 64 elements in 4 sub-blocks of 16, each with an unsigned E4M3 scale
// (bias 7; exponent 0 is subnormal: m·2^-9; 0x7F, the NaN, reads as 0) and the
// packing of MXFP4 over 8 bytes (x[j] low nibble of byte j, x[j + 8] its high
// nibble); x = scale·e2m1[q].
TEST(GgufDequant, HandMadeNvfp4) {
  const float e2m1[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, 0, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  // Scale bytes: 1 (e 7, m 0), the subnormal 3·2^-9 (e 0, m 3), the largest 448 (e 15, m 6; m 7 is the NaN),
  // and the NaN (0 · a negative value is −0).
  const uint8_t sb[4] = {0x38, 0x03, 0x7E, 0x7F};
  const float scale[4] = {1.0f, 3.0f / 512.0f, 448.0f, 0.0f};
  int codes[64];
  for (int j = 0; j < 64; ++j) codes[j] = (j * 7 + 3) % 16;
  std::string block(reinterpret_cast<const char*>(sb), 4);
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 8; ++j) block += static_cast<char>(codes[16 * k + j] | (codes[16 * k + 8 + j] << 4));
  std::vector<float> want;
  for (int j = 0; j < 64; ++j) want.push_back(scale[j / 16] * e2m1[codes[j]]);  // code 8 (−0) gives +0
  expect_same_bits(dequant(GgmlType::NVFP4, block, 64), want);
}

TEST(GgufDequant, RefusesWhatItCannotDo) {
  const std::string b(66, '\0');
  EXPECT_NE(test::error_of([&] { dequant(GgmlType::IQ2_XXS, b, 256); }).find("IQ2_XXS is not supported"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { dequant(GgmlType::Q4_0, std::string(18, '\0'), 16); }).find("32-blocks"),
            std::string::npos);
  EXPECT_NE(test::error_of([&] { dequant(GgmlType::Q4_0, std::string(17, '\0'), 32); }).find("need 18 bytes"),
            std::string::npos);
  std::vector<float> out(32);
  EXPECT_NE(test::error_of([&] { ggml_dequantize(99, nullptr, 0, out.data(), 0); }).find("unknown type 99"),
            std::string::npos);
}

// ---------------------------------------------------------------- against gguf-py

bool have_gguf_py() { return test::run_command("python3 -c 'import gguf, numpy'").exit_code == 0; }
std::string reference_script() { return (test::source_dir() / "tests" / "py" / "gguf_reference.py").string(); }

json dump_reference(const fs::path& gguf, const fs::path& out) {
  const auto r = test::run_command("python3 " + reference_script() + " dump " + gguf.string() + " " + out.string());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::ifstream f(out / "manifest.json");
  return json::parse(f);
}

struct Agreement {
  int64_t elements = 0, differing = 0;  // bitwise
  int64_t max_ulp = 0;
};

// Every tensor of the file against gguf-py's dequantization; names, types,
// shapes and offsets against gguf-py's reader.
Agreement compare_tensors(const GgufFile& f, const json& manifest, const fs::path& dir) {
  Agreement a;
  EXPECT_EQ(f.version(), manifest["version"].get<uint32_t>());
  EXPECT_EQ(f.alignment(), manifest["alignment"].get<uint64_t>());
  const auto& ts = manifest["tensors"];
  EXPECT_EQ(f.tensors().size(), ts.size());
  for (size_t k = 0; k < std::min(ts.size(), f.tensors().size()); ++k) {
    const GgufTensorInfo& t = f.tensors()[k];
    SCOPED_TRACE(t.name);
    EXPECT_EQ(t.name, ts[k]["name"].get<std::string>());
    EXPECT_EQ(ggml_type_name(t.type), ts[k]["type"].get<std::string>());
    EXPECT_EQ(t.ne, ts[k]["ne"].get<std::vector<int64_t>>());
    EXPECT_EQ(f.data_offset() + t.offset, ts[k]["offset"].get<uint64_t>());
    EXPECT_EQ(t.nbytes, ts[k]["nbytes"].get<uint64_t>());
    const Tensor mine = f.dequantize(t.name);
    const Tensor ref = read_npy(dir / ts[k]["npy"].get<std::string>());
    EXPECT_EQ(mine.shape(), ref.shape());
    if (mine.shape() != ref.shape()) continue;
    const auto* x = mine.data<float>();
    const auto* y = ref.data<float>();
    for (int64_t i = 0; i < mine.numel(); ++i) {
      const auto bx = std::bit_cast<int32_t>(x[i]), by = std::bit_cast<int32_t>(y[i]);
      ++a.elements;
      if (bx == by) continue;
      ++a.differing;
      a.max_ulp = std::max<int64_t>(a.max_ulp, std::abs(static_cast<int64_t>(bx) - by));
    }
  }
  return a;
}

// A metadata value's leaves in order (gguf-py's contents() flattens nested arrays).
void leaves(const GgufValue& v, json& out) {
  switch (v.type) {
    case GgufType::Array:
      for (const GgufValue& e : v.array) leaves(e, out);
      return;
    case GgufType::String: out.push_back(v.s); return;
    case GgufType::Bool: out.push_back(v.u != 0); return;
    case GgufType::F32: case GgufType::F64: out.push_back(v.f); return;
    case GgufType::I8: case GgufType::I16: case GgufType::I32: case GgufType::I64: out.push_back(v.i); return;
    default: out.push_back(v.u); return;
  }
}

void compare_metadata(const GgufFile& f, const json& manifest) {
  const auto& meta = manifest["metadata"];
  EXPECT_EQ(f.metadata().size(), meta.size());
  for (const auto& [key, value] : f.metadata()) {
    SCOPED_TRACE(key);
    ASSERT_TRUE(meta.contains(key));
    const json& ref = meta[key];
    // Type chain as gguf-py names it: ["ARRAY", "ARRAY", "INT32"].
    json types = json::array();
    for (const GgufValue* v = &value;; v = &v->array[0]) {
      std::string n(gguf_type_name(v->type));
      for (char& c : n) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      types.push_back(n);
      if (v->type != GgufType::Array) break;
      if (v->array.empty()) {
        std::string e(gguf_type_name(v->element_type));
        for (char& c : e) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
        types.push_back(e);
        break;
      }
    }
    EXPECT_EQ(types, ref["type"]);
    json mine = json::array();
    leaves(value, mine);
    if (value.type == GgufType::Array)
      EXPECT_EQ(mine, ref["value"]);
    else
      EXPECT_EQ(mine[0], ref["value"]);
  }
}

// Random blocks of every type nibble dequantizes (random code bits, random
// finite f16 scales, subnormals included), written by gguf-py's GGUFWriter,
// plus metadata of every value type.
TEST(GgufDequant, MatchesGgufPyOnRandomBlocksOfEveryType) {
  if (!have_gguf_py()) GTEST_SKIP() << "python3 with the gguf package (pip install gguf) is not available";
  TempDir tmp("nibble-gguf");
  for (int seed : {1, 2}) {
    const fs::path file = tmp / fmt::format("synth{}.gguf", seed), dir = tmp / fmt::format("ref{}", seed);
    const auto r = test::run_command(fmt::format("python3 {} synth {} {}", reference_script(), file.string(), seed));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const json manifest = dump_reference(file, dir);
    const GgufFile f = GgufFile::open(file);
    ASSERT_EQ(f.tensors().size(), 19u);  // F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1 IQ4_NL Q4_K Q5_K Q6_K
                                         // Q2_K Q3_K IQ4_XS TQ1_0 TQ2_0 MXFP4 NVFP4
    const Agreement a = compare_tensors(f, manifest, dir);
    EXPECT_EQ(a.differing, 0) << "of " << a.elements << " values differ from gguf-py, by up to " << a.max_ulp
                              << " ulp";
    compare_metadata(f, manifest);
    // Typed getters on the same values.
    EXPECT_EQ(f.get_int("t.u8"), 200);
    EXPECT_EQ(f.get_int("t.i64"), -9000000000000000000);
    EXPECT_EQ(f.get_float("t.f32"), static_cast<double>(0.1f));
    EXPECT_EQ(f.get_float("t.f64"), 0.1);
    EXPECT_TRUE(f.get_bool("t.bool"));
    EXPECT_EQ(f.get_string("t.str"), "h\xc3\xa9llo \xe2\x96\x81w\xc3\xb6rld");
    EXPECT_EQ(f.get_string_array("t.arr_s"), (std::vector<std::string>{"a", "", "\xe2\x96\x81" "b"}));
    EXPECT_EQ(f.get_int_array("t.arr_i"), (std::vector<int64_t>{1, -2, 3}));
    EXPECT_EQ(f.get_float_array("t.arr_f"), (std::vector<float>{0.5f, -1.25f}));
    EXPECT_EQ(f.get_int("absent", 7), 7);
    const std::string name = file.string();
    for (const auto& [msg, want] : std::vector<std::pair<std::string, std::string>>{
             {test::error_of([&] { f.get_int("t.u64"); }), "'t.u64' is uint64 18000000000000000000, expected an integer "
                                                     "that fits int64"},
             {test::error_of([&] { f.get_int("t.str"); }), "'t.str' is string"},
             {test::error_of([&] { f.get_float("t.u8"); }), "'t.u8' is uint8 200, expected a float32 or float64"},
             {test::error_of([&] { f.get_string("t.bool"); }), "'t.bool' is bool true, expected a string"},
             {test::error_of([&] { f.get_string_array("t.arr_i"); }), "'t.arr_i' is an array of 3 int32"},
             {test::error_of([&] { f.get_bool("nope"); }), "metadata key 'nope' is missing"}}) {
      EXPECT_NE(msg.find(name + ": metadata key "), std::string::npos) << msg;
      EXPECT_NE(msg.find(want), std::string::npos) << msg;
    }
  }
}

// Every file llama.cpp wrote in shared/models/stories260K/gguf.
TEST(GgufDequant, MatchesGgufPyOnLlamaCppFiles) {
  if (!have_gguf_py()) GTEST_SKIP() << "python3 with the gguf package (pip install gguf) is not available";
  TempDir tmp("nibble-gguf");
  int files = 0;
  for (const auto& entry : fs::directory_iterator(gguf_dir())) {
    if (entry.path().extension() != ".gguf") continue;
    SCOPED_TRACE(entry.path().filename().string());
    const fs::path dir = tmp / entry.path().stem().string();
    const json manifest = dump_reference(entry.path(), dir);
    const GgufFile f = GgufFile::open(entry.path());
    const Agreement a = compare_tensors(f, manifest, dir);
    EXPECT_GT(a.elements, 0);
    EXPECT_EQ(a.differing, 0) << "of " << a.elements << " values differ from gguf-py, by up to " << a.max_ulp
                              << " ulp";
    compare_metadata(f, manifest);
    ++files;
  }
  EXPECT_EQ(files, 11);
}

}  // namespace
}  // namespace nibble::io
