// The fidelity loop on a small case: full attention matches the independent reference, the methods'
// token counts follow their budgets, the JSON lines carry every row, and bad options are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "eval/fidelity.h"
#include "retroinfer/error.h"

using namespace retroinfer;

namespace {
eval::FidelityOptions small_options() {
  eval::FidelityOptions o;
  o.contexts = {1024};
  o.methods = {"full", "quest", "streaming", "oracle"};
  o.steps = 2;
  o.num_heads_q = 8;
  o.num_heads_kv = 4;
  o.head_dim = 64;
  o.kv_heads_evaluated = 1;
  o.seed = 9;
  o.dtype = DType::kF32;
  return o;
}

const eval::MethodResult& find(const eval::FidelityReport& r, const std::string& m) {
  for (const auto& x : r.contexts.at(0).methods)
    if (x.method == m) return x;
  throw std::runtime_error("no row for " + m);
}
}  // namespace

TEST(Fidelity, SmallRunIsConsistent) {
  const auto r = eval::run_fidelity(small_options());
  ASSERT_EQ(r.contexts.size(), 1u);
  ASSERT_EQ(r.contexts[0].methods.size(), 4u);
  const auto& full = find(r, "full");
  // f32 KV and f32 accumulation vs a double reference over ~1000 tokens: a few 1e-7 relative.
  EXPECT_LT(full.rel_err_max, 1e-5);
  EXPECT_EQ(full.recall_exact, 1.0);
  // The cache grows by one token per step: 1025 then 1026 tokens.
  EXPECT_DOUBLE_EQ(full.context_tokens, 1025.5);
  EXPECT_DOUBLE_EQ(full.exact_tokens, 1025.5);
  // streaming and oracle read sink 4 + window 64 + round(1.8% of (size - 68)) = 68 + 17 tokens.
  EXPECT_DOUBLE_EQ(find(r, "streaming").exact_tokens, 85.0);
  EXPECT_DOUBLE_EQ(find(r, "oracle").exact_tokens, 85.0);
  // The oracle picks the tokens of largest mass: it recalls at least as much as streaming, and errs less.
  EXPECT_GE(find(r, "oracle").recall_exact, find(r, "streaming").recall_exact);
  EXPECT_LT(find(r, "oracle").rel_err_mean, find(r, "streaming").rel_err_mean);
  for (const auto& m : r.contexts[0].methods) {
    EXPECT_TRUE(m.error.empty()) << m.method << ": " << m.error;
    EXPECT_GT(m.recall_exact, 0.0) << m.method;
    EXPECT_LE(m.recall_exact, 1.0 + 1e-9) << m.method;
    EXPECT_TRUE(std::isnan(m.recall_estimated)) << m.method << " does not estimate";
  }
  // One JSON line per row, each parseable and naming its method.
  std::istringstream js(eval::fidelity_json_lines(r));
  std::string line;
  int n = 0;
  while (std::getline(js, line)) {
    const auto j = nlohmann::json::parse(line);
    EXPECT_EQ(j.at("context"), 1024);
    EXPECT_TRUE(j.contains("rel_err_mean"));
    ++n;
  }
  EXPECT_EQ(n, 4);
  const std::string table = eval::format_fidelity(r);
  EXPECT_NE(table.find("evaluated 1 of 4 KV heads"), std::string::npos) << table;
}

TEST(Fidelity, RetroAddsTheNoEstimationVariant) {
  auto o = small_options();
  o.methods = {"retro"};
  const auto r = eval::run_fidelity(o);
  ASSERT_EQ(r.contexts[0].methods.size(), 2u);
  EXPECT_EQ(r.contexts[0].methods[0].method, "retro");
  EXPECT_EQ(r.contexts[0].methods[1].method, "retro-noest");
  o.estimation_variant = false;
  EXPECT_EQ(eval::run_fidelity(o).contexts[0].methods.size(), 1u);
}

TEST(Fidelity, RejectsBadOptions) {
  auto expect = [](eval::FidelityOptions o, const char* needle) {
    try {
      eval::run_fidelity(o);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto o = small_options();
  o.methods = {"full", "magic"};
  expect(o, "unknown method 'magic'");
  o = small_options();
  o.kv_heads_evaluated = 5;
  expect(o, "--kv-heads-evaluated must be in [1, 4]");
  o = small_options();
  o.steps = 0;
  expect(o, "--steps must be >= 1");
  o = small_options();
  o.num_heads_q = 6;
  expect(o, "must be a multiple of num_heads_kv");
  o = small_options();
  o.contexts = {100};
  expect(o, "context_tokens must be >=");
  eval::SyntheticConfig c;
  try {
    eval::set_synthetic_knob(c, "needle_spam", 3);
    ADD_FAILURE() << "unknown knob accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown knob 'needle_spam'"), std::string::npos) << e.what();
  }
  eval::set_synthetic_knob(c, "needle_span", 16);
  EXPECT_EQ(c.needle_span, 16);
  EXPECT_THROW(eval::set_synthetic_knob(c, "num_needles", 2.5), Error);
}
