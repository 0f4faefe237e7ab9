// The tokenizer a GGUF file carries, against the Hugging Face tokenizer.json
// of the same model: stories260K's GGUF (written by llama.cpp's converter
// from the SentencePiece model) must give tokenizer.json's merges and ids;
// qwen3-26M-linux's byte-level BPE vocabulary, put into tokenizer.ggml.* form
// as convert_hf_to_gguf.py does (tokens by id, "a b" merges, special added
// tokens as control tokens, pre "qwen2"), must encode as its tokenizer.json.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "nibble/error.h"
#include "nibble/gguf.h"
#include "nibble/tokenizer.h"
#include "test_util.h"

namespace nibble {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string read_text(const fs::path& p, size_t max_bytes) {
  std::ifstream f(p, std::ios::binary);
  std::string s(max_bytes, '\0');
  f.read(s.data(), static_cast<std::streamsize>(max_bytes));
  s.resize(static_cast<size_t>(f.gcount()));
  while (!s.empty() && (static_cast<unsigned char>(s.back()) & 0xC0) == 0x80) s.pop_back();  // whole characters
  if (!s.empty() && static_cast<unsigned char>(s.back()) >= 0xC0) s.pop_back();
  return s;
}

// Lines of `text` and a few hard cases, each encoded and decoded by both.
void expect_same_tokenizer(const Tokenizer& want, const Tokenizer& got, const std::string& text,
                           const std::vector<std::string>& extra) {
  std::vector<std::string> cases = extra;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) cases.push_back(line);
  cases.push_back(text);  // newlines and all
  ASSERT_GT(cases.size(), 50u);
  EXPECT_EQ(got.vocab_size(), want.vocab_size());
  EXPECT_EQ(got.bos_id(), want.bos_id());
  EXPECT_EQ(got.eos_id(), want.eos_id());
  for (const std::string& c : cases) {
    for (bool special : {true, false}) {
      const std::vector<int32_t> ids = want.encode(c, special);
      ASSERT_EQ(got.encode(c, special), ids) << "'" << c.substr(0, 80) << "' special " << special;
      ASSERT_EQ(got.decode(ids), want.decode(ids)) << c.substr(0, 80);
    }
    ASSERT_EQ(got.pre_tokenize(c), want.pre_tokenize(c)) << c.substr(0, 80);
  }
}

const std::vector<std::string> kHardCases = {"",
                                             " ",
                                             "  two leading spaces",
                                             "trailing spaces  ",
                                             "tabs\tand\nnewlines\n\n",
                                             "Ünïcödé façade — naïve café",
                                             "emoji \xF0\x9F\x98\x80 and CJK \xE4\xBD\xA0\xE5\xA5\xBD",
                                             "digits 1234567 and 3.14159",
                                             "it's they're we've I'm you'll he'd DON'T"};

TEST(GgufTokenizer, SentencePieceVocabularyIsTheHfTokenizer) {
  const fs::path dir = test::model_dir("stories260K");
  const auto gguf = GgufSource::open(dir / "gguf" / "stories260K-Q4_K_M.gguf");
  // The merges are transformers' own, in order.
  const json made = json::parse(io::tokenizer_json_from_gguf(gguf->vocab(), "test"));
  std::ifstream hf_file(dir / "tokenizer.json");
  const json hf = json::parse(hf_file);
  ASSERT_EQ(made["model"]["merges"].size(), hf["model"]["merges"].size());
  for (size_t i = 0; i < hf["model"]["merges"].size(); ++i) {
    const std::string m = hf["model"]["merges"][i].get<std::string>();  // "a b"
    EXPECT_EQ(made["model"]["merges"][i][0].get<std::string>() + " " + made["model"]["merges"][i][1].get<std::string>(),
              m)
        << i;
  }
  const std::optional<Tokenizer> tok = gguf->tokenizer();
  ASSERT_TRUE(tok);
  std::vector<std::string> extra = kHardCases;
  extra.push_back("<s>Once upon a time</s>");  // control tokens' text becomes their ids
  expect_same_tokenizer(Tokenizer::from_file(dir / "tokenizer.json"), *tok,
                        read_text(test::shared_dir() / "data/corpora/tinystories-valid-sample.txt", 20000), extra);
}

