// Model sources named on the command line: "DIR", "hf:DIR", "packed:DIR", "gguf:FILE",
// "overlay:CAND,keep=REGEX", "overlay:CAND,head=SRC", and a GGUF file by its own path.

#include "nibble/error.h"
#include "nibble/gguf.h"
#include "nibble/regex.h"
#include "nibble/rival.h"
#include "nibble/source.h"

namespace nibble {
namespace {

// The candidate's tensors, except those taken from another source.
class OverlaySource final : public ModelSource {
 public:
  OverlaySource(std::unique_ptr<ModelSource> base, const ModelSource* other, std::unique_ptr<ModelSource> owned_other,
                std::function<bool(const std::string&)> take, std::string what)
      : base_(std::move(base)), owned_(std::move(owned_other)), other_(owned_ ? owned_.get() : other),
        take_(std::move(take)), what_(std::move(what)) {}
  std::string describe() const override { return "overlay(" + base_->describe() + ", " + what_ + ")"; }
  std::vector<std::string> names() const override { return base_->names(); }
  bool contains(const std::string& n) const override { return base_->contains(n); }
  TensorMeta meta(const std::string& n) const override { return from(n).meta(n); }
  Tensor load(const std::string& n) const override { return from(n).load(n); }
  std::vector<Tensor> parts(const std::string& n) const override { return from(n).parts(n); }
  const ModelConfig& config() const override { return base_->config(); }
  std::filesystem::path tokenizer_json() const override { return base_->tokenizer_json(); }
  std::optional<Tokenizer> tokenizer() const override { return base_->tokenizer(); }
  std::string activation_quant() const override { return base_->activation_quant(); }
  void check_loadable() const override {
    base_->check_loadable();
    if (owned_) owned_->check_loadable();  // (a reference other_ is the caller's to check)
  }

 private:
  const ModelSource& from(const std::string& n) const {
    if (take_(n)) {
      NIBBLE_CHECK(other_->contains(n), "{}: {} has no tensor '{}'", describe(), other_->describe(), n);
      return *other_;
    }
    return *base_;
  }
  std::unique_ptr<ModelSource> base_, owned_;
  const ModelSource* other_;
  std::function<bool(const std::string&)> take_;
  std::string what_;
};

}  // namespace

std::unique_ptr<ModelSource> open_model_source(const std::string& spec, const ModelSource* reference) {
  auto strip = [&](const char* p) { return spec.rfind(p, 0) == 0 ? spec.substr(std::string(p).size()) : std::string(); };
  if (const std::string d = strip("hf:"); !d.empty()) {
    if (const auto q = rival_quantization_config(d))
      NIBBLE_FAIL("{}: hf: names a plain checkpoint, but this one is quantized ({}); name it by its directory alone", d,
                  q->value("quant_method", "?"));
    auto s = CheckpointDir::open(d);
    NIBBLE_CHECK(!s->is_packed(), "{}: hf: names a plain checkpoint, but this one is packed by nibble (use packed:)", d);
    return s;
  }
  if (const std::string f = strip("gguf:"); !f.empty()) return open_gguf(f);
  if (const std::string d = strip("packed:"); !d.empty()) {
    auto s = CheckpointDir::open(d);
    NIBBLE_CHECK(s->is_packed(), "{}: packed: names a nibble-packed checkpoint, but this one is plain (use hf:)", d);
    return s;
  }
  if (const std::string rest = strip("overlay:"); !rest.empty()) {
    const size_t comma = rest.rfind(',');
    NIBBLE_CHECK(comma != std::string::npos, "'{}': expected overlay:CAND,keep=REGEX or overlay:CAND,head=SRC", spec);
    const std::string cand = rest.substr(0, comma), arg = rest.substr(comma + 1);
    auto base = open_model_source(cand, reference);
    if (arg.rfind("keep=", 0) == 0) {
      NIBBLE_CHECK(reference != nullptr, "'{}': keep= takes tensors from the reference, and there is none", spec);
      auto re = std::make_shared<const Regex>(arg.substr(5), "'" + spec + "'");
      return std::make_unique<OverlaySource>(std::move(base), reference, nullptr,
                                             [re](const std::string& n) { return re->search(n); },
                                             "keep=" + arg.substr(5) + " from the reference");
    }
    if (arg.rfind("head=", 0) == 0) {
      auto head = open_model_source(arg.substr(5), reference);
      NIBBLE_CHECK(!base->config().tie_word_embeddings,
                   "'{}': the candidate's head is tied to its embedding; there is no separate head to swap", spec);
      return std::make_unique<OverlaySource>(std::move(base), nullptr, std::move(head),
                                             [](const std::string& n) { return n == "lm_head.weight"; },
                                             "head from " + arg.substr(5));
    }
    NIBBLE_FAIL("'{}': expected keep=REGEX or head=SRC after the comma, found '{}'", spec, arg);
  }
  NIBBLE_CHECK(spec.find(':') == std::string::npos || std::filesystem::exists(spec),
               "'{}': unknown source kind (known: DIR, hf:DIR, packed:DIR, gguf:FILE or a GGUF file, "
               "overlay:CAND,keep=REGEX, overlay:CAND,head=SRC)",
               spec);
  // A GGUF file named as it is: its magic, whatever the extension.
  if (is_gguf_file(spec)) return open_gguf(spec);
  NIBBLE_CHECK(!std::filesystem::is_regular_file(spec),
               "{}: a file that is not GGUF; a Hugging Face or nibble checkpoint is named by its directory", spec);
  // A rival's quantized checkpoint (rival.h): by its config's quantization_config.
  if (const auto q = rival_quantization_config(spec)) return RivalSource::open(spec, *q);
  return CheckpointDir::open(spec);
}

}  // namespace nibble
