// Inputs the fuzz targets found (docs/reliability.md, "Findings"), kept as regression tests.
#include <gtest/gtest.h>

#include <string>

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

}  // namespace
}  // namespace retroinfer
