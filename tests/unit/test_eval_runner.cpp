// The eval drivers on a tiny random-weight model fixture (tests/data/models/tiny-llama3, 512 positions):
// Session::fork gives the same decode as a fresh session, the teacher-forced fidelity of full against
// itself is exact, and `eval tasks` resumes without redoing work. Skips when the fixture is absent.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include "eval/eval_runner.h"
#include "eval/ppl_fidelity.h"
#include "retroinfer/error.h"
#include "retroinfer/model.h"
#include "test_eval_util.h"

#include "tiny_model_util.h"

namespace retroinfer {
namespace {

namespace fs = std::filesystem;

// A task generator over the byte tokenizer: one token per byte, so a noise sentence is 12..22 tokens and a
// 1% length window (4 tokens at 400) is not always reachable; 10% is.
eval::TaskGenerator byte_generator(const Tokenizer& tok, uint64_t seed = eval::TaskOptions{}.seed) {
  eval::TaskOptions topt;
  topt.tolerance = 0.1;
  topt.seed = seed;
  return eval::TaskGenerator(test::small_resources(), eval::token_counter(tok), eval::chat_prompt_wrapper(tok), topt);
}

// A results file in the temp folder (removed first): <stem>_<pid>.
std::string fresh_results(const std::string& stem) {
  const std::string path = (fs::temp_directory_path() / (stem + "_" + std::to_string(::getpid()))).string();
  std::remove(path.c_str());
  return path;
}

TEST(EvalRunner, ForkDecodesLikeAFreshSession) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const auto toks = test::token_stream(200, 3);
  SessionOptions so;
  so.attention.kind = AttentionKind::kRetro;
  so.attention.window_tokens = 16;
  so.prefill_chunk = 64;
  so.max_context = 220;
  Session fresh(*m, so);
  fresh.prefill(std::span<const int32_t>(toks).first(190));
  SessionOptions base_opt = so;
  base_opt.attention.kind = AttentionKind::kFull;
  Session base(*m, base_opt);
  base.prefill(std::span<const int32_t>(toks).first(190));
  const auto fork = base.fork(so.attention);
  EXPECT_EQ(fork->position(), 190);
  std::vector<float> a(m->config().vocab_size), b(a.size());
  for (int i = 190; i < 200; ++i) {
    fresh.decode(toks[i], a);
    fork->decode(toks[i], b);
    ASSERT_EQ(a, b) << "step " << i;  // same KV bytes, same method, same inputs: bit-identical
  }
  EXPECT_EQ(base.position(), 190);  // the parent is untouched
  Session empty(*m, so);
  EXPECT_THROW(empty.fork(so.attention), Error);
}

TEST(EvalRunner, PplFidelityFullAgainstItselfIsExactStreamingIsNot) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const auto toks = test::token_stream(2 * (160 + 8 + 1), 11);
  eval::PplOptions o;
  o.prefix_tokens = 160;
  o.forced_tokens = 8;
  o.windows = 2;
  o.methods = {"streaming"};
  o.baseline_budget = eval::BaselineBudget::kNominal;  // no retro to match
  o.attention.sink_tokens = 2;
  o.attention.window_tokens = 8;
  o.prefill_chunk = 64;
  const eval::PplReport r = eval::run_ppl_fidelity(*m, toks, o);
  ASSERT_EQ(r.methods.size(), 2u);
  const auto& full = r.methods[0];
  const auto& st = r.methods[1];
  EXPECT_EQ(full.method, "full");
  EXPECT_EQ(full.steps, 16);
  EXPECT_EQ(full.kl_mean, 0.0);
  EXPECT_EQ(full.top1_agreement, 1.0);
  for (double e : full.layer_rel_err) EXPECT_LT(e, 1e-6);  // the observer compares full with exact full
  EXPECT_GT(full.ppl, 1.0);
  EXPECT_GT(st.kl_mean, 0.0);
  EXPECT_EQ(full.ppl_rel_diff_se, 0.0);  // full against itself: every paired difference is 0
  // Streaming's per-token NLL differs from full's: a positive standard error, below the spread of one token.
  EXPECT_GT(st.ppl_rel_diff_se, 0.0);
  EXPECT_LT(st.ppl_rel_diff_se, 1.0 + st.ppl_rel_diff);
  for (double e : st.layer_rel_err) EXPECT_GT(e, 1e-4);  // streaming drops ~150 of ~165 tokens
  EXPECT_LT(st.exact_tokens_per_head, 0.2 * st.context_tokens_per_head);
  EXPECT_NE(eval::markdown_table(r).find("| streaming |"), std::string::npos);
  EXPECT_NE(eval::markdown_table(r).find("% ± "), std::string::npos) << eval::markdown_table(r);
  EXPECT_TRUE(eval::to_json(r)["methods"][1].contains("ppl_rel_diff_se"));
  EXPECT_THROW(eval::run_ppl_fidelity(*m, std::span<const int32_t>(toks).first(100), o), Error);
}

