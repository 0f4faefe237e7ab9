// A whole GPTQ checkpoint of qwen3-26M-linux for tests: its linears rounded
// to 4-bit g128 codes (min/max RTN) and packed in GPTQ's v1 layout (the
// layout itself is checked against GPTQModel's own vectors in
// test_rival.cpp), next to the plain checkpoint of the weights those codes
// define. Used by the CPU end-to-end test (tests/e2e/test_rival_checkpoint.cpp)
// and the GPU yardstick's (tests/unit/test_cuda_eval.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "nibble/checkpoint_writer.h"
#include "nibble/dtype.h"
#include "nibble/model.h"
#include "test_util.h"

namespace nibble::test {

inline bool is_linear_weight(const std::string& name) {
  for (const char* l : {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"})
    if (name.find(std::string(".") + l + ".weight") != std::string::npos) return true;
  return false;
}

// GPTQ v1 parts of w [out, in] (groups of 128, min/max RTN: f16 scale
// (max − min) / 15 and a zero point per group, round(−min / scale); with `sym`,
// zero point 8 and scale absmax / 7, GPTQ's sym=True layout) and the weight
// they define, f32 [out, in].
struct GptqPacked {
  Tensor qweight, qzeros, scales, dequantized;
};
inline GptqPacked pack_gptq_v1(const Tensor& w32, bool sym = false) {
  const int64_t out = w32.size(0), in = w32.size(1), gs = 128, groups = in / gs;
  const float* w = w32.data<float>();
  GptqPacked p;
  p.qweight = Tensor::zeros(DType::I32, {in / 8, out});
  p.qzeros = Tensor::zeros(DType::I32, {groups, out / 8});
  p.scales = Tensor::empty(DType::F16, {groups, out});
  p.dequantized = Tensor::empty(DType::F32, {out, in});
  auto* qw = static_cast<uint32_t*>(p.qweight.raw_mut());
  auto* qz = static_cast<uint32_t*>(p.qzeros.raw_mut());
  auto* sc = static_cast<uint16_t*>(p.scales.raw_mut());
  float* dq = p.dequantized.data_mut<float>();
  for (int64_t g = 0; g < groups; ++g)
    for (int64_t n = 0; n < out; ++n) {
      float mn = 0, mx = 0;
      for (int64_t k = g * gs; k < (g + 1) * gs; ++k)
        mn = std::min(mn, w[n * in + k]), mx = std::max(mx, w[n * in + k]);
      const float step = sym ? std::max(mx, -mn) / 7.0f : (mx - mn) / 15.0f;
      const uint16_t s16 = f32_to_f16(std::max(step, 1e-6f));
      const float s = f16_to_f32(s16);
      const uint32_t z = sym ? 8u : static_cast<uint32_t>(std::clamp(std::nearbyint(-mn / s), 0.0f, 15.0f));
      sc[g * out + n] = s16;
      qz[g * (out / 8) + n / 8] |= z << (4 * (n % 8));
      for (int64_t k = g * gs; k < (g + 1) * gs; ++k) {
        const uint32_t q =
            static_cast<uint32_t>(std::clamp(std::nearbyint(w[n * in + k] / s) + static_cast<float>(z), 0.0f, 15.0f));
        qw[(k / 8) * out + n] |= q << (4 * (k % 8));
        dq[n * in + k] = s * (static_cast<float>(q) - static_cast<float>(z));
      }
    }
  // v1 stores every zero minus one, taken from the packed word as a whole.
  for (int64_t i = 0; i < p.qzeros.numel(); ++i) qz[i] -= 0x11111111u;
  return p;
}

inline void write_checkpoint_dir(const std::filesystem::path& dir,
                                 const std::vector<std::pair<std::string, Tensor>>& tensors,
                                 const nlohmann::json& cfg) {
  std::filesystem::create_directories(dir);
  std::vector<io::OutputUnit> plan;
  for (const auto& [name, t] : tensors) plan.push_back({name, {{name, t.dtype(), t.shape()}}, ""});
  io::ShardedWriter w(dir, plan, uint64_t{1} << 40, {{"format", "pt"}});
  for (const auto& [name, t] : tensors) w.write(name, t);
  w.finish();
  std::ofstream(dir / "config.json") << cfg.dump(2);
  std::filesystem::copy_file(model_dir("qwen3-26M-linux") / "tokenizer.json", dir / "tokenizer.json");
}

// Writes dir/gptq (the GPTQ v1 checkpoint, symmetric with `sym`; with `zero_bias`, the all-zero fp16
// bias old AutoGPTQ releases stored for every linear) and dir/plain (the same
// model with each linear as the f32 weight its codes define).
inline void write_gptq_qwen3(const std::filesystem::path& dir, bool zero_bias, bool sym = false) {
  const auto base = CheckpointDir::open(model_dir("qwen3-26M-linux"));
  std::vector<std::pair<std::string, Tensor>> rival, plain;
  for (const std::string& name : base->names()) {
    const Tensor t = base->load(name);
    if (!is_linear_weight(name)) {
      rival.emplace_back(name, t);
      plain.emplace_back(name, t);
      continue;
    }
    const GptqPacked p = pack_gptq_v1(t.to_f32(), sym);
    const std::string prefix = name.substr(0, name.size() - 7);
    rival.emplace_back(prefix + ".qweight", p.qweight);
    rival.emplace_back(prefix + ".qzeros", p.qzeros);
    rival.emplace_back(prefix + ".scales", p.scales);
    if (zero_bias) rival.emplace_back(prefix + ".bias", Tensor::zeros(DType::F16, {t.size(0)}));
    plain.emplace_back(name, p.dequantized);
  }
  std::ifstream cf(model_dir("qwen3-26M-linux") / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(cf);
  write_checkpoint_dir(dir / "plain", plain, cfg);
  cfg["quantization_config"] = {{"quant_method", "gptq"}, {"bits", 4},         {"group_size", 128},
                                {"sym", sym},             {"desc_act", false}, {"checkpoint_format", "gptq"}};
  write_checkpoint_dir(dir / "gptq", rival, cfg);
}

}  // namespace nibble::test
