// Inputs the fuzz targets found (docs/reliability.md, "Findings"), kept as regression tests.
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "retroinfer/error.h"
#include "retroinfer/tokenizer.h"
#include "server/openai_api.h"

namespace retroinfer {
namespace {

// fuzz_openai_request: a number literal too large for a double made nlohmann throw out_of_range (406), which
// escaped the parser as a non-ApiError exception (a 500 instead of a 400).
TEST(FuzzFindings, OpenAiNumberOverflowIsA400) {
  for (const char* body : {R"({"prompt": "x", "max_tokens": 1e999})", R"({"prompt": "x", "temperature": -8e888})"}) {
    try {
      (void)server::parse_completion_request(body, false);
      ADD_FAILURE() << body << " parsed";
    } catch (const server::ApiError& e) {
      EXPECT_EQ(e.status(), 400) << body;
      EXPECT_EQ(e.code(), "invalid_json") << body;
    }
  }
}

// fuzz_tokenizer: a tokenizer.json whose ids are not integers in [0, 2^31) (1.9e130 in model.vocab) went
// through get<int>, undefined behaviour (UBSan: outside the range of int). Each id place is an Error now.
TEST(FuzzFindings, TokenizerIdsOutOfRangeAreAnError) {
  const std::string head = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": )";
  for (const char* id : {"1.9e130", "-1", "4294967296", "0.5", "\"7\""}) {
    const std::string text = head + id + R"(}, "merges": []}})";
    try {
      (void)Tokenizer::from_json_string(text);
      ADD_FAILURE() << id << " loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("token id"), std::string::npos) << id << ": " << e.what();
    }
  }
  const std::string added = R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "added_tokens": )"
                            R"([{"id": 1e300, "content": "<x>"}]})";
  EXPECT_THROW((void)Tokenizer::from_json_string(added), Error);
}

// fuzz_tokenizer: an added token's id of 61,345,678 in a tokenizer.json of a few hundred entries passed the
// "implausibly large" check (< 2^30) and sized the per-id tables to ~4 GB (libFuzzer's out-of-memory). Ids far past
// the entries are an Error now; a sparse but plausible one (an added token past a small vocabulary) still loads.
TEST(FuzzFindings, TokenizerSparseHugeIdIsAnError) {
  const std::string head = R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}, )"
                           R"("pre_tokenizer": {"type": "ByteLevel", "use_regex": true}, "added_tokens": [{"id": )";
  const std::string tail = R"(, "content": "<x>", "special": true}]})";
  try {
    (void)Tokenizer::from_json_string(head + "61345678" + tail);
    ADD_FAILURE() << "id 61345678 loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("implausibly large for 3 entries"), std::string::npos) << e.what();
  }
  const auto t = Tokenizer::from_json_string(head + "5000" + tail);
  EXPECT_EQ(t->token_to_id("<x>"), std::optional<TokenId>(5000));
}

}  // namespace
}  // namespace retroinfer
