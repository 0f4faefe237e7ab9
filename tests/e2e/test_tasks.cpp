// Task answers and their comparison: answer extraction, McNemar's exact test
// against hand-computed binomial tails, and the two verbs end to end.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "nibble/error.h"
#include "nibble/tasks.h"
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

}  // namespace
}  // namespace nibble::eval
