// The rival schemes (include/nibble/rival.h) against vectors made by the
// rivals' own libraries (scripts/make_rival_vectors.py): each file holds one
// linear as GPTQModel, AutoAWQ or compressed-tensors stores it, the
// library's own dequantization ("reference") and the quantization_config.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <map>

#include "nibble/act_quant.h"
#include "nibble/checkpoint_writer.h"
#include "nibble/format.h"
#include "nibble/dtype.h"
#include "nibble/error.h"
#include "nibble/rival.h"
#include "nibble/safetensors.h"
#include "test_util.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

struct Vector {
  std::unique_ptr<CheckpointDir> file;
  std::unique_ptr<RivalScheme> scheme;
};

Vector open_vector(const std::string& name) {
  Vector v;
  v.file = CheckpointDir::open_file(test::test_data_dir() / "rivals" / (name + ".safetensors"));
  v.scheme = make_rival_scheme(json::parse(v.file->metadata().at("quantization_config")), name);
  return v;
}

class RivalVector : public ::testing::TestWithParam<const char*> {};

// The libraries compute scale · (q − z) in the scales' dtype (fp16 for GPTQ
// and AWQ, bf16 for bf16 scales and the FP4 formats) and round the product to
// it; nibble computes it in f32, where it is exact. So each reference is
// matched within half an ulp of the dtype all its values fit in.
double relative_tolerance(const Tensor& reference) {
  bool bf16 = true, f16 = true;
  for (int64_t i = 0; i < reference.numel(); ++i) {
    const float x = reference.data<float>()[i];
    bf16 = bf16 && bf16_to_f32(f32_to_bf16(x)) == x;
    f16 = f16 && f16_to_f32(f32_to_f16(x)) == x;
  }
  return bf16 ? std::ldexp(1.0, -8) : f16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -23);
}

TEST_P(RivalVector, DequantizesAsTheLibraryDoes) {
  const std::string name = GetParam();
  const Vector v = open_vector(name);
  ASSERT_EQ(v.scheme->linear_of("layer.weight_scale", *v.file), std::nullopt);
  std::string marker;
  for (const std::string& n : v.file->names())
    if (v.scheme->linear_of(n, *v.file)) marker = n;
  ASSERT_FALSE(marker.empty()) << name << ": no tensor marks the quantized linear";
  EXPECT_EQ(*v.scheme->linear_of(marker, *v.file), "layer");
  const Tensor want = v.file->load("reference").to_f32();
  const Tensor got = v.scheme->dequantize("layer", *v.file);
  ASSERT_EQ(got.shape(), want.shape()) << name;
  const double rel = relative_tolerance(want);
  int64_t bad = 0, nonzero = 0;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const float a = got.data<float>()[i], b = want.data<float>()[i];
    if (std::abs(a - b) > rel * std::abs(b) && bad++ < 5) {
      ADD_FAILURE() << name << " [" << i << "]: " << a << " vs " << b;
    }
    nonzero += b != 0;
  }
  EXPECT_EQ(bad, 0) << name;
  // (2:4 sparse weights are half zeros.)
  EXPECT_GE(2 * nonzero, got.numel()) << name << ": a vector of mostly zeros checks little";
  // Every stored tensor of the linear is one of its parts.
  const std::vector<std::string> parts = v.scheme->parts("layer", *v.file);
  for (const std::string& n : v.file->names()) {
    if (n == "reference") continue;
    EXPECT_NE(std::find(parts.begin(), parts.end(), n), parts.end()) << name << ": " << n;
  }
}

#define NIBBLE_RIVAL_VECTORS \
  "gptq_b4_g32_asym_v1", "gptq_b4_g64_asym_v2", "gptq_b4_g64_sym_actorder_v1", \
  "gptq_b8_g128_asym_v1", "gptq_b2_g32_asym_v1", "gptq_b4_channel_asym_v1", \
  "gptq_b3_g32_asym_v1", "gptq_b3_g64_asym_v2", "gptq_b3_g64_sym_actorder_v1", \
  "gptq_p_b5_g32_asym", "gptq_p_b6_g64_sym_actorder", "gptq_p_b7_g128_asym", \
  "gptq_p_b3_g64_asym", \
  "awq_g64", "awq_g128", "awq_gemv_g64", "awq_gemv_g128", "awq_g64_64x384", "awq_g128_64x384", \
  "awq_gemv_g64_40x384", "awq_gemv_g128_40x384", "awq_gemv_fast_g64", \
  "awq_gemv_fast_g128_40x384", "ct_w4a16_group_sym", "ct_w4a16_group_asym", \
  "ct_w8a16_channel_sym", "ct_w8_channel_asym", "ct_w4_channel_asym_bf16", \
  "ct_int8_channel", "ct_fp8_tensor", "ct_fp8_channel", "ct_fp8_block", \
  "ct_nvfp4", "ct_mxfp4", "ct_mxfp6", "ct_mxfp8", "ct_sparse24_bf16", \
  "ct_sparse_bitmask_f16", "ct_sparse24_fp8_channel", \
  "ct_sparse24_int8_channel_asym", "ct_sparse_bitmask_int8_channel", \
  "bnb_nf4_dq_bf16", "bnb_fp4_bf16_ragged", \
  "bnb_nf4_f16_b128", "bnb_int8", "ar_gptq_sym_b4_g128", "ar_gptq_asym_b4_g32", \
  "ar_asym_b4_g64", "ar_asym_b2_g32", "ar_awq_g64"