TEST(EvalRunner, TasksResumeSkipsDoneSamples) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const auto tok = test::byte_tokenizer();
  // One token per byte: a noise sentence is 12..22 tokens, so a 1% window (4 tokens at 400) is not always
  // reachable; 10% is.
  const eval::TaskGenerator gen = byte_generator(*tok);
  const std::string path = fresh_results("retroinfer_eval_runner");
  eval::EvalOptions o;
  o.tasks = {"passkey"};
  o.contexts = {400};
  o.samples = 2;
  o.methods = {"full", "streaming"};
  o.baseline_budget = eval::BaselineBudget::kNominal;  // no retro to match
  o.prefill_chunk = 128;
  o.results_path = path;
  EXPECT_EQ(eval::run_eval(*m, *tok, gen, o), 4);
  auto lines = eval::load_results(path);
  ASSERT_EQ(lines.size(), 4u);
  for (const auto& j : lines) {
    EXPECT_LE(j.at("prompt_tokens").get<int64_t>(), 400);
    EXPECT_GE(j.at("prompt_tokens").get<int64_t>(), 360);
    EXPECT_GE(j.at("generated_tokens").get<int64_t>(), 1);
  }
  EXPECT_EQ(eval::run_eval(*m, *tok, gen, o), 0);  // everything present
  // Interrupted while writing the last line: that one (only) is redone, the file stays parseable.
  std::string text;
  {
    std::ifstream f(path, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(f), {});
  }
  const size_t last = text.rfind('\n', text.size() - 2);
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << text.substr(0, last + 1 + 20);
  }
  EXPECT_EQ(eval::run_eval(*m, *tok, gen, o), 1);
  EXPECT_EQ(eval::load_results(path).size(), 4u);
  // More samples: only the new ones run.
  o.samples = 3;
  EXPECT_EQ(eval::run_eval(*m, *tok, gen, o), 2);
  // Another seed makes other prompts: refuse to mix them into this file.
  const eval::TaskGenerator gen2 = byte_generator(*tok, 43);
  o.methods = {"full", "oracle"};
  EXPECT_THROW(eval::run_eval(*m, *tok, gen2, o), Error);
  std::remove(path.c_str());
}

TEST(EvalRunner, MatchedBudgetHelpers) {
  AttentionConfig c;  // sink 4 + window 64
  EXPECT_EQ(eval::matched_budget_tokens(275.4, c), 207);
  EXPECT_EQ(eval::matched_budget_tokens(60.0, c), 0);  // fewer than the steady zone: no budget beyond it
  EXPECT_THROW(eval::matched_budget_tokens(-1.0, c), Error);
  EXPECT_THROW(eval::matched_budget_tokens(std::nan(""), c), Error);
  EXPECT_EQ(eval::matched_order({"oracle", "quest", "retro", "full"}),
            (std::vector<std::string>{"full", "retro", "oracle", "quest"}));
  EXPECT_EQ(eval::parse_baseline_budget("nominal"), eval::BaselineBudget::kNominal);
  EXPECT_EQ(eval::parse_baseline_budget("matched"), eval::BaselineBudget::kMatched);
  EXPECT_THROW(eval::parse_baseline_budget("same"), Error);
  EXPECT_TRUE(eval::budgeted_baseline("oracle"));
  EXPECT_FALSE(eval::budgeted_baseline("retro"));
  // Matched budgets need retro, and contradict an explicit budget.
  eval::EvalOptions o;
  o.results_path = "unused.jsonl";
  o.methods = {"full", "oracle"};
  EXPECT_THROW(eval::validate(o), Error);
  o.methods = {"retro", "oracle"};
  EXPECT_NO_THROW(eval::validate(o));
  o.attention.budget_tokens = 10;
  EXPECT_THROW(eval::validate(o), Error);
  o.baseline_budget = eval::BaselineBudget::kNominal;
  EXPECT_NO_THROW(eval::validate(o));
  eval::PplOptions p;
  p.methods = {"streaming"};
  EXPECT_THROW(eval::validate(p), Error);
  p.baseline_budget = eval::BaselineBudget::kNominal;
  EXPECT_NO_THROW(eval::validate(p));
}

