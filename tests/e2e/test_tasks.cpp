// Task answers and their comparison: answer extraction, McNemar's exact test
// against hand-computed binomial tails, and the two verbs end to end.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "nibble/error.h"
#include "nibble/source.h"
#include "nibble/tasks.h"
#include "nibble/tokenizer.h"
#include "test_util.h"

namespace nibble::eval {
namespace {

using test::TempDir;

TEST(Tasks, ExtractsTheLastBoxedOrNumber) {
  EXPECT_EQ(extract_answer("so 3 + 4 = 7, then 7 * 2 = 14."), "14");
  EXPECT_EQ(extract_answer("She makes $1,234.50 a day"), "1234.50");
  EXPECT_EQ(extract_answer("x = \\boxed{42} and later 7"), "42");
  EXPECT_EQ(extract_answer("\\boxed{\\frac{1}{2}}"), "\\frac{1}{2}");
  EXPECT_EQ(extract_answer("temperature fell to -5 degrees"), "-5");
  EXPECT_FALSE(extract_answer("no digits here").has_value());
  EXPECT_EQ(extract_answer("half is .5 of it"), ".5");
  // Generated text need not be valid UTF-8, and a runaway generation can be one long number.
  EXPECT_EQ(extract_answer("\xFF\xFE 12 \xC3"), "12");
  EXPECT_EQ(extract_answer("so " + std::string(200000, '9') + "!"), std::string(200000, '9'));
  EXPECT_EQ(gsm8k_gold("blah <<2*9=18>>18\n#### 1,018"), "1018");
  EXPECT_TRUE(answers_match("18.0", "18"));
  EXPECT_FALSE(answers_match("17", "18"));
  EXPECT_THROW(gsm8k_gold("no marker"), Error);
}

// qwen3-26M-linux's tokenizer with its three special tokens renamed to Llama
// 3's: <|eot_id|> on id 0, <|start_header_id|> on 1, <|end_header_id|> on 2.
Tokenizer qwen3_with_llama3_chat_tokens() {
  nlohmann::json j = nlohmann::json::parse(test::read_file(test::model_dir("qwen3-26M-linux") / "tokenizer.json"));
  const char* llama3[] = {"<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"};
  const char* qwen3[] = {"<|endoftext|>", "<|im_start|>", "<|im_end|>"};
  for (auto& a : j["added_tokens"])
    if (a["id"].get<int>() < 3) a["content"] = llama3[a["id"].get<int>()];
  for (int id = 0; id < 3; ++id) {  // the vocabulary holds them too
    j["model"]["vocab"].erase(qwen3[id]);
    j["model"]["vocab"][llama3[id]] = id;
  }
  return Tokenizer::from_json(j.dump(), "qwen3 with Llama 3's chat tokens");
}

// gsm8k's prompt follows the chat format the tokenizer's special tokens name:
// qwen3's ChatML tokens, Llama 3's header and end-of-turn tokens (here put on
// qwen3's special ids), and no chat tokens at all (stories260K).
TEST(Tasks, Gsm8kPromptFollowsTheTokenizersChatFormat) {
  const std::string q = "What is 2 + 3?";
  auto count = [](const std::vector<int32_t>& ids, std::optional<int32_t> id) {
    return std::count(ids.begin(), ids.end(), id.value_or(-1));
  };
  const Tokenizer qwen = Tokenizer::from_file(test::model_dir("qwen3-26M-linux") / "tokenizer.json");
  const Gsm8kPrompt chatml = gsm8k_prompt(qwen, q);
  EXPECT_EQ(chatml.style, "chatml");
  EXPECT_EQ(chatml.stop, qwen.token_to_id("<|im_end|>"));
  EXPECT_EQ(chatml.ids, qwen.encode("<|im_start|>user\nWhat is 2 + 3?\nPut the final answer in \\boxed{}.<|im_end|>\n"
                                    "<|im_start|>assistant\n",
                                    true));
  EXPECT_EQ(count(chatml.ids, qwen.token_to_id("<|im_start|>")), 2);
  EXPECT_EQ(count(chatml.ids, qwen.token_to_id("<|im_end|>")), 1);

  const Tokenizer l3 = qwen3_with_llama3_chat_tokens();
  const Gsm8kPrompt chat = gsm8k_prompt(l3, q);
  EXPECT_EQ(chat.style, "llama3");
  EXPECT_EQ(chat.stop, std::optional<int32_t>(0));
  EXPECT_EQ(chat.ids, l3.encode("<|start_header_id|>user<|end_header_id|>\n\nWhat is 2 + 3?\nPut the final answer in "
                                "\\boxed{}.<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
                                true));
  EXPECT_EQ(count(chat.ids, 1), 2);  // each header opened...
  EXPECT_EQ(count(chat.ids, 2), 2);  // ...and closed
  EXPECT_EQ(count(chat.ids, 0), 1);  // the user's turn ended; the assistant's is open

  const Tokenizer stories = Tokenizer::from_file(test::model_dir("stories260K") / "tokenizer.json");
  const Gsm8kPrompt plain = gsm8k_prompt(stories, q);
  EXPECT_EQ(plain.style, "plain");
  EXPECT_FALSE(plain.stop.has_value());
  EXPECT_EQ(plain.ids, stories.encode("Question: What is 2 + 3?\nAnswer:", true));
}

// A journal written with Llama 3's chat format says so in its fingerprint (an
// earlier build wrote plain prompts for that tokenizer), and a run with
// another format does not resume it; ChatML journals keep their fingerprint.
TEST(Tasks, Gsm8kJournalNamesTheLlama3ChatFormat) {
  TempDir tmp;
  const auto src = open_model_source(test::model_dir("qwen3-26M-linux").string());
  Gsm8kOptions o;
  o.data = test::shared_dir() / "data/corpora/gsm8k-test.jsonl";
  o.n = 1;
  o.max_new_tokens = 2;
  o.progress = false;
  auto fingerprint = [&](const Tokenizer& tok, const std::string& name) {
    o.journal = tmp / name;
    std::string style;
    run_gsm8k(*src, tok, o, &style);
    const std::string text = test::read_file(o.journal);
    return std::make_pair(style, nlohmann::json::parse(text.substr(0, text.find('\n')))["fingerprint"]);
  };
  const Tokenizer l3 = qwen3_with_llama3_chat_tokens();
  const auto [l3_style, l3_fp] = fingerprint(l3, "l3.partial");
  EXPECT_EQ(l3_style, "llama3");
  EXPECT_EQ(l3_fp.value("prompt", ""), "llama3");
  const auto [q_style, q_fp] = fingerprint(*src->tokenizer(), "qwen.partial");
  EXPECT_EQ(q_style, "chatml");
  EXPECT_FALSE(q_fp.contains("prompt"));
  // The Llama 3 journal, resumed by a run whose prompts are ChatML: refused.
  o.journal = tmp / "l3.partial";
  o.resume = true;
  const std::string e = test::error_of([&] { run_gsm8k(*src, *src->tokenizer(), o); });
  EXPECT_NE(e.find("differs from this one in prompt"), std::string::npos) << e;
}

TEST(Tasks, McNemarExactMatchesBinomialTails) {
  EXPECT_DOUBLE_EQ(mcnemar_exact(0, 0), 1.0);
  EXPECT_NEAR(mcnemar_exact(2, 8), 2.0 * (1 + 10 + 45) / 1024, 1e-12);  // 0.109375
  EXPECT_NEAR(mcnemar_exact(8, 2), 0.109375, 1e-12);
  EXPECT_NEAR(mcnemar_exact(0, 6), 2.0 / 64, 1e-12);
  EXPECT_DOUBLE_EQ(mcnemar_exact(5, 5), 1.0);  // capped
  EXPECT_LT(mcnemar_exact(10, 60), 1e-9);
}

TEST(Tasks, FlipsAndGsm8kThroughTheCli) {
  TempDir tmp;
  {
    std::ofstream a(tmp / "a.jsonl"), b(tmp / "b.jsonl");
    // 10 problems: both right on 0-2, A only on 3-4 (n10 = 2), B only on 5-9 (n01 = 5).
    for (int i = 0; i < 10; ++i) {
      a << nlohmann::json{{"id", i}, {"correct", i < 5}}.dump() << "\n";
      b << nlohmann::json{{"id", 9 - i}, {"correct", (9 - i) < 3 || (9 - i) >= 5}}.dump() << "\n";
    }
  }
  auto r = test::run_command(test::nibble_bin() + " flips " + (tmp / "a.jsonl").string() + " " +
                             (tmp / "b.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("n01 (A wrong, B right) 5  n10 (A right, B wrong) 2"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("McNemar exact p 0.4531"), std::string::npos) << r.out;  // 2*(1+7+21)/128
  std::ofstream(tmp / "c.jsonl") << R"({"id": 0, "correct": true})" << "\n";
  r = test::run_command(test::nibble_bin() + " flips " + (tmp / "a.jsonl").string() + " " + (tmp / "c.jsonl").string());
  EXPECT_NE(r.exit_code, 0);

  // A tiny model answers (almost surely wrongly), and the file is complete.
  r = test::run_command(test::nibble_bin() + " gsm8k -q --model " + test::model_dir("stories260K").string() +
                        " --data " + (test::shared_dir() / "data/corpora/gsm8k-test.jsonl").string() +
                        " --n 3 --max-new 24 --out " + (tmp / "g.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("/ 3 correct"), std::string::npos) << r.out;
  std::ifstream g(tmp / "g.jsonl");
  std::string line;
  int lines = 0;
  while (std::getline(g, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_TRUE(j.contains("correct") && j.contains("output") && j.contains("gold"));
    ++lines;
  }
  EXPECT_EQ(lines, 3);

  // A problem whose question is not a string is refused with the file and
  // line (it was nlohmann's type_error, with neither).
  std::ofstream(tmp / "bad.jsonl") << R"({"question": "2+2?", "answer": "#### 4"})" << "\n"
                                   << R"({"question": 5, "answer": "#### 5"})" << "\n";
  r = test::run_command(test::nibble_bin() + " gsm8k -q --model " + test::model_dir("stories260K").string() +
                        " --data " + (tmp / "bad.jsonl").string() + " --n 3 --out " + (tmp / "h.jsonl").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("bad.jsonl line 2: expected a JSON object with \"question\" and \"answer\" strings"),
            std::string::npos)
      << r.err;
}

// An interrupted run continues from its journal and ends with the answers an
// uninterrupted run gives; a journal of another run, a corrupt one, or one
// left without --resume is refused.
TEST(Tasks, Gsm8kJournalResumesAnInterruptedRun) {
  TempDir tmp;
  const std::string model = test::model_dir("stories260K").string();
  const auto src = open_model_source(model);
  const Tokenizer tokenizer = *src->tokenizer();
  Gsm8kOptions o;
  o.data = test::shared_dir() / "data/corpora/gsm8k-test.jsonl";
  o.n = 3;
  o.max_new_tokens = 16;
  o.progress = false;
  const std::vector<Gsm8kItem> full = run_gsm8k(*src, tokenizer, o);
  ASSERT_EQ(full.size(), 3u);

  o.journal = tmp / "a.jsonl.partial";
  int calls = 0;
  o.on_answer = [&](const Gsm8kItem&) {
    if (++calls == 2) throw std::runtime_error("interrupted");
  };
  EXPECT_THROW(run_gsm8k(*src, tokenizer, o), std::runtime_error);
  const std::string two = test::read_file(o.journal);  // the run's line and two answers
  EXPECT_EQ(std::count(two.begin(), two.end(), '\n'), 3);
  std::ofstream(o.journal, std::ios::app) << R"({"id": 2, "gold": "1)";  // cut off by the interruption

  calls = 0;
  o.on_answer = [&](const Gsm8kItem& it) {
    ++calls;
    EXPECT_EQ(it.id, 2);
  };
  std::string e = test::error_of([&] { run_gsm8k(*src, tokenizer, o); });
  EXPECT_NE(e.find("pass --resume to continue it or --force"), std::string::npos) << e;
  o.resume = true;
  o.max_new_tokens = 8;
  e = test::error_of([&] { run_gsm8k(*src, tokenizer, o); });
  EXPECT_NE(e.find("differs from this one in max_new_tokens"), std::string::npos) << e;
  o.max_new_tokens = 16;
  const std::vector<Gsm8kItem> resumed = run_gsm8k(*src, tokenizer, o);
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(resumed[i].resumed, i < 2);
    EXPECT_EQ(answer_json(resumed[i]), answer_json(full[i])) << i;
  }
  const std::string three = test::read_file(o.journal);  // the cut-off line is gone, the third answer follows
  EXPECT_EQ(three.substr(0, two.size()), two);
  EXPECT_EQ(std::count(three.begin(), three.end(), '\n'), 4);
  std::istringstream lines(three);
  for (std::string line; std::getline(lines, line);)
    EXPECT_FALSE(nlohmann::json::parse(line, nullptr, false).is_discarded()) << line;

  // A smaller --n takes the journal's first answers and generates nothing.
  calls = 0;
  o.n = 2;
  const std::vector<Gsm8kItem> first = run_gsm8k(*src, tokenizer, o);
  EXPECT_EQ(calls, 0);
  ASSERT_EQ(first.size(), 2u);
  EXPECT_EQ(answer_json(first[1]), answer_json(full[1]));
  o.n = 3;

  // An answer line in the middle that is not one is not an interruption's doing.
  std::ofstream(o.journal, std::ios::trunc) << three.substr(0, three.find('\n') + 1) << "{\"id\": 0}\n"
                                            << three.substr(three.find('\n') + 1);
  e = test::error_of([&] { run_gsm8k(*src, tokenizer, o); });
  EXPECT_NE(e.find("line 2: not an answer"), std::string::npos) << e;

  // --force starts over.
  o.resume = false;
  o.force = true;
  calls = 0;
  o.on_answer = [&](const Gsm8kItem&) { ++calls; };
  const std::vector<Gsm8kItem> again = run_gsm8k(*src, tokenizer, o);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(answer_json(again[2]), answer_json(full[2]));

  // The verb: a leftover OUT.partial is refused without --resume, continued with it, and removed at
  // the end; the answers file is the one an uninterrupted run writes.
  const std::string cli = test::nibble_bin() + " gsm8k -q --model " + model + " --data " + o.data.string() +
                          " --n 3 --max-new 16 --out ";
  auto r = test::run_command(cli + (tmp / "u.jsonl").string());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_FALSE(std::filesystem::exists(tmp / "u.jsonl.partial"));
  std::ofstream(tmp / "r.jsonl.partial") << two;
  r = test::run_command(cli + (tmp / "r.jsonl").string());
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--resume"), std::string::npos) << r.err;
  r = test::run_command(cli + (tmp / "r.jsonl").string() + " --resume");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("2 answers resumed"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(tmp / "r.jsonl.partial"));
  EXPECT_EQ(test::read_file(tmp / "r.jsonl"), test::read_file(tmp / "u.jsonl"));
}

}  // namespace
}  // namespace nibble::eval
