// The synthetic GPTQ problem bench_gptq and bench_gptq_cuda share: correlated
// calibration inputs and random weights of Llama-3-8B shapes, from a fixed seed
// per shape, and the output error of a quantized matrix on those inputs.
#pragma once

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <numbers>
#include <string>
#include <vector>

namespace nibble::bench {

struct Shape {
  int64_t out, in;
  const char* role;
  std::string name() const { return std::to_string(out) + "x" + std::to_string(in); }
};

// --shapes: full (4096×4096 q/o, 14336×4096 gate/up, 4096×14336 down), small
// (1024×1024, 2816×1024, 1024×2816) or OUTxIN[,OUTxIN...]; empty when malformed.
inline std::vector<Shape> parse_shapes(const std::string& opt) {
  if (opt == "full") return {{4096, 4096, "q/o_proj"}, {14336, 4096, "gate/up_proj"}, {4096, 14336, "down_proj"}};
  if (opt == "small") return {{1024, 1024, "q/o-like"}, {2816, 1024, "gate/up-like"}, {1024, 2816, "down-like"}};
  std::vector<Shape> shapes;
  for (size_t p = 0; p <= opt.size();) {
    const size_t comma = std::min(opt.find(',', p), opt.size());
    long long out = 0, in = 0;
    char tail = 0;
    if (std::sscanf(opt.substr(p, comma - p).c_str(), "%lldx%lld%c", &out, &in, &tail) != 2 || out <= 0 || in <= 0)
      return {};
    shapes.push_back({out, in, "custom"});
    p = comma + 1;
  }
  return shapes;
}

// A small fast generator: xorshift64 plus Box–Muller for normals.
struct Rng {
  uint64_t s;
  double spare = 0;
  bool has_spare = false;
  uint64_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return s;
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1p-53; }  // (0, 1)
  double normal() {
    if (has_spare) {
      has_spare = false;
      return spare;
    }
    const double r = std::sqrt(-2.0 * std::log(uniform())), t = 2.0 * std::numbers::pi * uniform();
    spare = r * std::sin(t);
    has_spare = true;
    return r * std::cos(t);
  }
};

// X [tokens, in]: x[t, c] = scale_c · (Σ_k F[t, k] L[k, c] + 0.3·noise), F and
// noise N(0, 1), L N(0, 1/kFactors), scale_c = 10^U(-1, 1).
inline std::vector<float> make_inputs(int64_t tokens, int64_t in, Rng& rng) {
  constexpr int64_t kFactors = 32;
  constexpr double kNoise = 0.3;
  std::vector<float> F(static_cast<size_t>(tokens * kFactors)), L(static_cast<size_t>(kFactors * in));
  for (auto& v : F) v = static_cast<float>(rng.normal());
  for (auto& v : L) v = static_cast<float>(rng.normal() / std::sqrt(static_cast<double>(kFactors)));
  std::vector<float> X(static_cast<size_t>(tokens * in));  // [tokens, in]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(tokens), static_cast<int>(in),
              static_cast<int>(kFactors), 1.0f, F.data(), static_cast<int>(kFactors), L.data(), static_cast<int>(in),
              0.0f, X.data(), static_cast<int>(in));
  std::vector<float> scale(static_cast<size_t>(in));
  for (auto& s : scale) s = static_cast<float>(std::pow(10.0, 2.0 * rng.uniform() - 1.0));
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = 0; c < in; ++c) {
      float& x = X[t * in + c];
      x = scale[c] * (x + static_cast<float>(kNoise * rng.normal()));
    }
  return X;
}

inline std::vector<float> make_weights(int64_t out, int64_t in, Rng& rng) {
  std::vector<float> W(static_cast<size_t>(out * in));  // [out, in]
  for (auto& v : W) v = static_cast<float>(0.02 * rng.normal());
  return W;
}

// ‖X Dᵀ‖²_F with D = A − B [out, in] (B may be null: D = A), X [tokens, in].
// f32 GEMM over chunks of output rows, the squares summed in fp64.
inline double output_sq(const std::vector<float>& X, int64_t tokens, const float* A, const float* B, int64_t out,
                        int64_t in) {
  constexpr int64_t kChunk = 1024;
  std::vector<float> D(static_cast<size_t>(std::min(out, kChunk) * in));
  std::vector<float> E(static_cast<size_t>(tokens * std::min(out, kChunk)));  // [tokens, chunk]
  double sq = 0;
  for (int64_t r0 = 0; r0 < out; r0 += kChunk) {
    const int64_t m = std::min(kChunk, out - r0);
    const float* d = A + r0 * in;
    if (B) {
      for (int64_t i = 0; i < m * in; ++i) D[i] = A[r0 * in + i] - B[r0 * in + i];
      d = D.data();
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(tokens), static_cast<int>(m),
                static_cast<int>(in), 1.0f, X.data(), static_cast<int>(in), d, static_cast<int>(in), 0.0f, E.data(),
                static_cast<int>(m));
    for (int64_t i = 0; i < tokens * m; ++i) sq += static_cast<double>(E[i]) * E[i];
  }
  return sq;
}

inline double weight_sq(const float* A, const float* B, int64_t n) {
  double sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = static_cast<double>(A[i]) - B[i];
    sq += d * d;
  }
  return sq;
}

// The generator of a shape's data: the same seed in every benchmark.
inline Rng shape_rng(int64_t out, int64_t in) {
  return Rng{0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(out * 1000003 + in)};
}

}  // namespace nibble::bench
