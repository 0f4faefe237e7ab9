#include "nibble/tasks.h"

#include <cmath>
#include <fstream>
#include <iterator>
#include <map>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "nibble/error.h"
#include "nibble/model.h"
#include "nibble/regex.h"
#include "nibble/tensor.h"
#include "nibble/tokenizer.h"
#include "nibble/util.h"
#ifdef NIBBLE_HAVE_CUDA
#include "nibble/cuda_model.h"
#endif

namespace nibble::eval {
namespace fs = std::filesystem;

std::optional<std::string> extract_answer(const std::string& text) {
  // The last \boxed{...} (braces balanced).
  const size_t b = text.rfind("\\boxed{");
  if (b != std::string::npos) {
    int depth = 0;
    for (size_t i = b + 6; i < text.size(); ++i) {
      if (text[i] == '{') ++depth;
      if (text[i] == '}' && --depth == 0) return text.substr(b + 7, i - b - 7);
    }
  }
  static const Regex number(R"(-?\d[\d,]*(\.\d+)?|-?\.\d+)", "GSM8K answer number");
  std::vector<std::pair<size_t, size_t>> spans;
  number.find_all(text, spans);
  if (spans.empty()) return std::nullopt;
  std::string s;
  for (size_t i = spans.back().first; i < spans.back().second; ++i)
    if (text[i] != ',') s += text[i];
  return s;
}

std::string gsm8k_gold(const std::string& answer) {
  const size_t p = answer.rfind("####");
  NIBBLE_CHECK(p != std::string::npos, "gsm8k: answer has no '####': {}", answer.substr(0, 80));
  std::string s = answer.substr(p + 4);
  s.erase(0, s.find_first_not_of(" \t\n"));
  s.erase(s.find_last_not_of(" \t\n") + 1);
  std::string out;
  for (char c : s)
    if (c != ',') out += c;
  return out;
}

bool answers_match(const std::string& pred, const std::string& gold) {
  char* e1 = nullptr;
  char* e2 = nullptr;
  const double a = std::strtod(pred.c_str(), &e1), b = std::strtod(gold.c_str(), &e2);
  if (!pred.empty() && !gold.empty() && *e1 == '\0' && *e2 == '\0') return std::abs(a - b) <= 1e-6 * std::max(1.0, std::abs(b));
  return pred == gold;
}

nlohmann::json answer_json(const Gsm8kItem& it) {
  return {{"id", it.id},           {"gold", it.gold},     {"pred", it.pred ? *it.pred : ""},
          {"correct", it.correct}, {"output", it.output}, {"question", it.question}};
}

namespace {

// What a resumed run must agree on with the one that wrote the journal.
nlohmann::json journal_fingerprint(const ModelSource& src, const Gsm8kOptions& o, const std::string& style) {
  std::string tensors;
  for (const auto& n : src.names()) tensors += n + " " + shape_str(src.meta(n).shape) + "\n";
  nlohmann::json fp = {{"model", src.describe()},
                       {"tensors_sha256", sha256_hex(tensors.data(), tensors.size())},
                       {"data_sha256", sha256_file(o.data)},
                       {"max_new_tokens", o.max_new_tokens},
                       {"version", 1}};
  // The GPU's bf16 activations can change a greedy choice; CPU journals keep their fingerprint.
  if (o.device != "cpu") fp["device"] = o.device;
  // Llama 3's chat format came after the first journals, whose prompts for such a tokenizer were plain: its
  // journals name it (ChatML and plain journals keep their fingerprint).
  if (style == "llama3") fp["prompt"] = style;
  return fp;
}

// Reads the answers of an interrupted run's journal into items[0..k) (marked resumed) and cuts the
// file after its last whole line; returns k. A last line cut off by the interruption is dropped.
// The journal may hold more or fewer problems than this run asks for (--n is not part of the
// fingerprint): problems are answered in order and greedily, so its first answers are this run's.
size_t read_journal(const fs::path& path, const nlohmann::json& fp, std::vector<Gsm8kItem>& items) {
  std::ifstream f(path, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t pos = 0, kept = 0, done = 0;
  int64_t lineno = 0;
  while (pos < text.size()) {
    const size_t eol = text.find('\n', pos);
    const bool whole = eol != std::string::npos;
    const std::string line = text.substr(pos, whole ? eol - pos : std::string::npos);
    ++lineno;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (lineno == 1) {
      NIBBLE_CHECK(whole && !j.is_discarded() && j.contains("fingerprint"),
                   "{}: not a gsm8k journal (its first line names no run); pass --force to start over", path.string());
      std::vector<std::string> diff;
      const nlohmann::json& old = j["fingerprint"];
      for (const auto& [k, v] : fp.items())
        if (!old.contains(k) || old[k] != v) diff.push_back(k);
      if (old.is_object())
        for (const auto& [k, v] : old.items())
          if (!fp.contains(k)) diff.push_back(k);
      NIBBLE_CHECK(diff.empty(), "--resume: the interrupted run in {} differs from this one in {}; pass --force to start over",
                   path.string(), fmt::format("{}", fmt::join(diff, ", ")));
    } else {
      if (done == items.size()) return done;  // a run of more problems than this one: its first answers serve
      const bool ok = whole && !j.is_discarded() && j.is_object() && j.contains("id") && j["id"].is_number_integer() &&
                      j.contains("output") && j["output"].is_string() && j.contains("question") &&
                      j["question"].is_string();
      if (!ok) {
        NIBBLE_CHECK(!whole || eol + 1 == text.size(),
                     "{} line {}: not an answer, and not the last line an interruption cut off; pass --force to "
                     "start over",
                     path.string(), lineno);
        break;  // the line being written when the run was stopped
      }
      NIBBLE_CHECK(done < items.size() && j["id"].get<int64_t>() == items[done].id &&
                       j["question"].get<std::string>() == items[done].question,
                   "{} line {}: answer {} is not problem {} of the data file; pass --force to start over",
                   path.string(), lineno, j["id"].dump(), done);
      Gsm8kItem& it = items[done++];
      it.output = j["output"].get<std::string>();
      it.pred = extract_answer(it.output);
      it.correct = it.pred && answers_match(*it.pred, it.gold);
      it.resumed = true;
    }
    pos = whole ? eol + 1 : text.size();
    kept = pos;
  }
  f.close();
  if (kept < text.size()) fs::resize_file(path, kept);
  return done;
}

// Greedy continuation of a prompt: on_token(id) for each id chosen after
// `prompt`, at most `budget`, until it returns false.
class Greedy {
 public:
  virtual ~Greedy() = default;
  virtual void run(const std::vector<int32_t>& prompt, int64_t budget,
                   const std::function<bool(int32_t)>& on_token) = 0;
};

int32_t argmax_row(const Tensor& logits, int64_t vocab) {
  const float* l = logits.data<float>();
  return static_cast<int32_t>(std::max_element(l, l + vocab) - l);
}

class CpuGreedy : public Greedy {
 public:
  explicit CpuGreedy(const ModelSource& src) : model_(Model::load(src)) {}
  void run(const std::vector<int32_t>& prompt, int64_t budget, const std::function<bool(int32_t)>& on_token) override {
    const ModelConfig& c = model_->config();
    KVCache cache(c, static_cast<int64_t>(prompt.size()) + budget);
    Tensor logits = model_->forward(prompt, cache, false);
    for (int64_t k = 0; k < budget; ++k) {
      const int32_t next = argmax_row(logits, c.vocab_size);
      if (!on_token(next)) return;
      if (k + 1 < budget) logits = model_->forward({next}, cache, false);
    }
  }

 private:
  std::unique_ptr<Model> model_;
};

#ifdef NIBBLE_HAVE_CUDA
// The prompt through the GPU forward, then the device-side greedy loop
// (GpuModel::decode_greedy_run): one load for every problem, the cache
// emptied between them. A task scores the checkpoint, so prefill attention
// stays fp32 as on the CPU (not GpuOptions::tensor_core_prefill's bf16).
cuda::GpuOptions task_options() {
  cuda::GpuOptions g;
  g.tensor_core_prefill = false;
  return g;
}
class GpuGreedy : public Greedy {
 public:
  GpuGreedy(const ModelSource& src, int64_t max_tokens)
      : model_(cuda::GpuModel::load(src, max_tokens, task_options())) {}
  void run(const std::vector<int32_t>& prompt, int64_t budget, const std::function<bool(int32_t)>& on_token) override {
    const int64_t vocab = model_->config().vocab_size;
    model_->reset();
    const int32_t first = argmax_row(model_->forward(prompt, false), vocab);
    if (!on_token(first) || budget == 1) return;
    model_->decode_greedy_run(first, vocab, budget - 1, on_token);
  }

 private:
  std::unique_ptr<cuda::GpuModel> model_;
};
#endif

// The chat formats gsm8k_prompt knows, in the order it tries them: the special
// tokens a tokenizer must have (the last one ends a turn), and the text around
// the question.
struct ChatFormat {
  const char* style;
  std::vector<const char*> tokens;
  const char* before;
  const char* after;
};
const std::vector<ChatFormat>& chat_formats() {
  static const std::vector<ChatFormat> formats = {
      {"chatml", {"<|im_start|>", "<|im_end|>"}, "<|im_start|>user\n",
       "\nPut the final answer in \\boxed{}.<|im_end|>\n<|im_start|>assistant\n"},
      {"llama3", {"<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"},
       "<|start_header_id|>user<|end_header_id|>\n\n",
       "\nPut the final answer in \\boxed{}.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"},
  };
  return formats;
}

// The first chat format whose special tokens the tokenizer has (null: none,
// the plain prompt), and its end-of-turn token's id.
const ChatFormat* chat_format(const Tokenizer& tok, std::optional<int32_t>& last) {
  for (const ChatFormat& f : chat_formats()) {
    bool all = true;
    for (const char* t : f.tokens) all = all && (last = tok.token_to_id(t)).has_value();
    if (all) return &f;
  }
  last.reset();
  return nullptr;
}

}  // namespace

Gsm8kPrompt gsm8k_prompt(const Tokenizer& tok, const std::string& question) {
  std::optional<int32_t> last;
  if (const ChatFormat* f = chat_format(tok, last))
    return {f->style, tok.encode(f->before + question + f->after, true), last};
  return {"plain", tok.encode("Question: " + question + "\nAnswer:", true), std::nullopt};
}

std::vector<Gsm8kItem> run_gsm8k(const ModelSource& src, const Tokenizer& tok, const Gsm8kOptions& o,
                                 std::string* style_out) {
  NIBBLE_CHECK(o.device == "cpu" || o.device == "cuda", "gsm8k: --device must be cpu or cuda, found '{}'", o.device);
#ifndef NIBBLE_HAVE_CUDA
  NIBBLE_CHECK(o.device == "cpu", "gsm8k: --device cuda needs a CUDA build of nibble (make build NIBBLE_CUDA=on)");
#endif
  NIBBLE_CHECK(o.device == "cpu" || src.activation_quant().empty(),
               "gsm8k --device cuda: {} declares simulated activation quantization '{}', which the GPU forward does "
               "not do; use --device cpu",
               src.describe(), src.activation_quant());
  NIBBLE_CHECK(fs::is_regular_file(o.data), "gsm8k: --data {}: no such file", o.data.string());
  std::ifstream f(o.data);
  std::vector<Gsm8kItem> items;
  std::string line;
  int64_t lineno = 0;
  while (static_cast<int64_t>(items.size()) < o.n && std::getline(f, line)) {
    ++lineno;
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    NIBBLE_CHECK(!j.is_discarded() && j.contains("question") && j.contains("answer") && j["question"].is_string() &&
                     j["answer"].is_string(),
                 "gsm8k: {} line {}: expected a JSON object with \"question\" and \"answer\" strings", o.data.string(),
                 lineno);
    Gsm8kItem it;
    it.id = static_cast<int64_t>(items.size());
    it.question = j["question"].get<std::string>();
    it.gold = gsm8k_gold(j["answer"].get<std::string>());
    items.push_back(std::move(it));
  }
  NIBBLE_CHECK(!items.empty(), "gsm8k: {} has no problems", o.data.string());

  std::optional<int32_t> stop;
  const ChatFormat* chat = chat_format(tok, stop);
  const std::string style = chat != nullptr ? chat->style : "plain";
  const bool plain = chat == nullptr;
  if (style_out) *style_out = style;
  // The journal is opened (and, when new, started with the run's line) at the first answer, so a run
  // that fails before any leaves none behind.
  std::ofstream journal;
  size_t resumed = 0;
  nlohmann::json fp;
  if (!o.journal.empty()) {
    fp = journal_fingerprint(src, o, style);
    if (fs::exists(o.journal) && o.force) fs::remove(o.journal);
    if (fs::exists(o.journal)) {
      NIBBLE_CHECK(o.resume,
                   "{}: an interrupted gsm8k run left its answers here; pass --resume to continue it or --force to "
                   "start over",
                   o.journal.string());
      resumed = read_journal(o.journal, fp, items);
    }
  }
  const ModelConfig& c = src.config();
  const auto eos = tok.eos_id();
  // Every prompt first: the GPU's cache is sized once, for the longest.
  std::vector<std::vector<int32_t>> prompts(items.size());
  int64_t max_tokens = 1;
  for (size_t i = 0; i < items.size(); ++i) {
    if (items[i].resumed) continue;
    prompts[i] = gsm8k_prompt(tok, items[i].question).ids;
    max_tokens = std::max<int64_t>(
        max_tokens, std::min<int64_t>(static_cast<int64_t>(prompts[i].size()) + o.max_new_tokens,
                                      c.max_position_embeddings));
  }
  std::unique_ptr<Greedy> greedy;
  if (resumed < items.size()) {
    if (o.device == "cuda") {
#ifdef NIBBLE_HAVE_CUDA
      greedy = std::make_unique<GpuGreedy>(src, max_tokens);
#endif
    } else {
      greedy = std::make_unique<CpuGreedy>(src);
    }
  }
  Progress bar("gsm8k", static_cast<int64_t>(items.size() - resumed), o.progress, "problems");
  if (resumed) bar.set_note(fmt::format("{} resumed", resumed));
  for (size_t i = 0; i < items.size(); ++i) {
    Gsm8kItem& it = items[i];
    if (it.resumed) continue;
    // The question alone may fill the context: then there is no answer.
    const int64_t budget =
        std::min<int64_t>(o.max_new_tokens, c.max_position_embeddings - static_cast<int64_t>(prompts[i].size()));
    if (budget > 0) {
      StreamDecoder dec(tok, true);
      greedy->run(prompts[i], budget, [&](int32_t next) {
        if ((eos && next == *eos) || (stop && next == *stop)) return false;
        it.output += dec.step(next);
        if (plain && it.output.find("Question:") != std::string::npos) {
          it.output.resize(it.output.find("Question:"));
          return false;
        }
        return true;
      });
      it.output += dec.finish();
    }
    it.pred = extract_answer(it.output);
    it.correct = it.pred && answers_match(*it.pred, it.gold);
    if (!o.journal.empty()) {
      if (!journal.is_open()) {
        if (!fs::exists(o.journal)) write_file_atomic(o.journal, nlohmann::json{{"fingerprint", fp}}.dump() + "\n");
        journal.open(o.journal, std::ios::app | std::ios::binary);
        NIBBLE_CHECK(journal.good(), "{}: cannot open the journal for writing", o.journal.string());
      }
      journal << answer_json(it).dump() << '\n';
      journal.flush();
      NIBBLE_CHECK(journal.good(), "{}: writing the journal failed", o.journal.string());
    }
    if (o.on_answer) o.on_answer(it);
    bar.advance();
  }
  bar.finish();
  return items;
}

double mcnemar_exact(int64_t b, int64_t c) {
  const int64_t n = b + c;
  if (n == 0) return 1.0;
  const int64_t k = std::min(b, c);
  // P(X <= k) for X ~ Binomial(n, 1/2), in log space for large n.
  double tail = 0;
  for (int64_t i = 0; i <= k; ++i)
    tail += std::exp(std::lgamma(n + 1.0) - std::lgamma(i + 1.0) - std::lgamma(n - i + 1.0) - n * std::log(2.0));
  return std::min(1.0, 2 * tail);
}

Flips compare_answers(const fs::path& a, const fs::path& b) {
  auto read = [](const fs::path& p) {
    NIBBLE_CHECK(fs::is_regular_file(p), "flips: {}: no such file", p.string());
    std::ifstream f(p);
    std::map<std::string, bool> m;
    std::string line;
    int64_t lineno = 0;
    while (std::getline(f, line)) {
      ++lineno;
      if (line.empty()) continue;
      const auto j = nlohmann::json::parse(line, nullptr, false);
      NIBBLE_CHECK(!j.is_discarded() && j.contains("id") && j.contains("correct") && j["correct"].is_boolean(),
                   "flips: {} line {}: expected a JSON object with \"id\" and boolean \"correct\"", p.string(), lineno);
      const std::string id = j["id"].dump();
      NIBBLE_CHECK(!m.count(id), "flips: {} line {}: id {} appears twice", p.string(), lineno, id);
      m[id] = j["correct"].get<bool>();
    }
    NIBBLE_CHECK(!m.empty(), "flips: {} has no answers", p.string());
    return m;
  };
  const auto ma = read(a), mb = read(b);
  NIBBLE_CHECK(ma.size() == mb.size(), "flips: {} has {} answers, {} has {}", a.string(), ma.size(), b.string(),
               mb.size());
  Flips fl;
  int64_t ra = 0, rb = 0;
  for (const auto& [id, ca] : ma) {
    const auto it = mb.find(id);
    NIBBLE_CHECK(it != mb.end(), "flips: id {} is in {} but not in {}", id, a.string(), b.string());
    const bool cb = it->second;
    ++fl.n;
    ra += ca;
    rb += cb;
    fl.n01 += !ca && cb;
    fl.n10 += ca && !cb;
  }
  fl.acc_a = static_cast<double>(ra) / fl.n;
  fl.acc_b = static_cast<double>(rb) / fl.n;
  fl.flip_rate = static_cast<double>(fl.n01 + fl.n10) / fl.n;
  fl.p_value = mcnemar_exact(fl.n01, fl.n10);
  return fl;
}

}  // namespace nibble::eval