INSTANTIATE_TEST_SUITE_P(Libraries, RivalVector, ::testing::Values(NIBBLE_RIVAL_VECTORS),
                         [](const ::testing::TestParamInfo<const char*>& i) { return std::string(i.param); });

// Rival linears that a nibble format holds exactly (RivalScheme::exact_format,
// which the GPU forward's W4A16 kernels take): their parts give dequantize()'s
// values bit for bit. Among the libraries' vectors the 4-bit ones in groups of
// 32, 64 or 128 in input order qualify: auto-round's symmetric GPTQ layout
// (zeros of 8, f16 scales) as int4_sym, and with zeros that vary per group
// (GPTQ, AWQ in all three layouts, auto-round's GPTQ and AWQ layouts; f16 scales,
// and GEMV-fast's f16 mins) as int4_asym_f32. The others have act-order groups,
// one group per row, other widths or other layouts, or f32 scales whose
// products fl(q·s) + fl(−z·s) are not the library's fl((q − z)·s).
void expect_exact(const RivalScheme& scheme, const TensorSource& file, const std::string& want,
                  const std::string& what) {
  const std::optional<FormatChoice> f = scheme.exact_format("layer", file);
  ASSERT_TRUE(f.has_value()) << what;
  EXPECT_EQ(f->canonical_name(), want) << what;
  const Tensor ref = scheme.dequantize("layer", file);
  const std::vector<Tensor> parts = scheme.exact_parts("layer", file);
  const Tensor got = dequantize_parts(*f, parts, ref.size(0), ref.size(1));
  ASSERT_EQ(got.shape(), ref.shape()) << what;
  EXPECT_EQ(std::memcmp(got.raw(), ref.raw(), ref.nbytes()), 0) << what;
}

