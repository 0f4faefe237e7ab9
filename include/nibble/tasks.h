// Task accuracy where it is needed, and what it can tell: GSM8K answers from
// greedy generation, and McNemar's exact test on the problems two models
// disagree about (the flips), which is how two checkpoints' task scores
// should be compared.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "nibble/source.h"

namespace nibble::eval {

// The answer a completion gives: the content of the last \boxed{...} if any,
// else the last number (commas and a trailing period dropped); nullopt if none.
std::optional<std::string> extract_answer(const std::string& text);
// GSM8K's reference answer: the text after the last "####".
std::string gsm8k_gold(const std::string& answer_field);
// Numeric equality when both parse as numbers, else exact text equality.
bool answers_match(const std::string& pred, const std::string& gold);

struct Gsm8kOptions {
  std::filesystem::path data;  // gsm8k jsonl ({"question", "answer"} per line)
  int64_t n = 200;             // first n problems
  int64_t max_new_tokens = 256;
  bool progress = true;
};

struct Gsm8kItem {
  int64_t id = 0;
  std::string question, gold, output;
  std::optional<std::string> pred;
  bool correct = false;
};

// Greedy generation for each problem. The prompt uses the ChatML chat format
// when the tokenizer has <|im_start|>/<|im_end|> tokens (Qwen-style chat
// models), else "Question: ...\nAnswer:" (base models); generation stops at
// EOS, at <|im_end|>, at a new "Question:", or after max_new_tokens.
std::vector<Gsm8kItem> run_gsm8k(const ModelSource& model, const std::filesystem::path& tokenizer_json,
                                 const Gsm8kOptions& o, std::string* prompt_style = nullptr);

struct Flips {
  int64_t n = 0, n01 = 0, n10 = 0;  // n01: wrong in A, right in B; n10: right in A, wrong in B
  double acc_a = 0, acc_b = 0;
  double flip_rate = 0;  // (n01 + n10) / n
  double p_value = 1;    // McNemar's exact (two-sided binomial on the discordant pairs)
};

// Two-sided exact McNemar p-value for discordant counts b and c.
double mcnemar_exact(int64_t b, int64_t c);
// Joins two answer files (jsonl with "id" and "correct") on id.
Flips compare_answers(const std::filesystem::path& a, const std::filesystem::path& b);

}  // namespace nibble::eval