// Matched budgets: each baseline reads as many exact tokens as retro did on the same sample / window
// (within the few tokens retro's steady tail gains from generated tokens), whatever the methods' order.
TEST(EvalRunner, MatchedBudgetGivesTheBaselinesRetrosReads) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const auto tok = test::byte_tokenizer();
  const eval::TaskGenerator gen = byte_generator(*tok);
  const std::string path = fresh_results("retroinfer_eval_matched");
  eval::EvalOptions o;
  o.tasks = {"passkey"};
  o.contexts = {400};
  o.samples = 1;
  o.methods = {"oracle", "streaming", "retro"};  // retro runs first all the same
  o.attention.tokens_per_cluster = 8;
  o.attention.retrieval_fraction = 0.1;
  o.prefill_chunk = 128;
  o.results_path = path;
  ASSERT_EQ(eval::run_eval(*m, *tok, gen, o), 3);
  const auto lines = eval::load_results(path);
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0].at("method"), "retro");
  const double retro = lines[0].at("exact_tokens_per_head").get<double>();
  const int64_t want = eval::matched_budget_tokens(retro, o.attention);
  EXPECT_GT(want, 0);
  for (size_t i = 1; i < 3; ++i) {
    SCOPED_TRACE(lines[i].at("method").get<std::string>());
    EXPECT_EQ(lines[i].at("budget_mode"), "matched");
    EXPECT_EQ(lines[i].at("budget_tokens").get<int64_t>(), want);
    const double exact = lines[i].at("exact_tokens_per_head").get<double>();
    EXPECT_NEAR(exact, retro, 0.1 * retro + 2.0) << "baseline reads " << exact << ", retro " << retro;
  }
  // Resuming with the baselines missing takes retro's count from its result line.
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f << lines[0].dump() << "\n";
  }
  ASSERT_EQ(eval::run_eval(*m, *tok, gen, o), 2);
  EXPECT_EQ(eval::load_results(path)[1].at("budget_tokens").get<int64_t>(), want);
  std::remove(path.c_str());

  // Teacher-forced: the same per window.
  const auto toks = test::token_stream(2 * (160 + 8 + 1), 5);
  eval::PplOptions p;
  p.prefix_tokens = 160;
  p.forced_tokens = 8;
  p.windows = 2;
  p.methods = {"oracle", "retro"};
  p.attention = o.attention;
  p.prefill_chunk = 64;
  const eval::PplReport r = eval::run_ppl_fidelity(*m, toks, p);
  ASSERT_EQ(r.methods.size(), 3u);
  EXPECT_EQ(r.methods[1].method, "retro");
  EXPECT_EQ(r.methods[2].method, "oracle");
  EXPECT_GE(r.methods[2].budget_tokens, 1.0);
  EXPECT_NEAR(r.methods[2].exact_tokens_per_head, r.methods[1].exact_tokens_per_head,
              0.1 * r.methods[1].exact_tokens_per_head + 2.0);
}