TEST(Rival, ExactFormatsGiveTheSchemesValues) {
  const std::map<std::string, std::string> exact = {
      {"ar_gptq_sym_b4_g128", "int4_g128_sym"},
      {"gptq_b4_g32_asym_v1", "int4_g32_asym_f32"},
      {"gptq_b4_g64_asym_v2", "int4_g64_asym_f32"},
      {"awq_g64", "int4_g64_asym_f32"},
      {"awq_g128", "int4_g128_asym_f32"},
      {"awq_g64_64x384", "int4_g64_asym_f32"},
      {"awq_g128_64x384", "int4_g128_asym_f32"},
      {"awq_gemv_g64", "int4_g64_asym_f32"},
      {"awq_gemv_g128", "int4_g128_asym_f32"},
      {"awq_gemv_g64_40x384", "int4_g64_asym_f32"},
      {"awq_gemv_g128_40x384", "int4_g128_asym_f32"},
      {"awq_gemv_fast_g64", "int4_g64_asym_f32"},
      {"awq_gemv_fast_g128_40x384", "int4_g128_asym_f32"},
      {"ar_gptq_asym_b4_g32", "int4_g32_asym_f32"},
      {"ar_asym_b4_g64", "int4_g64_asym_f32"},
      {"ar_awq_g64", "int4_g64_asym_f32"},
  };
  size_t found = 0;
  for (const char* name : {NIBBLE_RIVAL_VECTORS}) {
    const Vector v = open_vector(name);
    auto it = exact.find(name);
    if (it != exact.end()) {
      expect_exact(*v.scheme, *v.file, it->second, name);
      ++found;
    } else {
      EXPECT_FALSE(v.scheme->exact_format("layer", *v.file).has_value()) << name;
      EXPECT_THROW(v.scheme->exact_parts("layer", *v.file), Error) << name;
    }
  }
  EXPECT_EQ(found, exact.size());
  // compressed-tensors' W4A16 (its vectors store f32 scales) with the scales a
  // bf16 or fp16 model stores. Symmetric: rounded to f16 they are int4_sym's;
  // so are bf16 values in f16's normal range (8 significant bits of f16's 11);
  // bf16 values far below it (scaled by 2^-30) are int4_asym's (min = -8 *
  // scale, a bf16 value too); values neither holds (f32, nudged by 2^-20) have
  // no exact format, int4_asym_f32's fl(q * s) + fl(-8 * s) missing fl((q - 8) * s).
  // Asymmetric (zero points that vary per group): f16 and bf16 scales make every
  // product exact, so int4_asym_f32 holds them (-z * s is no bf16 value for
  // every group); the vector's own f32 scales have no exact format (above).
  test::TempDir tmp("nibble-rival-exact");
  struct Case {
    const char* vector;
    const char* tag;
    DType dt;
    float mul;
    const char* want;  // "": none
  };
  for (const Case& c : {Case{"ct_w4a16_group_sym", "f16", DType::F16, 1.0f, "int4_g128_sym"},
                        Case{"ct_w4a16_group_sym", "bf16", DType::BF16, 1.0f, "int4_g128_sym"},
                        Case{"ct_w4a16_group_sym", "bf16-tiny", DType::BF16, 0x1p-30f, "int4_g128_asym"},
                        Case{"ct_w4a16_group_sym", "f32", DType::F32, 1.0f + 0x1p-20f, ""},
                        Case{"ct_w4a16_group_asym", "asym-f16", DType::F16, 1.0f, "int4_g64_asym_f32"},
                        Case{"ct_w4a16_group_asym", "asym-bf16", DType::BF16, 1.0f, "int4_g64_asym_f32"},
                        Case{"ct_w4a16_group_asym", "asym-f32", DType::F32, 1.0f + 0x1p-20f, ""}}) {
    const Vector ct = open_vector(c.vector);
    const json q = json::parse(ct.file->metadata().at("quantization_config"));
    const fs::path dir = tmp.path() / c.tag;
    fs::create_directories(dir);
    std::vector<io::OutputUnit> plan;
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const std::string& n : ct.file->names()) {
      Tensor t = ct.file->load(n);
      if (n == "layer.weight_scale") {
        Tensor r = t.to_f32().contiguous();
        for (int64_t i = 0; i < r.numel(); ++i) r.data_mut<float>()[i] *= c.mul;
        t = r.to(c.dt);
      }
      plan.push_back({n, {{n, t.dtype(), t.shape()}}, ""});
      tensors.emplace_back(n, t);
    }
    io::ShardedWriter w(dir, plan, uint64_t{1} << 40, {});
    for (const auto& [n, t] : tensors) w.write(n, t);
    w.finish();
    const auto file = CheckpointDir::open_file(dir / "model.safetensors");
    const auto scheme = make_rival_scheme(q, dir.string());
    if (*c.want == '\0')
      EXPECT_FALSE(scheme->exact_format("layer", *file).has_value()) << c.tag;
    else
      expect_exact(*scheme, *file, c.want, c.tag);
  }
}

