#include "nibble/match_rows.h"

#include <cblas.h>

#include <cmath>
#include <map>

#include "nibble/error.h"

namespace nibble::eval {
namespace {

double rel_err(const float* c, const float* r, int64_t n) {
  double e = 0, s = 0;
  for (int64_t i = 0; i < n; ++i) {
    e += (static_cast<double>(c[i]) - r[i]) * (static_cast<double>(c[i]) - r[i]);
    s += static_cast<double>(r[i]) * r[i];
  }
  return s > 0 ? std::sqrt(e / s) : std::sqrt(e);
}

std::vector<float> normalized_rows(const Tensor& t) {
  const int64_t R = t.size(0), C = t.size(1);
  std::vector<float> out(t.data<float>(), t.data<float>() + R * C);
  for (int64_t i = 0; i < R; ++i) {
    double s = 0;
    for (int64_t j = 0; j < C; ++j) s += static_cast<double>(out[i * C + j]) * out[i * C + j];
    const float inv = s > 0 ? static_cast<float>(1.0 / std::sqrt(s)) : 0.0f;
    for (int64_t j = 0; j < C; ++j) out[i * C + j] *= inv;
  }
  return out;
}

class PermutedSource final : public ModelSource {
 public:
  PermutedSource(std::unique_ptr<ModelSource> base, std::map<std::string, std::vector<int64_t>> perms)
      : base_(std::move(base)), perms_(std::move(perms)) {}
  std::string describe() const override { return base_->describe() + " (rows re-ordered by --match-rows)"; }
  std::vector<std::string> names() const override { return base_->names(); }
  bool contains(const std::string& n) const override { return base_->contains(n); }
  TensorMeta meta(const std::string& n) const override {
    TensorMeta m = base_->meta(n);
    if (perms_.count(n)) {
      m.format.reset();  // served dense, in the reference's row order
      m.dtype = DType::F32;
    }
    return m;
  }
  Tensor load(const std::string& n) const override {
    auto it = perms_.find(n);
    if (it == perms_.end()) return base_->load(n);
    const Tensor c = base_->load(n).to_f32().contiguous();
    const int64_t R = c.size(0), C = c.size(1);
    Tensor out = Tensor::zeros(DType::F32, {R, C});
    for (int64_t i = 0; i < R; ++i)  // candidate row i is reference row perm[i]
      std::copy_n(c.data<float>() + i * C, C, out.data_mut<float>() + it->second[i] * C);
    return out;
  }
  std::vector<Tensor> parts(const std::string& n) const override { return base_->parts(n); }
  const ModelConfig& config() const override { return base_->config(); }
  std::filesystem::path tokenizer_json() const override { return base_->tokenizer_json(); }
  std::optional<Tokenizer> tokenizer() const override { return base_->tokenizer(); }

 private:
  std::unique_ptr<ModelSource> base_;
  std::map<std::string, std::vector<int64_t>> perms_;
};

}  // namespace

std::vector<RowMatch> match_rows(const ModelSource& ref, const ModelSource& cand, double threshold) {
  std::vector<RowMatch> out;
  for (const std::string& name : ref.names()) {
    const TensorMeta mr = ref.meta(name);
    if (mr.shape.size() != 2 || !cand.contains(name)) continue;
    NIBBLE_CHECK(cand.meta(name).shape == mr.shape, "--match-rows: '{}' is {} in the reference but {} in {}", name,
                 shape_str(mr.shape), shape_str(cand.meta(name).shape), cand.describe());
    const Tensor r = ref.load(name).to_f32().contiguous(), c = cand.load(name).to_f32().contiguous();
    RowMatch m;
    m.name = name;
    m.rel_error = m.rel_error_after = rel_err(c.data<float>(), r.data<float>(), r.numel());
    if (m.rel_error > threshold) {
      m.checked_rows = true;
      const int64_t R = r.size(0), C = r.size(1);
      const std::vector<float> rn = normalized_rows(r), cn = normalized_rows(c);
      m.perm.assign(static_cast<size_t>(R), 0);
      m.min_cosine = 1;
      constexpr int64_t kBlock = 512;  // candidate rows per GEMM: S = Cn[b] · Rnᵀ
      std::vector<float> S(static_cast<size_t>(kBlock * R));
      for (int64_t b0 = 0; b0 < R; b0 += kBlock) {
        const int64_t nb = std::min(kBlock, R - b0);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(nb), static_cast<int>(R),
                    static_cast<int>(C), 1.0f, &cn[b0 * C], static_cast<int>(C), rn.data(), static_cast<int>(C), 0.0f,
                    S.data(), static_cast<int>(R));
        for (int64_t i = 0; i < nb; ++i) {
          const float* s = &S[i * R];
          const int64_t best = std::max_element(s, s + R) - s;
          m.perm[b0 + i] = best;
          m.min_cosine = std::min(m.min_cosine, static_cast<double>(s[best]));
        }
      }
      std::vector<uint8_t> seen(static_cast<size_t>(R), 0);
      m.permutation = true;
      for (int64_t p : m.perm) {
        if (seen[p]) m.permutation = false;
        seen[p] = 1;
      }
      if (m.permutation) {
        std::vector<float> back(static_cast<size_t>(R * C));
        for (int64_t i = 0; i < R; ++i) std::copy_n(c.data<float>() + i * C, C, &back[m.perm[i] * C]);
        m.rel_error_after = rel_err(back.data(), r.data<float>(), r.numel());
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

std::unique_ptr<ModelSource> undo_permutations(std::unique_ptr<ModelSource> cand, const std::vector<RowMatch>& ms) {
  std::map<std::string, std::vector<int64_t>> perms;
  for (const RowMatch& m : ms) {
    if (!m.permutation) continue;
    bool identity = true;
    for (size_t i = 0; i < m.perm.size(); ++i) identity &= m.perm[i] == static_cast<int64_t>(i);
    if (!identity) perms[m.name] = m.perm;
  }
  if (perms.empty()) return cand;
  return std::make_unique<PermutedSource>(std::move(cand), std::move(perms));
}

}  // namespace nibble::eval
