// RULER scoring (string_match_all / string_match_part), the resume logic of the results file and the
// report aggregation, on hand cases.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "eval/eval_report.h"
#include "eval/eval_runner.h"
#include "eval/scoring.h"
#include "retroinfer/error.h"

namespace retroinfer {
namespace {

TEST(EvalScoring, StringMatchAllAndPart) {
  const std::vector<std::string> refs{"1234567", "Apple", "zeta"};
  EXPECT_DOUBLE_EQ(eval::string_match_all("The numbers are 1234567 and apple.", refs), 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(eval::string_match_part("The numbers are 1234567 and apple.", refs), 1.0);
  EXPECT_DOUBLE_EQ(eval::string_match_all("ZETA apple 1234567", refs), 1.0);  // case-insensitive
  EXPECT_DOUBLE_EQ(eval::string_match_all("123456", refs), 0.0);              // a prefix is not a match
  EXPECT_DOUBLE_EQ(eval::string_match_part("", refs), 0.0);
  EXPECT_DOUBLE_EQ(eval::string_match_all("x 42", {"42"}), 1.0);
  EXPECT_THROW(eval::string_match_all("x", {}), Error);
}

struct TempFile {
  std::string path;
  explicit TempFile(const std::string& name)
      : path((std::filesystem::temp_directory_path() / (name + "_" + std::to_string(::getpid()))).string()) {
    std::remove(path.c_str());
  }
  ~TempFile() { std::remove(path.c_str()); }
  void write(const std::string& s) const { std::ofstream(path, std::ios::binary) << s; }
};

TEST(EvalResume, LoadsLinesDropsTruncatedTailRejectsCorruptMiddle) {
  TempFile f("retroinfer_eval_resume");
  EXPECT_TRUE(eval::load_results(f.path).empty());  // no file yet: nothing done
  const std::string a = R"({"task":"vt","context":4096,"index":0,"method":"full","score_all":1.0})";
  const std::string b = R"({"task":"vt","context":4096,"index":0,"method":"retro","score_all":0.5})";
  f.write(a + "\n" + b + "\n" + R"({"task":"vt","cont)");  // interrupted while writing the third line
  const auto lines = eval::load_results(f.path);
  ASSERT_EQ(lines.size(), 2u);
  const auto keys = eval::result_keys(lines);
  EXPECT_TRUE(keys.count(eval::result_key("vt", 4096, 0, "full")));
  EXPECT_TRUE(keys.count(eval::result_key("vt", 4096, 0, "retro")));
  EXPECT_FALSE(keys.count(eval::result_key("vt", 4096, 1, "full")));
  EXPECT_FALSE(keys.count(eval::result_key("vt", 8192, 0, "full")));
  f.write(a + "\nnot json\n" + b + "\n");
  EXPECT_THROW(eval::load_results(f.path), Error);
  f.write(R"({"task":"vt","context":4096})" "\n");
  EXPECT_THROW(eval::load_results(f.path), Error);
}

TEST(EvalReport, AveragesPerCellAndTaskMean) {
  auto line = [](const char* m, const char* t, int64_t c, double s, double exact) {
    return nlohmann::json{{"method", m}, {"task", t}, {"context", c}, {"index", 0}, {"score_all", s},
                          {"exact_tokens_per_head", exact}, {"context_tokens_per_head", 1000.0}};
  };
  const std::vector<nlohmann::json> lines{line("full", "cwe", 4096, 0.0, 1000), line("full", "vt", 4096, 1.0, 1000),
                                          line("full", "vt", 4096, 0.5, 1000), line("retro", "vt", 4096, 0.25, 100),
                                          line("retro", "cwe", 4096, 0.75, 140)};
  const nlohmann::json s = eval::summarize(lines);
  ASSERT_EQ(s.at("averages").size(), 2u);
  EXPECT_DOUBLE_EQ(s.at("averages")[0].at("score").get<double>(), (75.0 + 0.0) / 2);  // full: mean of task means
  EXPECT_DOUBLE_EQ(s.at("averages")[1].at("score").get<double>(), (25.0 + 75.0) / 2);
  EXPECT_DOUBLE_EQ(s.at("averages")[1].at("exact_tokens_per_head").get<double>(), 120.0);
  const std::string md = eval::markdown_table(s);
  // Columns in task_names() order (vt before cwe), not in order of appearance.
  EXPECT_NE(md.find("| full | 75.0 | 0.0 | **37.5** | 1000 / 1000 | 1, 2 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| retro | 25.0 | 75.0 | **50.0** | 120 / 1000 | 1 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| method | vt | cwe |"), std::string::npos) << md;
}

}  // namespace
}  // namespace retroinfer