// Exactness is checked per group, with the scheme's own arithmetic: a GPTQ
// linear (v2 zeros, all 3; codes (k + n) % 16, all 16 in every group) with f32
// scales. At s = 0.25 every product is exact and the pairs (s, -3 * s) are
// bf16 values: int4_asym. At f16(0.1) the products are exact but -3 * s is no
// bf16 value: int4_asym_f32. At 0.1f in one group alone, int4_asym_f32's
// fl(1 * s) + fl(-3 * s) is not GPTQ's fl(s * (1 - 3)), so no format holds
// the linear and it stays dense.
TEST(Rival, ExactFormatsCheckTheSchemesArithmetic) {
  const float s01 = 0.1f;
  ASSERT_NE(1.0f * s01 + -3.0f * s01, s01 * (1.0f - 3.0f));  // (-ffp-contract=off: no fused multiply-add)
  const int64_t out = 8, in = 64, gs = 32, groups = in / gs;
  const json q = {{"quant_method", "gptq"}, {"bits", 4},         {"group_size", gs},
                  {"sym", false},           {"desc_act", false}, {"checkpoint_format", "gptq_v2"}};
  test::TempDir tmp("nibble-rival-arith");
  struct Case {
    const char* tag;
    float scale, odd;  // every group's scale, and group 1 of output 5's
    const char* want;  // "": none
  };
  for (const Case& c : {Case{"quarter", 0.25f, 0.25f, "int4_g32_asym"},
                        Case{"f16", f16_to_f32(f32_to_f16(0.1f)), f16_to_f32(f32_to_f16(0.1f)), "int4_g32_asym_f32"},
                        Case{"f32-one-group", 0.25f, s01, ""}}) {
    Tensor qw = Tensor::zeros(DType::I32, {in / 8, out}), qz = Tensor::zeros(DType::I32, {groups, out / 8});
    Tensor sc = Tensor::empty(DType::F32, {groups, out});
    auto* w = static_cast<uint32_t*>(qw.raw_mut());
    auto* z = static_cast<uint32_t*>(qz.raw_mut());
    for (int64_t k = 0; k < in; ++k)
      for (int64_t n = 0; n < out; ++n) w[(k / 8) * out + n] |= static_cast<uint32_t>((k + n) % 16) << (4 * (k % 8));
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t n = 0; n < out; ++n) {
        z[g * (out / 8) + n / 8] |= 3u << (4 * (n % 8));
        sc.data_mut<float>()[g * out + n] = g == 1 && n == 5 ? c.odd : c.scale;
      }
    const fs::path path = tmp / (std::string(c.tag) + ".safetensors");
    io::save_safetensors(path, {{"layer.qweight", qw}, {"layer.qzeros", qz}, {"layer.scales", sc}}, {});
    const auto file = CheckpointDir::open_file(path);
    const auto scheme = make_rival_scheme(q, c.tag);
    if (*c.want == '\0') {
      EXPECT_FALSE(scheme->exact_format("layer", *file).has_value()) << c.tag;
      EXPECT_THROW(scheme->exact_parts("layer", *file), Error) << c.tag;
    } else {
      expect_exact(*scheme, *file, c.want, c.tag);
    }
  }
}

// LLM.int8's activations (bnb_int8_matmul: a Linear8bitLt run by
// bitsandbytes on an input with outlier columns): the checkpoint declares
// llm_int8, whose fake quantization gives the input the library's int8
// matmul sees (its codes times their row scale, the outlier columns exact),
// and with the dequantized weight the library's output, which the exact input
// does not.
TEST(Rival, LlmInt8ActivationsAreTheLibrarys) {
  const Vector v = open_vector("bnb_int8_matmul");
  ASSERT_EQ(v.scheme->activation_quant(), "llm_int8");
  const ActQuantSpec* aq = find_act_quant(v.scheme->activation_quant());
  const Tensor x = v.file->load("x").to_f32(), want_x = v.file->load("x_quant").to_f32();
  const Tensor y = v.file->load("y").to_f32(), w = v.scheme->dequantize("layer", *v.file);
  const int64_t n = x.size(0), in = x.size(1), out = w.size(0);
  std::vector<float> xq(x.data<float>(), x.data<float>() + x.numel());
  aq->apply(xq.data(), n, in);
  int64_t changed = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float a = xq[i], b = want_x.data<float>()[i];
    EXPECT_NEAR(a, b, 1e-6f * std::max(1.0f, std::abs(b))) << "x[" << i / in << ", " << i % in << "]";
    changed += a != x.data<float>()[i];
  }
  EXPECT_GT(changed, x.numel() / 2);
  // y = x' · wᵀ as the library computes it in fp16: the int8 part rounded to fp16, then the
  // outlier columns' part added (their weights rounded to fp16, |x| < 10 here) and rounded again:
  // within an fp16 ulp of each output plus 5e-4. The exact input misses most outputs by more.
  auto misses = [&](const float* xs) {
    int64_t bad = 0;
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = 0; o < out; ++o) {
        double acc = 0;
        for (int64_t k = 0; k < in; ++k) acc += static_cast<double>(xs[t * in + k]) * w.data<float>()[o * in + k];
        const double b = y.data<float>()[t * out + o];
        bad += std::abs(acc - b) > std::ldexp(1.0, -10) * std::abs(b) + 5e-4;
      }
    return bad;
  };
  EXPECT_EQ(misses(xq.data()), 0);
  EXPECT_GT(misses(x.data<float>()), n * out / 4);
  // Threshold 0 (no outlier columns) is int8 per token; other thresholds are not simulated.
  json q = json::parse(v.file->metadata().at("quantization_config"));
  q["llm_int8_threshold"] = 0.0;
  EXPECT_EQ(make_rival_scheme(q, "t0")->activation_quant(), "int8_token");
  q["llm_int8_threshold"] = 4.0;
  EXPECT_NE(test::error_of([&] { make_rival_scheme(q, "t4"); }).find("llm_int8_threshold 4"), std::string::npos);
  q.erase("llm_int8_threshold");
  EXPECT_EQ(make_rival_scheme(q, "default")->activation_quant(), "llm_int8");
  // 4-bit layers run on the exact activations.
  EXPECT_EQ(open_vector("bnb_nf4_dq_bf16").scheme->activation_quant(), "");
}