// A prompt at the model's position limit (tiny-llama3: 512) leaves no room for the whole answer budget: the
// session is capped at the limit and the answer stops when the context is full (found on the GPU machine,
// where 8K prompts of SmolLM2, an 8K model, were refused before any token was decoded).
TEST(EvalRunner, PromptAtTheModelLimitStillAnswers) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  ASSERT_EQ(model_max_context(m->config()), 512);
  const auto tok = test::byte_tokenizer();
  const eval::TaskGenerator gen = byte_generator(*tok);
  const std::string path = fresh_results("retroinfer_eval_limit");
  eval::EvalOptions o;
  o.tasks = {"passkey"};
  o.contexts = {510};
  o.samples = 1;
  o.methods = {"full"};
  o.prefill_chunk = 128;
  o.results_path = path;
  EXPECT_EQ(eval::run_eval(*m, *tok, gen, o), 1);
  const auto lines = eval::load_results(path);
  ASSERT_EQ(lines.size(), 1u);
  const int64_t prompt = lines[0].at("prompt_tokens").get<int64_t>();
  EXPECT_GT(prompt, 460);
  EXPECT_GE(lines[0].at("generated_tokens").get<int64_t>(), 1);
  EXPECT_LE(prompt + lines[0].at("generated_tokens").get<int64_t>(), 512 + 1);  // the last token is not decoded
  std::remove(path.c_str());
}

TEST(EvalRunner, TimeBudgetOrderAndDeviceOfTheResults) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const auto tok = test::byte_tokenizer();
  const eval::TaskGenerator gen = byte_generator(*tok);
  const std::string path = fresh_results("retroinfer_eval_budget");
  eval::EvalOptions o;
  o.tasks = {"passkey"};
  o.contexts = {400, 440};
  o.samples = 2;
  o.methods = {"streaming"};
  o.baseline_budget = eval::BaselineBudget::kNominal;  // no retro to match
  o.prefill_chunk = 128;
  o.results_path = path;
  // A budget already spent when the first sample would start: nothing runs, the run says so.
  o.time_budget_s = 1e-9;
  eval::EvalRunStats st;
  EXPECT_EQ(eval::run_eval(*m, *tok, gen, o, &st), 0);
  EXPECT_TRUE(st.budget_spent);
  EXPECT_EQ(st.samples_run, 0);
  EXPECT_EQ(st.samples_left, 4);
  EXPECT_TRUE(eval::load_results(path).empty());
  // No budget: everything runs, sample index outermost (a run cut short keeps every task balanced).
  o.time_budget_s = 0;
  EXPECT_EQ(eval::run_eval(*m, *tok, gen, o, &st), 4);
  EXPECT_FALSE(st.budget_spent);
  EXPECT_EQ(st.samples_run, 4);
  EXPECT_EQ(st.samples_left, 0);
  const auto lines = eval::load_results(path);
  ASSERT_EQ(lines.size(), 4u);
  const std::vector<std::pair<int, int64_t>> want = {{0, 400}, {0, 440}, {1, 400}, {1, 440}};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(lines[i].at("index").get<int>(), want[i].first) << "line " << i;
    EXPECT_EQ(lines[i].at("context").get<int64_t>(), want[i].second) << "line " << i;
    EXPECT_EQ(lines[i].at("device").get<std::string>(), "cpu");
    EXPECT_EQ(lines[i].at("kv_dtype").get<std::string>(), "f32");
  }
  // A generous budget on a finished file: nothing left, nothing spent.
  o.time_budget_s = 3600;
  EXPECT_EQ(eval::run_eval(*m, *tok, gen, o, &st), 0);
  EXPECT_EQ(st.samples_skipped, 4);
  EXPECT_FALSE(st.budget_spent);
  // Lines of another device's runner are not mixed in.
  {
    std::ofstream f(path, std::ios::app | std::ios::binary);
    nlohmann::json j = lines[0];
    j["device"] = "cuda";
    j["index"] = 7;
    f << j.dump() << "\n";
  }
  o.samples = 3;
  std::string err;
  try {
    eval::run_eval(*m, *tok, gen, o);
  } catch (const Error& e) {
    err = e.what();
  }
  EXPECT_NE(err.find("made on device cuda"), std::string::npos) << err;
  o.time_budget_s = -1;
  EXPECT_THROW(eval::validate(o), Error);
  std::remove(path.c_str());
}