// qwen3-26M-linux's tokenizer.json as tokenizer.ggml.* (what convert_hf_to_gguf.py writes for it).
io::GgufVocab qwen3_vocab() {
  std::ifstream f(test::model_dir("qwen3-26M-linux") / "tokenizer.json");
  const json hf = json::parse(f);
  io::GgufVocab v;
  v.model = "gpt2";
  v.pre = "qwen2";
  std::map<int64_t, std::string> by_id;
  for (const auto& [tok, id] : hf["model"]["vocab"].items()) by_id[id.get<int64_t>()] = tok;
  std::set<int64_t> special;
  for (const json& a : hf["added_tokens"]) {
    by_id[a["id"].get<int64_t>()] = a["content"].get<std::string>();
    if (a["special"].get<bool>()) special.insert(a["id"].get<int64_t>());
  }
  for (const auto& [id, tok] : by_id) {
    EXPECT_EQ(id, static_cast<int64_t>(v.tokens.size()));
    v.tokens.push_back(tok);
    v.token_types.push_back(special.count(id) ? 3 : 1);
  }
  for (const json& m : hf["model"]["merges"])
    v.merges.push_back(m.is_string() ? m.get<std::string>() : m[0].get<std::string>() + " " + m[1].get<std::string>());
  v.eos_id = 0;  // <|endoftext|>, as tokenizer_config.json says
  v.add_bos = false;
  return v;
}

TEST(GgufTokenizer, ByteLevelVocabularyIsTheHfTokenizer) {
  const fs::path dir = test::model_dir("qwen3-26M-linux");
  const io::GgufVocab v = qwen3_vocab();
  TokenizerConfig tc;
  tc.eos_token = v.tokens[0];
  const Tokenizer tok = Tokenizer::from_json(io::tokenizer_json_from_gguf(v, "qwen3 as gguf"), "qwen3 as gguf", tc);
  // The pre-tokenizer is the one Qwen's tokenizer.json has.
  std::ifstream hf_file(dir / "tokenizer.json");
  EXPECT_EQ(json::parse(io::tokenizer_json_from_gguf(v, "test"))["pre_tokenizer"], json::parse(hf_file)["pre_tokenizer"]);
  std::vector<std::string> extra = kHardCases;
  extra.push_back("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  expect_same_tokenizer(Tokenizer::from_file(dir / "tokenizer.json"), tok,
                        read_text(test::shared_dir() / "data/corpora/linux-eval.txt", 30000), extra);
}