// GPTQ's v1 zeros are stored minus one by subtracting 0x11111111 from the
// packed word (GPTQModel's export), so a zero of 0 borrows from its
// neighbour; reading must add the word back, not one per field.
TEST(Rival, GptqV1ZerosComeBackThroughTheBorrow) {
  const Vector v = open_vector("gptq_b4_g32_asym_v1");
  const Tensor qz = v.file->load("layer.qzeros");
  const uint32_t w0 = static_cast<const uint32_t*>(qz.raw())[0];
  EXPECT_EQ(w0 & 15u, 15u) << "the vector's first zero is 0, stored as 0 - 1";
  // Row 0's zero 0 and row 1's zero 15 (the script sets them): with the
  // borrow, field 1 holds 15 - 1 - 1 = 13 before the word is added back.
  EXPECT_EQ((w0 >> 4) & 15u, 13u);
}

// compressed-tensors with config groups of different block_structure (block-quantized
// int8 here): each linear is read with the block of the group whose targets match it, as
// the library assigns schemes (an exact name, then a "re:" pattern anchored at the name's
// start, then the class name "Linear"). The shapes are ragged, so a block guessed from the
// scales' shape would be wrong for every one of them.
TEST(Rival, CompressedTensorsBlocksFollowTheLinearsConfigGroup) {
  test::TempDir tmp;
  const json q = json::parse(R"({"quant_method": "compressed-tensors", "format": "int-quantized",
    "config_groups": {
      "mlp": {"targets": ["re:.*mlp\\.down_proj$"], "weights": {"strategy": "block", "block_structure": [16, 64]}},
      "one": {"targets": ["model.layers.0.self_attn.o_proj"], "weights": {"strategy": "block", "block_structure": [32, 16]}},
      "rest": {"targets": ["Linear"], "weights": {"strategy": "block", "block_structure": [8, 32]}}}})");
  struct Case {
    std::string prefix;
    int64_t bo, bi;
  };
  // o_proj also matches "Linear", and "model.mlp.down_proj_x" the regex's prefix only (no "$" match).
  const std::vector<Case> cases = {{"model.layers.0.mlp.down_proj", 16, 64},
                                   {"model.layers.0.self_attn.o_proj", 32, 16},
                                   {"model.layers.0.self_attn.q_proj", 8, 32},
                                   {"model.layers.0.mlp.down_proj_x", 8, 32}};
  const int64_t out = 40, in = 100;
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (size_t c = 0; c < cases.size(); ++c) {
    const int64_t sr = (out + cases[c].bo - 1) / cases[c].bo, sc = (in + cases[c].bi - 1) / cases[c].bi;
    Tensor w = Tensor::empty(DType::I8, {out, in}), s = Tensor::empty(DType::F32, {sr, sc});
    for (int64_t i = 0; i < out * in; ++i) w.data_mut<int8_t>()[i] = static_cast<int8_t>((i * 37 + 11 * c) % 255 - 127);
    for (int64_t i = 0; i < sr * sc; ++i) s.data_mut<float>()[i] = 0.001f * static_cast<float>(i + 1 + 7 * c);
    tensors.emplace_back(cases[c].prefix + ".weight", w);
    tensors.emplace_back(cases[c].prefix + ".weight_scale", s);
  }
  const fs::path path = tmp / "ct_blocks.safetensors";
  io::save_safetensors(path, tensors, {});
  const auto file = CheckpointDir::open_file(path);
  const auto scheme = make_rival_scheme(q, "ct_blocks");
  for (size_t c = 0; c < cases.size(); ++c) {
    const Case& k = cases[c];
    const Tensor w = file->load(k.prefix + ".weight"), s = file->load(k.prefix + ".weight_scale");
    const int64_t sc = s.size(1);
    const Tensor got = scheme->dequantize(k.prefix, *file);
    ASSERT_EQ(got.shape(), (std::vector<int64_t>{out, in})) << k.prefix;
    int64_t bad = 0;
    for (int64_t n = 0; n < out; ++n)
      for (int64_t i = 0; i < in; ++i) {
        const float want = static_cast<float>(w.data<int8_t>()[n * in + i]) * s.data<float>()[(n / k.bo) * sc + i / k.bi];
        bad += got.data<float>()[n * in + i] != want;
      }
    EXPECT_EQ(bad, 0) << k.prefix;
  }
  // A "re:" target that is no regular expression is refused, naming its group.
  json badq = q;
  badq["config_groups"]["mlp"]["targets"] = {"re:(unclosed"};
  EXPECT_NE(test::error_of([&] { make_rival_scheme(badq, "cfg"); }).find("config group 'mlp'"), std::string::npos);
}