TEST(EvalRunner, PplOnTheCpuMeasuresAttentionErrorAndKeepsItsTimeBudget) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const auto toks = test::token_stream(3 * (64 + 4 + 1), 5);
  eval::PplOptions o;
  o.prefix_tokens = 64;
  o.forced_tokens = 4;
  o.windows = 3;
  o.methods = {"full"};
  o.prefill_chunk = 64;
  o.time_budget_s = 1e-9;  // spent after the first window (which always runs)
  const eval::PplReport r = eval::run_ppl_fidelity(*m, toks, o);
  EXPECT_EQ(r.windows_run, 1);
  ASSERT_EQ(r.methods.size(), 1u);
  EXPECT_EQ(r.methods[0].steps, 4);
  EXPECT_EQ(r.device, "cpu");
  EXPECT_TRUE(r.attention_error_measured);
  EXPECT_EQ(r.methods[0].layer_rel_err.size(), static_cast<size_t>(m->config().num_layers));
  const nlohmann::json j = eval::to_json(r);
  EXPECT_EQ(j.at("windows_run").get<int>(), 1);
  EXPECT_EQ(j.at("device").get<std::string>(), "cpu");
  EXPECT_TRUE(j.at("attention_error_measured").get<bool>());
  EXPECT_FALSE(j.contains("attention_error_note"));
  o.time_budget_s = 0;
  EXPECT_EQ(eval::run_ppl_fidelity(*m, toks, o).windows_run, 3);
}

TEST(EvalRunner, PplTableSaysWhenAttentionErrorIsNotMeasured) {
  eval::PplReport r;
  r.device = "cuda";
  r.attention_error_measured = false;
  eval::PplMethodResult full;
  full.method = "full";
  full.ppl = 10;
  full.steps = 4;
  r.methods.push_back(full);
  EXPECT_NE(eval::markdown_table(r).find("| n/a (cpu only) | n/a |"), std::string::npos) << eval::markdown_table(r);
  const nlohmann::json j = eval::to_json(r);
  EXPECT_FALSE(j.at("attention_error_measured").get<bool>());
  EXPECT_NE(j.at("attention_error_note").get<std::string>().find("not measured on cuda"), std::string::npos);
}


TEST(EvalMethodConfig, OverridesApplyInOrderOverTheBase) {
  AttentionConfig base;
  base.retrieval_fraction = 0.018;
  const AttentionConfig r = eval::method_config("retro:retrieval_fraction=0.036:window_tokens=128", base);
  EXPECT_EQ(r.kind, AttentionKind::kRetro);
  EXPECT_DOUBLE_EQ(r.retrieval_fraction, 0.036);
  EXPECT_EQ(r.window_tokens, 128);
  EXPECT_DOUBLE_EQ(r.estimation_fraction, base.estimation_fraction);  // untouched fields keep the base's
  const AttentionConfig n = eval::method_config("retro-noest:estimation_fraction=0.5", base);
  EXPECT_FALSE(n.estimation);
  EXPECT_DOUBLE_EQ(n.estimation_fraction, 0.5);
  EXPECT_EQ(eval::method_config("quest:quest_page_tokens=8", base).quest_page_tokens, 8);
  EXPECT_EQ(eval::method_base_name("retro:window_tokens=128"), "retro");
  EXPECT_TRUE(eval::budgeted_baseline("oracle:sink_tokens=8"));
  EXPECT_FALSE(eval::budgeted_baseline("retro:sink_tokens=8"));
}

TEST(EvalMethodConfig, BadOverridesAreClearErrors) {
  const AttentionConfig base;
  const auto message = [&](const char* m) {
    try {
      eval::method_config(m, base);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("retro:no_such_field=1").find("unknown attention parameter 'no_such_field'"), std::string::npos);
  EXPECT_NE(message("retro:retrieval_fraction").find("is not field=value"), std::string::npos);
  EXPECT_NE(message("retro:=3").find("is not field=value"), std::string::npos);
  EXPECT_NE(message("retro:retrieval_fraction=2").find("retrieval"), std::string::npos);  // out of range
  EXPECT_NE(message("retro:window_tokens=abc").find("window"), std::string::npos);
  EXPECT_NE(message("bogus:window_tokens=1").find("bogus"), std::string::npos);
}

}  // namespace
}  // namespace retroinfer
