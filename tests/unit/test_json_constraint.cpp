// Constrained decoding to JSON (response_format json_object): the prefix recogniser against valid and
// invalid texts, and random generations through the Sampler that always parse once complete.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "engine/json_constraint.h"
#include "retroinfer/error.h"
#include "retroinfer/sampler.h"

namespace retroinfer {
namespace {

bool accepts_prefix(std::string_view text) {
  JsonPrefixState s;
  return s.feed(text);
}

bool accepts_whole(std::string_view text) {
  JsonPrefixState s;
  return s.feed(text) && s.complete();
}

TEST(JsonConstraint, RecognisesObjectsAndTheirPrefixes) {
  const char* valid[] = {
      "{}", " {\"a\": 1}", "{\"a\":[1,-2.5e+3,0.25,true,false,null,\"x\"]}", "{\"k\": {\"n\": [[], {}]}}\n",
      "{\"s\": \"esc \\\" \\\\ \\/ \\b\\f\\n\\r\\t \\u00e9 \\ud83d\\ude00\"}", "{\"u\": \"caf\xc3\xa9 \xf0\x9f\x98\x80\"}",
      "{\"z\": 0, \"e\": 1E5, \"f\": -0.0}"};
  for (const char* v : valid) {
    EXPECT_TRUE(accepts_whole(v)) << v;
    EXPECT_TRUE(nlohmann::json::accept(v)) << v;  // the fixture itself is JSON
    const std::string t(v);
    for (size_t k = 0; k <= t.size(); ++k) EXPECT_TRUE(accepts_prefix(t.substr(0, k))) << v << " cut at " << k;
  }
  EXPECT_FALSE(accepts_whole("{\"a\": 1"));  // a prefix, not complete
  const char* invalid[] = {"[1]",         "\"top\"",       "{a: 1}",         "{\"a\" 1}",        "{\"a\": 01}",
                           "{\"a\": 1.}", "{\"a\": .5}",   "{\"a\": tru }",  "{\"a\": [1,]}",    "{,}",
                           "{\"a\":1,}",  "{\"a\": \"\n\"}", "{\"a\": \"\\x\"}", "{\"a\": \"\\udc00\"}",
                           "{\"a\": \"\\ud800x\"}", "{\"a\": \"\xc0\xaf\"}", "{\"a\": \"\xed\xa0\x80\"}",
                           "{\"a\": 1]",  "{} {}",         "{}x"};
  for (const char* v : invalid) EXPECT_FALSE(accepts_whole(v) || accepts_prefix(v)) << v;
  // Whitespace runs are capped; nesting is capped.
  EXPECT_TRUE(accepts_prefix("{" + std::string(kMaxJsonWhitespaceRun, ' ')));
  EXPECT_FALSE(accepts_prefix("{" + std::string(kMaxJsonWhitespaceRun + 1, '\n')));
  EXPECT_TRUE(accepts_prefix("{\"a\":" + std::string(kMaxJsonDepth - 1, '[')));
  EXPECT_FALSE(accepts_prefix("{\"a\":" + std::string(kMaxJsonDepth, '[')));
}

// Every byte as a token, some multi-byte tokens as a BPE vocabulary has them, and tokens without text.
std::shared_ptr<JsonTokenTable> test_table() {
  auto t = std::make_shared<JsonTokenTable>();
  for (int b = 0; b < 256; ++b) t->texts.push_back(std::string(1, static_cast<char>(b)));
  for (const char* s : {"{\"", "\":", "\": \"", "\",", "\"}", "}\n", " true", "null", "123", ".5", "e-7", "\\u00",
                        "\\ud83d", "\\ude00", "abc", " {", "]}", "},{\"", "\xc3\xa9", "\xf0\x9f", "\x98\x80"})
    t->texts.push_back(s);
  t->texts.push_back("");  // a control token
  for (const std::string& x : t->texts)
    t->plain.push_back(!x.empty() && x.find_first_of("\"\\") == std::string::npos &&
                       std::all_of(x.begin(), x.end(), [](char c) { return c >= 0x20 && c <= 0x7E; }));
  return t;
}

TEST(JsonConstraint, RandomGenerationsParseOnceComplete) {
  auto table = test_table();
  const auto vocab = table->texts.size();
  int completed = 0;
  for (uint64_t seed = 0; seed < 40; ++seed) {
    SamplerConfig c;
    c.temperature = seed % 2 ? 1.0f : 0.7f;
    c.seed = seed;
    auto constraint = std::make_shared<JsonConstraint>(table);
    c.constraint = constraint;
    Sampler s(c);
    std::mt19937 gen(static_cast<uint32_t>(seed));
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::string text;
    for (int step = 0; step < 600 && !constraint->complete(); ++step) {
      std::vector<float> logits(vocab);
      for (float& x : logits) x = normal(gen);
      // Closing bytes a little more likely, as a model's would be: generations end within the budget.
      for (const char b : {'"', '}', ']', ','}) logits[static_cast<uint8_t>(b)] += 3.0f;
      const int32_t tok = s.sample(logits);
      ASSERT_FALSE(table->texts[tok].empty()) << "seed " << seed;
      text += table->texts[tok];
      ASSERT_TRUE(accepts_prefix(text)) << "seed " << seed << ": " << text;
    }
    if (!constraint->complete()) continue;  // cut by the budget: a valid prefix (checked above)
    ++completed;
    nlohmann::json j;
    ASSERT_NO_THROW(j = nlohmann::json::parse(text)) << "seed " << seed << ": " << text;
    EXPECT_TRUE(j.is_object()) << text;
  }
  EXPECT_GE(completed, 30) << "too few generations completed within 600 tokens";
}

TEST(JsonConstraint, MaskAllowsExactlyTheTokensThatContinue) {
  auto table = test_table();
  JsonConstraint c(table);
  for (const char* t : {"{\"", "ab", "\": \"x", "\", \"n\": ", "1"}) {
    std::vector<float> logits(table->texts.size(), 0.0f);
    c.mask(logits);
    for (size_t id = 0; id < logits.size(); ++id) {
      JsonPrefixState s = c.state();
      const bool ok = !table->texts[id].empty() && s.feed(table->texts[id]);
      EXPECT_EQ(std::isinf(logits[id]), !ok) << "after '" << t << "', token " << id;
    }
    for (const char b : std::string(t)) c.accept(static_cast<uint8_t>(b));
  }
  EXPECT_THROW(c.accept('x'), Error);  // "{\"ab\": 1x" is no JSON prefix
}

}  // namespace
}  // namespace retroinfer