TEST(Rival, UnsupportedSettingsAreNamed) {
  auto err = [](const std::string& q) { return test::error_of([&] { make_rival_scheme(json::parse(q), "cfg"); }); };
  EXPECT_NE(err(R"({"quant_method": "gptq", "bits": 5, "group_size": 128})").find("5 bits"), std::string::npos);
  EXPECT_NE(err(R"({"quant_method": "gptq", "bits": 9, "checkpoint_format": "gptq_p"})").find("9 bits"),
            std::string::npos);
  EXPECT_NE(err(R"({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"})").find("marlin"),
            std::string::npos);
  EXPECT_NE(err(R"({"quant_method": "awq", "bits": 4, "version": "marlin"})").find("marlin"),
            std::string::npos);
  EXPECT_NE(err(R"({"quant_method": "hqq"})").find("gptq, awq, compressed-tensors, bitsandbytes, auto-round"),
            std::string::npos);
  EXPECT_NE(err(R"({"quant_method": "bitsandbytes"})").find("one of load_in_4bit and load_in_8bit"), std::string::npos);
  EXPECT_NE(err(R"({"quant_method": "auto-round", "packing_format": "auto_round:fp8"})").find("auto_round:fp8"),
            std::string::npos);
  EXPECT_NE(err(R"({"quant_method": "compressed-tensors", "format": "marlin-24"})").find("marlin-24"),
            std::string::npos);
  EXPECT_NE(err(R"({"quant_method": "compressed-tensors", "sparsity_config": {"format": "marlin-24"}})")
                .find("sparsity format 'marlin-24' is not supported (sparse-bitmask and sparse-24-bitmask are)"),
            std::string::npos);
  EXPECT_NE(err(R"({"bits": 4})").find("quant_method"), std::string::npos);
}