TEST(GgufTokenizer, UnsupportedVocabulariesAreNamed) {
  io::GgufVocab v = qwen3_vocab();
  v.pre = "tekken";
  std::string e = test::error_of([&] { io::tokenizer_json_from_gguf(v, "m.gguf"); });
  EXPECT_NE(e.find("m.gguf: tokenizer.ggml.pre 'tekken' is not a pre-tokenizer nibble knows (known: llama-bpe"),
            std::string::npos)
      << e;
  v.pre.clear();
  e = test::error_of([&] { io::tokenizer_json_from_gguf(v, "m.gguf"); });
  EXPECT_NE(e.find("tokenizer.ggml.pre '(none)' is not a pre-tokenizer"), std::string::npos) << e;
  v.pre = "qwen2";
  v.model = "t5";
  e = test::error_of([&] { io::tokenizer_json_from_gguf(v, "m.gguf"); });
  EXPECT_NE(e.find("tokenizer.ggml.model 't5' is not supported"), std::string::npos) << e;
  v.model = "gpt2";
  v.merges.push_back("onlyone");
  e = test::error_of([&] { io::tokenizer_json_from_gguf(v, "m.gguf"); });
  EXPECT_NE(e.find("merges entry 'onlyone'"), std::string::npos) << e;
  v.merges.pop_back();
  v.tokens[5] = "bad \xFF byte";  // found by fuzz_gguf_model: JSON cannot carry it
  e = test::error_of([&] { io::tokenizer_json_from_gguf(v, "m.gguf"); });
  EXPECT_NE(e.find("m.gguf: tokenizer.ggml.tokens[5] is not valid UTF-8"), std::string::npos) << e;
  v.tokens[5] = "ok";
  v.eos_id = 1 << 20;
  e = test::error_of([&] { io::tokenizer_json_from_gguf(v, "m.gguf"); });
  EXPECT_NE(e.find("eos_token_id 1048576 is outside the"), std::string::npos) << e;
  v.tokens.clear();
  e = test::error_of([&] { io::tokenizer_json_from_gguf(v, "m.gguf"); });
  EXPECT_NE(e.find("carries no tokenizer"), std::string::npos) << e;
}

// The verbs take a GGUF file as --model: its F32 file gives the HF checkpoint's perplexity and greedy text.
TEST(GgufTokenizer, VerbsTakeAGgufFile) {
  const fs::path dir = test::model_dir("stories260K");
  const std::string f32 = (dir / "gguf" / "stories260K-F32.gguf").string();
  const std::string text = (test::shared_dir() / "data/corpora/tinystories-valid-sample.txt").string();
  const std::string bin = test::nibble_bin();
  auto ppl = [&](const std::string& m) {
    return test::run_command(bin + " ppl -q --model " + m + " --text " + text + " --ctx 128 --chunks 8");
  };
  const auto p_hf = ppl(dir.string()), p_gguf = ppl(f32);
  ASSERT_EQ(p_hf.exit_code, 0) << p_hf.err;
  ASSERT_EQ(p_gguf.exit_code, 0) << p_gguf.err;
  EXPECT_NE(p_hf.out.find("ppl "), std::string::npos) << p_hf.out;
  EXPECT_EQ(p_gguf.out, p_hf.out);
  auto run = [&](const std::string& m) {
    return test::run_command(bin + " run -q --model " + m + " --prompt 'Once upon a time' -n 24");
  };
  const auto r_hf = run(dir.string()), r_gguf = run(f32);
  ASSERT_EQ(r_gguf.exit_code, 0) << r_gguf.err;
  EXPECT_GT(r_hf.out.size(), 40u) << r_hf.out;
  EXPECT_EQ(r_gguf.out, r_hf.out);
  const auto ins = test::run_command(bin + " inspect " + (dir / "gguf" / "stories260K-Q4_K_M.gguf").string());
  ASSERT_EQ(ins.exit_code, 0) << ins.err;
  EXPECT_NE(ins.out.find("GGUF v3, llama"), std::string::npos) << ins.out;
  EXPECT_NE(ins.out.find("tokenizer llama, 512 tokens"), std::string::npos) << ins.out;
  EXPECT_NE(ins.out.find("Q4_K"), std::string::npos) << ins.out;
  const auto md = test::run_command(bin + " inspect --metadata " + (dir / "gguf" / "stories260K-Q4_K_M.gguf").string());
  ASSERT_EQ(md.exit_code, 0) << md.err;
  for (const char* line : {"general.architecture", "\"llama\"", "[512 x string] \"<unk>\", \"<s>\", \"</s>\"",
                           "llama.block_count", "uint32   5"})
    EXPECT_NE(md.out.find(line), std::string::npos) << line << "\n" << md.out;
  const auto bad = test::run_command(bin + " run -q --model " + (dir / "gguf" / "README.md").string() + " --prompt x");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("a file that is not GGUF"), std::string::npos) << bad.err;
}

}  // namespace
}  // namespace nibble
