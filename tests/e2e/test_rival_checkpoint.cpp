// A whole GPTQ checkpoint through RivalSource: qwen3-26M-linux's linears,
// rounded to 4-bit g128 codes and packed here in GPTQ's v1 layout (the layout
// itself is checked against GPTQModel's own vectors in test_rival.cpp), must
// hold exactly the weights of a plain checkpoint holding scale · (q − z), run
// as it does (its linears on the CPU's int4 kernels, the plain ones dense; also
// with the all-zero biases old AutoGPTQ releases stored), be found by
// open_model_source, and come back from `nibble dequantize` as that plain
// checkpoint without its quantization_config.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <fstream>

#include <nlohmann/json.hpp>

#include "nibble/act_quant.h"
#include "nibble/checkpoint_writer.h"
#include "nibble/dtype.h"
#include "nibble/format.h"
#include "nibble/model.h"
#include "nibble/rival.h"
#include "test_util.h"
#include "unit/gptq_checkpoint.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

Tensor logits_of(const ModelSource& src) {
  auto model = Model::load(src);
  KVCache cache(model->config(), 32);
  return model->forward({1, 17, 300, 42, 4000, 5, 77, 1024}, cache);
}

TEST(RivalCheckpoint, GptqDirectoryRunsAsItsDequantizedWeights) {
  test::TempDir tmp;
  // Old AutoGPTQ releases stored an all-zero fp16 bias for linears that have none.
  test::write_gptq_qwen3(tmp.path(), /*zero_bias=*/true);
  const auto base = CheckpointDir::open(test::model_dir("qwen3-26M-linux"));

  // Found by its config; the packed parts hidden behind each linear's weight.
  const auto src = open_model_source((tmp / "gptq").string());
  ASSERT_NE(dynamic_cast<const RivalSource*>(src.get()), nullptr);
  src->validate_against_config();
  const size_t n_linears = 7 * static_cast<size_t>(src->config().num_layers);
  EXPECT_EQ(src->names().size(), base->names().size() + n_linears);  // the zero biases are plain tensors
  EXPECT_FALSE(src->contains("model.layers.0.mlp.up_proj.qweight"));
  const TensorMeta m = src->meta("model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(m.shape, base->meta("model.layers.0.mlp.up_proj.weight").shape);
  EXPECT_EQ(m.stored_bytes, 1536u * 512 / 2 + 4 * 1536 / 2 + 4 * 1536 * 2);  // codes, zeros, fp16 scales

  const auto plain_src = CheckpointDir::open(tmp / "plain");
  for (const std::string& name : plain_src->names()) {  // the same f32 weights, bit for bit
    const Tensor x = src->load(name).to_f32(), y = plain_src->load(name).to_f32();
    ASSERT_EQ(x.shape(), y.shape()) << name;
    ASSERT_EQ(std::memcmp(x.raw(), y.raw(), x.nbytes()), 0) << name;
  }
  // Its linears load packed (int4_g128_asym_f32: fp32 scale and −z·s), the plain ones dense.
  ASSERT_TRUE(src->exact_format("model.layers.0.mlp.up_proj.weight"));
  EXPECT_EQ(src->exact_format("model.layers.0.mlp.up_proj.weight")->canonical_name(), "int4_g128_asym_f32");
  EXPECT_TRUE(load_linear(*src, "model.layers.0.mlp.up_proj").is_packed());
  EXPECT_FALSE(load_linear(*plain_src, "model.layers.0.mlp.up_proj").is_packed());
  const Tensor a = logits_of(*src), b = logits_of(*plain_src);
  ASSERT_EQ(a.shape(), b.shape());
  // The same weights through the int4 kernels and through dense f32 GEMMs (adding a zero bias changes no value):
  // fp32 summation order and the GEMV's 24-bit activations apart, the golden tests' bound for an fp32 forward.
  float diff = 0;
  for (int64_t i = 0; i < a.numel(); ++i) diff = std::max(diff, std::abs(a.data<float>()[i] - b.data<float>()[i]));
  std::printf("[          ] max |logit difference| packed vs dense: %g\n", diff);
  EXPECT_LT(diff, 1e-4f);

  // dequantize: a plain checkpoint of the same weights, its config without the quantization_config,
  // and without the copies AutoGPTQ and auto-round keep beside it.
  for (const char* f : {"quantize_config.json", "quantization_config.json"})
    std::ofstream(tmp / "gptq" / f) << R"({"quant_method": "gptq", "bits": 4, "group_size": 128})";
  const auto r = test::run_command(test::nibble_bin() + " dequantize -q --model " + (tmp / "gptq").string() +
                                   " --out " + (tmp / "hf").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::ifstream hf_cfg(tmp / "hf" / "config.json");
  EXPECT_FALSE(json::parse(hf_cfg).contains("quantization_config"));
  EXPECT_FALSE(fs::exists(tmp / "hf" / "quantize_config.json"));
  EXPECT_FALSE(fs::exists(tmp / "hf" / "quantization_config.json"));
  const auto hf = CheckpointDir::open(tmp / "hf");
  const Tensor w1 = hf->load("model.layers.3.self_attn.o_proj.weight"),
               w2 = plain_src->load("model.layers.3.self_attn.o_proj.weight");
  EXPECT_EQ(std::memcmp(w1.raw(), w2.raw(), w1.nbytes()), 0);

  // quantize refuses it, naming what it is.
  const auto q = test::run_command(test::nibble_bin() + " quantize -q --method rtn --model " + (tmp / "gptq").string() +
                                   " --out " + (tmp / "again").string());
  EXPECT_NE(q.exit_code, 0);
  EXPECT_NE(q.err.find("already quantized (gptq)"), std::string::npos) << q.err;
  // hf: names plain checkpoints only.
  EXPECT_NE(test::error_of([&] { open_model_source("hf:" + (tmp / "gptq").string()); }).find("quantized (gptq)"),
            std::string::npos);
}

// Every linear of the GPTQ checkpoint test::write_gptq_qwen3 wrote at `dir`
// has exact format `want` (what the GPU forward's W4A16 kernels take), and its
// parts give the weight load() does, bit for bit; plain tensors keep theirs
// (none). nibble inspect lists the linears as "rival:<want>".
void expect_exact_linears(const fs::path& dir, const std::string& want) {
  const auto src = open_model_source((dir / "gptq").string());
  int linears = 0;
  for (const std::string& name : src->names()) {
    if (!test::is_linear_weight(name)) {
      EXPECT_FALSE(src->exact_format(name).has_value()) << name;
      continue;
    }
    ++linears;
    const std::optional<FormatChoice> f = src->exact_format(name);
    ASSERT_TRUE(f.has_value()) << name;
    EXPECT_EQ(f->canonical_name(), want) << name;
    const TensorMeta m = src->meta(name);
    const Tensor got = dequantize_parts(*f, src->exact_parts(name), m.shape[0], m.shape[1]), w = src->load(name);
    ASSERT_EQ(got.shape(), w.shape()) << name;
    EXPECT_EQ(std::memcmp(got.raw(), w.raw(), w.nbytes()), 0) << name;
  }
  EXPECT_EQ(linears, 7 * src->config().num_layers);
  const auto r = test::run_command(test::nibble_bin() + " inspect " + (dir / "gptq").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string line = r.out.substr(r.out.find("model.layers.0.mlp.up_proj.weight"), 80);
  EXPECT_NE(line.find("rival:" + want + " "), std::string::npos) << line;
}

// A symmetric GPTQ checkpoint (zeros of 8, f16 scales, no act-order) is
// int4_sym exactly.
TEST(RivalCheckpoint, SymmetricGptqLinearsAreInt4SymExactly) {
  test::TempDir tmp;
  test::write_gptq_qwen3(tmp.path(), /*zero_bias=*/false, /*sym=*/true);
  expect_exact_linears(tmp.path(), "int4_g128_sym");
}

// An asymmetric one (zeros that vary per group, f16 scales): s·(q − z) is
// q·s + (−z·s) with every product exact, in f32, so int4_asym_f32 holds it
// (int4_sym's zero is 8, and −z·s is no bf16 value for int4_asym).
TEST(RivalCheckpoint, AsymmetricGptqLinearsAreInt4AsymF32Exactly) {
  test::TempDir tmp;
  test::write_gptq_qwen3(tmp.path(), /*zero_bias=*/false, /*sym=*/false);
  expect_exact_linears(tmp.path(), "int4_g128_asym_f32");
}

// The rival schemes keep their last few exact_format choices for the
// exact_parts calls after them (rival_source.cpp, choice_for_parts). Whatever
// the order linears are asked in (each format then its parts; all formats of
// a layer first, as the GPU's fused q|k|v and gate|up load; more linears than
// the choices kept, so some are evicted and made again), each linear's parts
// must be the ones a fresh source gives for it alone, byte for byte.
TEST(RivalCheckpoint, ExactPartsDoNotDependOnTheOrderLinearsAreAsked) {
  test::TempDir tmp;
  test::write_gptq_qwen3(tmp.path(), /*zero_bias=*/false, /*sym=*/false);
  const std::string dir = (tmp / "gptq").string();
  std::vector<std::string> names;
  for (const char* l : {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"})
    names.push_back(std::string("model.layers.1.") + l + ".weight");
  std::vector<std::vector<Tensor>> alone;
  for (const std::string& n : names) {
    const auto fresh = open_model_source(dir);
    ASSERT_TRUE(fresh->exact_format(n)) << n;
    alone.push_back(fresh->exact_parts(n));
  }
  auto expect_alone = [&](const std::vector<Tensor>& parts, size_t i, const std::string& order) {
    ASSERT_EQ(parts.size(), alone[i].size()) << names[i] << " " << order;
    for (size_t j = 0; j < parts.size(); ++j) {
      ASSERT_EQ(parts[j].dtype(), alone[i][j].dtype()) << names[i] << " " << order;
      ASSERT_EQ(parts[j].shape(), alone[i][j].shape()) << names[i] << " " << order;
      EXPECT_EQ(std::memcmp(parts[j].raw(), alone[i][j].raw(), parts[j].nbytes()), 0)
          << names[i] << " part " << j << " " << order;
    }
  };
  {  // every format first, then the parts in the same order, then again in reverse
    const auto src = open_model_source(dir);
    for (const std::string& n : names) ASSERT_TRUE(src->exact_format(n));
    for (size_t i = 0; i < names.size(); ++i) expect_alone(src->exact_parts(names[i]), i, "formats first");
    for (size_t i = names.size(); i-- > 0;) expect_alone(src->exact_parts(names[i]), i, "again, reversed");
  }
  {  // q, k, v's formats, their parts in reverse, then each linear's format and parts in turn
    const auto src = open_model_source(dir);
    for (size_t i = 0; i < 3; ++i) ASSERT_TRUE(src->exact_format(names[i]));
    for (size_t i = 3; i-- > 0;) expect_alone(src->exact_parts(names[i]), i, "q|k|v reversed");
    for (size_t i = 3; i < names.size(); ++i) {
      ASSERT_TRUE(src->exact_format(names[i]));
      expect_alone(src->exact_parts(names[i]), i, "in turn");
    }
  }
}

// qwen3-26M-linux's linears as bitsandbytes' Linear8bitLt stores them (I8
// weight, SCB = each row's absmax; w = q · SCB / 127), except the linears named
// in `skipped`, which llm_int8_skip_modules keeps plain.
void write_bnb_int8_qwen3(const fs::path& dir, const std::vector<std::string>& skipped) {
  const auto base = CheckpointDir::open(test::model_dir("qwen3-26M-linux"));
  std::vector<std::pair<std::string, Tensor>> tensors;
  for (const std::string& name : base->names()) {
    const Tensor t = base->load(name);
    bool skip = !test::is_linear_weight(name);
    for (const std::string& s : skipped) skip = skip || name.find("." + s + ".weight") != std::string::npos;
    if (skip) {
      tensors.emplace_back(name, t);
      continue;
    }
    const Tensor w = t.to_f32();
    const int64_t out = w.size(0), in = w.size(1);
    Tensor q = Tensor::empty(DType::I8, {out, in}), scb = Tensor::empty(DType::F32, {out});
    for (int64_t n = 0; n < out; ++n) {
      float amax = 0;
      for (int64_t k = 0; k < in; ++k) amax = std::max(amax, std::abs(w.data<float>()[n * in + k]));
      scb.data_mut<float>()[n] = amax;
      for (int64_t k = 0; k < in; ++k)
        q.data_mut<int8_t>()[n * in + k] =
            static_cast<int8_t>(std::nearbyint(w.data<float>()[n * in + k] * 127.0f / std::max(amax, 1e-30f)));
    }
    const std::string prefix = name.substr(0, name.size() - 7);
    tensors.emplace_back(name, q);
    tensors.emplace_back(prefix + ".SCB", scb);
  }
  std::ifstream cf(test::model_dir("qwen3-26M-linux") / "config.json");
  json cfg = json::parse(cf);
  json skip = skipped;
  skip.push_back("lm_head");
  cfg["quantization_config"] = {{"quant_method", "bitsandbytes"}, {"load_in_8bit", true},
                                {"llm_int8_threshold", 6.0}, {"llm_int8_skip_modules", skip}};
  test::write_checkpoint_dir(dir, tensors, cfg);
}

// A bitsandbytes 8-bit checkpoint whose llm_int8_skip_modules keeps down_proj
// in 16 bits: as in the library, down_proj reads its input exact while the
// int8 linears read LLM.int8's quantized one.
TEST(RivalCheckpoint, Bnb8BitSkippedLinearsReadExactActivations) {
  test::TempDir tmp;
  write_bnb_int8_qwen3(tmp / "skip", {"down_proj"});
  const auto src = open_model_source((tmp / "skip").string());
  ASSERT_NE(dynamic_cast<const RivalSource*>(src.get()), nullptr);
  ASSERT_EQ(src->activation_quant(), "llm_int8");
  EXPECT_TRUE(src->activations_quantized("model.layers.1.self_attn.q_proj"));
  EXPECT_FALSE(src->activations_quantized("model.layers.1.mlp.down_proj"));
  const ModelConfig& c = src->config();
  DecoderLayer L = DecoderLayer::load(*src, 1);
  EXPECT_EQ(L.exact_inputs, (std::array<bool, 4>{false, false, false, true}));
  const ActQuantSpec* aq = find_act_quant("llm_int8");
  ASSERT_EQ(L.act_quant, aq);

  // Layer 1 on a few embedding rows, each linear input recorded as the linears read it.
  const std::vector<int32_t> tokens = {1, 17, 300, 42, 4000, 5, 77, 1024};
  const int64_t n = static_cast<int64_t>(tokens.size()), D = c.hidden_size, row = c.num_kv_heads * c.head_dim;
  const Tensor embed = src->load("model.embed_tokens.weight").to_f32();
  const std::vector<float> inv_freq = rope_inv_freq(c);
  auto inputs_of = [&](const DecoderLayer& layer) {
    std::vector<float> x(static_cast<size_t>(n * D)), keys(static_cast<size_t>(n * row)), values(keys.size());
    for (int64_t i = 0; i < n; ++i) std::copy_n(embed.data<float>() + tokens[i] * D, D, x.data() + i * D);
    std::array<std::vector<float>, 4> in;
    const InputTap tap = [&](LinearInput which, const float* v, int64_t rows, int64_t dim) {
      in[static_cast<size_t>(which)].assign(v, v + rows * dim);
    };
    decoder_layer_forward(c, layer, inv_freq, x.data(), n, 0, keys.data(), values.data(), &tap);
    return in;
  };
  auto quantized = [&](std::vector<float> v) {
    aq->apply(v.data(), n, static_cast<int64_t>(v.size()) / n);
    return v;
  };
  const size_t qkv = static_cast<size_t>(LinearInput::QKV), down = static_cast<size_t>(LinearInput::Down);
  DecoderLayer exact = DecoderLayer::load(*src, 1);
  exact.act_quant = nullptr;
  DecoderLayer all = DecoderLayer::load(*src, 1);
  all.exact_inputs = {};
  const auto in_exact = inputs_of(exact), in_skip = inputs_of(L), in_all = inputs_of(all);
  // q|k|v's input is LLM.int8's quantization of the exact one.
  EXPECT_EQ(in_skip[qkv], quantized(in_exact[qkv]));
  // Up to down_proj, the run with the exemption lifted computes the same; then it quantizes down's input,
  // which the checkpoint's run leaves exact.
  for (size_t i = 0; i < down; ++i) EXPECT_EQ(in_all[i], in_skip[i]) << i;
  EXPECT_EQ(in_all[down], quantized(in_skip[down]));
  int64_t changed = 0;
  for (size_t i = 0; i < in_skip[down].size(); ++i) changed += in_skip[down][i] != in_all[down][i];
  EXPECT_GT(changed, static_cast<int64_t>(in_skip[down].size()) / 2);

  // Skipping q_proj alone: k_proj and v_proj read the same input quantized, which one input cannot be. The
  // checkpoint loads; running it with its declared quantizer is refused, naming both; with one the user picks
  // (or none) it runs, such an input counting as quantized.
  write_bnb_int8_qwen3(tmp / "mixed", {"q_proj"});
  const auto mixed = open_model_source((tmp / "mixed").string());
  auto model = Model::load(*mixed);
  KVCache cache(c, 16);
  const std::string e = test::error_of([&] { model->forward({1, 2, 3}, cache); });
  EXPECT_NE(e.find("layer 0: self_attn.q_proj runs with exact activations"), std::string::npos) << e;
  EXPECT_NE(e.find("self_attn.v_proj with quantized ones"), std::string::npos) << e;
  for (const char* name : {"none", "int8_token"}) {
    model->set_act_quant(find_act_quant(name));
    KVCache fresh(c, 16);
    EXPECT_EQ(model->forward({1, 2, 3}, fresh).size(0), 3) << name;
  }
  std::string conflict;
  EXPECT_EQ(exact_linear_inputs(*mixed, 0, &conflict), (std::array<bool, 4>{false, false, false, false}));
  EXPECT_NE(conflict.find("self_attn.q_proj"), std::string::npos);
}

// qwen3-26M-linux's linears pruned 2:4 (in every 4 inputs the two of largest
// magnitude kept, ties to the first) as compressed-tensors stores a pruned model of
// plain weights (sparsity_config sparse-24-bitmask, the dense format): per linear
// the kept bf16 values ("compressed" [out, in/2]), a bitmask of them (U8
// [out, ⌈in/8⌉], bit k % 8 of byte k / 8) and the dense shape (I64 [2, 1]); the
// layout itself is checked against the library's vectors in test_rival.cpp.
// `plain` gets the same pruned weights as a plain checkpoint.
void write_sparse24_qwen3(const fs::path& dir, const fs::path& plain) {
  const auto base = CheckpointDir::open(test::model_dir("qwen3-26M-linux"));
  std::vector<std::pair<std::string, Tensor>> sparse, dense;
  for (const std::string& name : base->names()) {
    const Tensor t = base->load(name);
    if (!test::is_linear_weight(name)) {
      sparse.emplace_back(name, t);
      dense.emplace_back(name, t);
      continue;
    }
    ASSERT_EQ(t.dtype(), DType::BF16);
    const int64_t out = t.size(0), in = t.size(1), bpr = (in + 7) / 8;
    const uint16_t* w = static_cast<const uint16_t*>(t.raw());
    Tensor pruned = Tensor::zeros(DType::BF16, {out, in}), values = Tensor::empty(DType::BF16, {out, in / 2});
    Tensor mask = Tensor::zeros(DType::U8, {out, bpr}), shape = Tensor::empty(DType::I64, {2, 1});
    shape.data_mut<int64_t>()[0] = out;
    shape.data_mut<int64_t>()[1] = in;
    uint16_t* v = static_cast<uint16_t*>(values.raw_mut());
    for (int64_t n = 0; n < out; ++n)
      for (int64_t k0 = 0; k0 < in; k0 += 4) {
        std::array<int64_t, 4> order = {k0, k0 + 1, k0 + 2, k0 + 3};
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
          return std::abs(bf16_to_f32(w[n * in + a])) > std::abs(bf16_to_f32(w[n * in + b]));
        });
        for (int64_t k = k0; k < k0 + 4; ++k) {
          if (k != order[0] && k != order[1]) continue;
          static_cast<uint16_t*>(pruned.raw_mut())[n * in + k] = w[n * in + k];
          *v++ = w[n * in + k];
          static_cast<uint8_t*>(mask.raw_mut())[n * bpr + k / 8] |= static_cast<uint8_t>(1u << (k % 8));
        }
      }
    const std::string prefix = name.substr(0, name.size() - 7);
    sparse.emplace_back(prefix + ".compressed", values);
    sparse.emplace_back(prefix + ".bitmask", mask);
    sparse.emplace_back(prefix + ".shape", shape);
    dense.emplace_back(name, pruned);
  }
  std::ifstream cf(test::model_dir("qwen3-26M-linux") / "config.json");
  json cfg = json::parse(cf);
  test::write_checkpoint_dir(plain, dense, cfg);
  cfg["quantization_config"] = {
      {"quant_method", "compressed-tensors"},
      {"version", "0.14.0.1"},
      {"sparsity_config",
       {{"format", "sparse-24-bitmask"},
        {"sparsity_structure", "2:4"},
        {"targets", {"Linear"}},
        {"ignore", json::array()}}},
      {"transform_config", json::object()}};
  test::write_checkpoint_dir(dir, sparse, cfg);
}

TEST(RivalCheckpoint, Sparse24DirectoryRunsAsItsPrunedWeights) {
  test::TempDir tmp;
  write_sparse24_qwen3(tmp / "sparse", tmp / "plain");
  const auto src = open_model_source((tmp / "sparse").string());
  ASSERT_NE(dynamic_cast<const RivalSource*>(src.get()), nullptr);
  EXPECT_NE(src->describe().find("sparse-24-bitmask"), std::string::npos) << src->describe();
  src->validate_against_config();
  const auto plain = CheckpointDir::open(tmp / "plain");
  EXPECT_EQ(src->names().size(), plain->names().size());
  EXPECT_FALSE(src->contains("model.layers.0.mlp.up_proj.bitmask"));
  const TensorMeta m = src->meta("model.layers.0.mlp.up_proj.weight");
  EXPECT_EQ(m.shape, plain->meta("model.layers.0.mlp.up_proj.weight").shape);
  EXPECT_EQ(m.stored_bytes, 1536u * 512 / 2 * 2 + 1536 * 512 / 8 + 2 * 8);  // values, bitmask, shape
  const Tensor a = logits_of(*src), b = logits_of(*plain);
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
}

}  // namespace
}  // namespace nibble