// A damaged linear is refused with a one-line error that names it (found by
// fuzz/fuzz_rival.cpp: each case below once crashed, threw a JSON type error
// or cast an out-of-range float).
TEST(Rival, DamagedLinearsAreRefusedByName) {
  test::TempDir tmp;
  // The vector `name` with tensor `drop` left out and `edit` applied to the rest, read back.
  auto damaged = [&](const std::string& name, const std::string& drop, auto edit) {
    const Vector v = open_vector(name);
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const std::string& n : v.file->names())
      if (n != drop) tensors.emplace_back(n, v.file->load(n).contiguous());
    for (auto& [n, t] : tensors) edit(n, t);
    const fs::path path = tmp / (name + ".safetensors");
    io::save_safetensors(path, tensors, v.file->metadata());
    const auto file = CheckpointDir::open_file(path);
    return test::error_of([&] {
      const auto scheme = make_rival_scheme(json::parse(file->metadata().at("quantization_config")), "cfg");
      for (const std::string& n : scheme->parts("layer", *file)) (void)file->meta(n);
      (void)scheme->dequantize("layer", *file);
    });
  };
  auto keep = [](const std::string&, Tensor&) {};
  EXPECT_NE(damaged("gptq_b4_g32_asym_v1", "layer.qzeros", keep).find("GPTQ linear 'layer' has no 'layer.qzeros'"),
            std::string::npos);
  EXPECT_NE(damaged("awq_g128", "layer.scales", keep).find("AWQ linear 'layer' has no 'layer.scales'"),
            std::string::npos);
  // An act-order group index past the scales' groups, and one that is no integer.
  for (const float bad : {1e9f, 0.5f}) {
    const std::string e = damaged("gptq_b4_g64_sym_actorder_v1", "", [&](const std::string& n, Tensor& t) {
      if (n != "layer.g_idx") return;
      t = t.to_f32();
      t.data_mut<float>()[3] = bad;
    });
    EXPECT_NE(e.find("'layer.g_idx'[3] = "), std::string::npos) << e;
    EXPECT_NE(e.find("is not a group index"), std::string::npos) << e;
  }
  // compressed-tensors' weight_shape beyond what the packed words can hold.
  const std::string e = damaged("ct_w4a16_group_sym", "", [](const std::string& n, Tensor& t) {
    if (n != "layer.weight_shape") return;
    t = t.to_f32();
    t.data_mut<float>()[1] = 7e18f;
  });
  EXPECT_NE(e.find("'layer.weight_shape' ["), std::string::npos) << e;
  EXPECT_NE(e.find("does not match the packed words"), std::string::npos) << e;
  // bitsandbytes: a quant_state whose shape would overflow int64 when multiplied, and a missing absmax.
  const std::string big = damaged("bnb_nf4_f16_b128", "", [](const std::string& n, Tensor& t) {
    if (n != "layer.weight.quant_state.bitsandbytes__nf4") return;
    const std::string js = R"({"quant_type": "nf4", "blocksize": 128, "shape": [4294967296, 4294967296]})";
    t = Tensor::empty(DType::U8, {static_cast<int64_t>(js.size())});
    std::memcpy(t.raw_mut(), js.data(), js.size());
  });
  EXPECT_NE(big.find("shape [4294967296, 4294967296] does not fit the 2048 bytes of codes"), std::string::npos) << big;
  EXPECT_NE(damaged("bnb_nf4_dq_bf16", "layer.weight.absmax", keep)
                .find("bitsandbytes linear 'layer' has no 'layer.weight.absmax'"),
            std::string::npos);
  // An AWQ qweight that holds no weights, with one group per row (group_size -1): the group size came out 0 and
  // divided (found by reading the GEMV reader's code; UBSan confirmed it on the GEMM reader).
  for (const char* version : {"gemm", "gemv"}) {
    const fs::path path = tmp / (std::string("awq_empty_") + version + ".safetensors");
    io::save_safetensors(path, {{"layer.qweight", Tensor::zeros(DType::I32, {0, 4})},
                                {"layer.qzeros", Tensor::zeros(DType::I32, {1, 4})},
                                {"layer.scales", Tensor::zeros(DType::F16, {1, 32})}});
    const auto file = CheckpointDir::open_file(path);
    const auto scheme =
        make_rival_scheme(json{{"quant_method", "awq"}, {"group_size", -1}, {"version", version}}, "cfg");
    const std::string e = test::error_of([&] { (void)scheme->dequantize("layer", *file); });
    EXPECT_NE(e.find("'layer.qweight' [0, 4] holds no weights"), std::string::npos) << version << ": " << e;
  }
  // AWQ's GEMV-fast layout: codes stored as I32, scales with fewer groups than the codes have, no weights.
  const std::string wide = damaged("awq_gemv_fast_g64", "", [](const std::string& n, Tensor& t) {
    if (n == "layer.qweight") t = Tensor::zeros(DType::I32, {8, 256});
  });
  EXPECT_NE(wide.find("'layer.qweight' should be a 2-D I16 tensor of packed AWQ codes (GEMV-fast layout), found I32"),
            std::string::npos)
      << wide;
  const std::string narrow = damaged("awq_gemv_fast_g64", "", [](const std::string& n, Tensor& t) {
    if (n == "layer.scales") t = Tensor::zeros(DType::F16, {3, 32});
  });
  EXPECT_NE(narrow.find("'layer.scales' should be [at least 4, 32] (GEMV-fast layout), found [3, 32]"),
            std::string::npos)
      << narrow;
  const std::string none = damaged("awq_gemv_fast_g64", "", [](const std::string& n, Tensor& t) {
    if (n == "layer.qweight") t = Tensor::zeros(DType::I16, {0, 256});
  });
  EXPECT_NE(none.find("'layer.qweight' [0, 256] holds no weights"), std::string::npos) << none;
  // compressed-tensors' sparse formats: no bitmask, fewer values than it marks, a row offset that disagrees with
  // it, a bitmask of the wrong width, and a linear stored both sparse and dense.
  EXPECT_NE(damaged("ct_sparse24_bf16", "layer.bitmask", keep).find("sparse linear 'layer' has no 'layer.bitmask'"),
            std::string::npos);
  const std::string few = damaged("ct_sparse24_fp8_channel", "", [](const std::string& n, Tensor& t) {
    if (n == "layer.compressed") t = Tensor::zeros(DType::F8_E4M3, {16, 97});
  });
  EXPECT_NE(few.find("'layer.compressed' holds 1552 values, but its bitmask marks 1568"), std::string::npos) << few;
  const std::string offset = damaged("ct_sparse_bitmask_f16", "", [](const std::string& n, Tensor& t) {
    if (n != "layer.row_offsets") return;
    t = t.to_f32();
    t.data_mut<float>()[3] += 1;
  });
  EXPECT_NE(offset.find("'layer.row_offsets' gives row 3 its first value at"), std::string::npos) << offset;
  const std::string mask = damaged("ct_sparse24_int8_channel_asym", "", [](const std::string& n, Tensor& t) {
    if (n == "layer.bitmask") t = Tensor::zeros(DType::U8, {16, 24});
  });
  EXPECT_NE(mask.find("'layer.bitmask' should be U8 [out, ⌈in / 8⌉] for the shape [16, 196], found U8 [16, 24]"),
            std::string::npos)
      << mask;
  {
    const Vector v = open_vector("ct_sparse24_bf16");
    std::vector<std::pair<std::string, Tensor>> tensors = {{"layer.weight", Tensor::zeros(DType::BF16, {16, 196})}};
    for (const std::string& n : v.file->names()) tensors.emplace_back(n, v.file->load(n).contiguous());
    io::save_safetensors(tmp / "both.safetensors", tensors, v.file->metadata());
    const auto file = CheckpointDir::open_file(tmp / "both.safetensors");
    const std::string e = test::error_of([&] { (void)v.scheme->dequantize("layer", *file); });
    EXPECT_NE(e.find("linear 'layer' is stored both sparse ('layer.compressed') and dense"), std::string::npos) << e;
  }
  // A config field of the wrong type names the field.
  auto cfg_err = [](const std::string& q) { return test::error_of([&] { make_rival_scheme(json::parse(q), "cfg"); }); };
  EXPECT_EQ(cfg_err(R"({"quant_method": "gptq", "bits": 4, "sym": 1})")
                .rfind("cfg: quantization_config: 'sym' should be a boolean, found 1 (", 0),
            0u);
  EXPECT_EQ(cfg_err(R"({"quant_method": "awq", "w_bit": "4"})")
                .rfind("cfg: quantization_config: 'w_bit' should be an integer, found \"4\" (", 0),
            0u);
  EXPECT_EQ(cfg_err(R"({"quant_method": "gptq", "bits": 4294967300})")
                .rfind("cfg: quantization_config: 'bits' = 4294967300 is out of range (", 0),
            0u);
}

