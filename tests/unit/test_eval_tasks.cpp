// RULER-style task generator (src/eval/tasks.h): determinism from the seed, token-length targeting with
// the real SmolLM2 tokenizer (the committed GGUF vocabulary fixture), needle depths, text cleaning.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "eval/eval_runner.h"
#include "eval/tasks.h"
#include "retroinfer/error.h"
#include "test_eval_util.h"
#include "test_tokenizer_util.h"

namespace retroinfer {
namespace {

using eval::TaskGenerator;
using eval::TaskSample;

const Tokenizer& smollm2() {
  static const std::unique_ptr<Tokenizer> tok = Tokenizer::from_vocab(test::load_smollm2_vocab());
  return *tok;
}

TaskGenerator make_gen(uint64_t seed = 42, int num_depths = 11) {
  eval::TaskOptions o;
  o.seed = seed;
  o.num_depths = num_depths;
  return TaskGenerator(test::small_resources(), eval::token_counter(smollm2()), eval::chat_prompt_wrapper(smollm2()), o);
}

TEST(EvalTasks, SameSeedSameSampleOtherSeedOrIndexDiffers) {
  const TaskGenerator a = make_gen(7), b = make_gen(7), c = make_gen(8);
  for (const std::string task : {"niah_multikey", "vt", "fwe"}) {
    const TaskSample s1 = a.make(task, 1024, 3), s2 = b.make(task, 1024, 3);
    EXPECT_EQ(s1.prompt, s2.prompt) << task;
    EXPECT_EQ(s1.references, s2.references) << task;
    EXPECT_NE(s1.prompt, a.make(task, 1024, 4).prompt) << task;
    EXPECT_NE(s1.references, c.make(task, 1024, 3).references) << task;
  }
}

// Every task lands in [0.99 target, target] tokens as counted by the model's tokenizer, and the prompt
// ends with the chat template's assistant turn plus the answer prefix; every needle's value is in it.
TEST(EvalTasks, TokenLengthWithinOnePercentForEveryTask) {
  const TaskGenerator g = make_gen();
  for (const auto& task : eval::task_names()) {
    for (int64_t target : {1024, 1500}) {
      const TaskSample s = g.make(task, target, 1);
      const int64_t n = static_cast<int64_t>(smollm2().encode(s.prompt, false, true).size());
      EXPECT_EQ(n, s.prompt_tokens) << task << " " << target;
      EXPECT_LE(n, target) << task << " " << target;
      EXPECT_GE(n, static_cast<int64_t>(std::ceil(0.99 * target))) << task << " " << target;
      EXPECT_NE(s.prompt.find("<|im_start|>assistant\n"), std::string::npos) << task;
      ASSERT_FALSE(s.references.empty()) << task;
      for (const auto& r : s.references) EXPECT_NE(s.prompt.find(r), std::string::npos) << task << " ref " << r;
    }
  }
}

// The (first) needle sits at the asked depth of the haystack: exact up to a unit for the noise haystack
// (5-word sentences), up to one sentence of the essay (<= 13 words of ~700) where it snaps to a sentence end.
TEST(EvalTasks, NeedleAtAskedDepth) {
  const TaskGenerator g = make_gen(42, 11);
  for (const auto& [task, tol] : {std::pair<std::string, double>{"niah_single_1", 0.01}, {"niah_single_2", 0.03},
                                  {"passkey", 0.01}, {"niah_multikey", 0.03}}) {
    for (int i = 0; i < 11; ++i) {
      const TaskSample s = g.make(task, 1024, i);
      const double want = i / 10.0;
      EXPECT_DOUBLE_EQ(s.depth, want);
      ASSERT_FALSE(s.needle_depths.empty());
      EXPECT_NEAR(s.needle_depths[0], want, tol) << task << " #" << i;
      ASSERT_NE(s.needle_offsets[0], std::string::npos) << task << " #" << i;
    }
  }
  // Offsets are in order of depth: the needle at depth 0 comes before the one at depth 1.
  EXPECT_LT(g.make("niah_single_1", 1024, 0).needle_offsets[0], g.make("niah_single_1", 1024, 10).needle_offsets[0]);
}

TEST(EvalTasks, MultiNeedleTasksHaveTheirReferences) {
  const TaskGenerator g = make_gen();
  EXPECT_EQ(g.make("niah_multikey", 1024, 0).references.size(), 1u);
  EXPECT_EQ(g.make("niah_multikey", 1024, 0).needle_offsets.size(), 4u);
  EXPECT_EQ(g.make("niah_multivalue", 1024, 0).references.size(), 4u);
  EXPECT_EQ(g.make("niah_multiquery", 1024, 0).references.size(), 4u);
  const TaskSample vt = g.make("vt", 1024, 2);
  ASSERT_EQ(vt.references.size(), 5u);
  // The chain is in reading order.
  EXPECT_TRUE(std::is_sorted(vt.needle_offsets.begin(), vt.needle_offsets.end()));
  EXPECT_EQ(g.make("cwe", 1024, 0).references.size(), 10u);
  EXPECT_EQ(g.make("fwe", 1024, 0).references.size(), 3u);
  EXPECT_EQ(g.make("niah_single_3", 1024, 0).references[0].size(), 36u);  // a uuid
}

TEST(EvalTasks, BadInputsThrow) {
  const TaskGenerator g = make_gen();
  EXPECT_THROW(g.make("niah_nope", 1024, 0), Error);
  EXPECT_THROW(g.make("niah_single_1", 60, 0), Error);  // below the fixed text
  EXPECT_THROW(eval::parse_task_list("vt,bogus"), Error);
  EXPECT_EQ(eval::parse_task_list("vt,cwe"), (std::vector<std::string>{"vt", "cwe"}));
  EXPECT_EQ(eval::parse_task_list("all").size(), 10u);
  eval::TaskResources tiny;
  tiny.essay_words = {"a", "b"};
  tiny.words = test::small_resources().words;
  EXPECT_THROW(TaskGenerator(tiny, eval::token_counter(smollm2()), eval::chat_prompt_wrapper(smollm2())), Error);
}

TEST(EvalTasks, CleanBibleTextAndWordList) {
  const std::string raw =
      "\nGenesis 1\n\n  1 In the beginning God created the heaven and the earth.\n  2 And the earth was without form,\n"
      "and void.\n\n1 Kings 3\n\n  10 And the speech pleased the Lord.\n";
  EXPECT_EQ(eval::clean_bible_text(raw),
            "In the beginning God created the heaven and the earth. And the earth was without form, and void. "
            "And the speech pleased the Lord.");
  EXPECT_EQ(eval::split_words("  a bb\tc\n"), (std::vector<std::string>{"a", "bb", "c"}));
  EXPECT_EQ(eval::filter_word_list("apple\nApple\nbe\napple's\ncherry\napple\nextraordinarily\n"),
            (std::vector<std::string>{"apple", "cherry"}));
}

}  // namespace
}  // namespace retroinfer