TEST(Rival, QuantizationConfigIsFoundWhereTheToolsWriteIt) {
  test::TempDir tmp;
  auto write = [&](const fs::path& f, const json& j) { std::ofstream(f) << j.dump(); };
  EXPECT_FALSE(rival_quantization_config(tmp.path()).has_value());
  write(tmp / "config.json", {{"model_type", "llama"}});
  EXPECT_FALSE(rival_quantization_config(tmp.path()).has_value());
  // compressed-tensors' dense format holds plain weights: not a rival's quantized checkpoint.
  write(tmp / "config.json",
        {{"quantization_config", {{"quant_method", "compressed-tensors"}, {"format", "dense"}}}});
  EXPECT_FALSE(rival_quantization_config(tmp.path()).has_value());
  write(tmp / "config.json",
        {{"quantization_config", {{"quant_method", "compressed-tensors"}, {"format", "pack-quantized"}}}});
  EXPECT_EQ(rival_quantization_config(tmp.path())->value("format", ""), "pack-quantized");
  // A pruned checkpoint of plain weights: the dense format, its weights stored sparse.
  const json sparse24 = {{"format", "sparse-24-bitmask"}, {"sparsity_structure", "2:4"}};
  write(tmp / "config.json",
        {{"quantization_config", {{"quant_method", "compressed-tensors"}, {"sparsity_config", sparse24}}}});
  EXPECT_TRUE(rival_quantization_config(tmp.path()).has_value());
  write(tmp / "config.json", {{"quantization_config",
                               {{"quant_method", "compressed-tensors"},
                                {"format", "dense"},
                                {"sparsity_config", {{"format", "dense"}}}}}});
  EXPECT_FALSE(rival_quantization_config(tmp.path()).has_value());
  // A quant_method that is no string is an Error naming the file (refusals quote it as one).
  write(tmp / "config.json", {{"quantization_config", {{"quant_method", 5}}}});
  EXPECT_NE(test::error_of([&] { rival_quantization_config(tmp.path()); })
                .find("config.json: quantization_config's quant_method should be a string, found 5"),
            std::string::npos);
  // AutoGPTQ's own file, beside a config without the key.
  write(tmp / "config.json", {{"model_type", "llama"}});
  write(tmp / "quantize_config.json", {{"bits", 4}, {"group_size", 128}, {"desc_act", false}});
  EXPECT_EQ(rival_quantization_config(tmp.path())->value("quant_method", ""), "gptq");
}

}  // namespace
}  // namespace nibble
