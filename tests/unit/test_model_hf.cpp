// The CPU model runner against Hugging Face transformers on the tiny random-weight fixtures of
// scripts/make_tiny_models.py (tests/data/models/<name>/: config.json, bf16 model.safetensors,
// reference.json). Skips when a fixture is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "retroinfer/model.h"
#include "retroinfer/sampler.h"

namespace retroinfer {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Tolerance on logits: both sides compute in f32 on identical (bf16-exact) weights; they differ only in
// summation order (BLAS blocking vs torch's kernels, the online softmax vs torch's two-pass softmax) and in
// cos/sin/exp implementations. Each f32 rounding is 6e-8 relative; a dot product of length <= 128 and two
// layers of residual updates keep the accumulated error a few 1e-6 of the activation scale (measured:
// see docs/model-runner.md). We allow 1e-4 of the largest |logit| of the row (the logit scale), plus a
// floor of 1e-5 for rows with tiny logits: loose enough for any summation order, tight enough that a
// wrong RoPE angle, a missing bias or norm weight (all changes of order 1e-2..1 here) fails.
constexpr double kRelTol = 1e-4;

struct Reference {
  std::vector<int32_t> tokens;
  std::vector<int64_t> positions;
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> greedy;
  std::vector<float> greedy_margin;
  std::vector<std::pair<int, std::vector<float>>> greedy_logits;
};

fs::path fixture_dir(const std::string& name) { return fs::path(RETROINFER_TEST_DATA) / "models" / name; }

bool load_reference(const std::string& name, Reference& r) {
  const fs::path p = fixture_dir(name) / "reference.json";
  if (!fs::exists(p) || !fs::exists(fixture_dir(name) / "model.safetensors")) return false;
  std::ifstream f(p);
  const json j = json::parse(f);
  r.tokens = j.at("tokens").get<std::vector<int32_t>>();
  r.positions = j.at("positions").get<std::vector<int64_t>>();
  r.logits = j.at("logits").get<std::vector<std::vector<float>>>();
  r.greedy = j.at("greedy").get<std::vector<int32_t>>();
  r.greedy_margin = j.at("greedy_margin").get<std::vector<float>>();
  for (auto& [k, v] : j.at("greedy_logits").items()) r.greedy_logits.emplace_back(std::stoi(k), v.get<std::vector<float>>());
  return true;
}

// Max |a - b| over the row, and the bound it must stay under.
void expect_logits_near(const float* got, const std::vector<float>& want, const std::string& what) {
  double scale = 0.0, worst = 0.0;
  int64_t worst_i = -1;
  for (size_t i = 0; i < want.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(e <= worst)) {
      worst = e;
      worst_i = static_cast<int64_t>(i);
    }
  }
  const double tol = std::max(kRelTol * scale, 1e-5);
  if (std::getenv("RETROINFER_PRINT_ERR")) std::printf("%s: max err %.3g scale %.3g rel %.3g\n", what.c_str(), worst, scale, worst / scale);
  EXPECT_LE(worst, tol) << what << ": worst |ours - HF| = " << worst << " at id " << worst_i << " (ours "
                        << got[worst_i] << ", HF " << want[worst_i] << "), logit scale " << scale;
}

class TinyModelVsHf : public ::testing::TestWithParam<std::string> {};

TEST_P(TinyModelVsHf, PrefillLogitsMatch) {
  Reference ref;
  if (!load_reference(GetParam(), ref)) GTEST_SKIP() << "fixture " << GetParam() << " absent (scripts/make_tiny_models.py)";
  auto model = Model::load(fixture_dir(GetParam()).string());
  const int64_t vocab = model->config().vocab_size;
  // Chunk 64 over 300 tokens: four full chunks and a tail of 44, so chunk boundaries are crossed.
  SessionOptions so;
  so.attention.kind = AttentionKind::kFull;
  so.prefill_chunk = 64;
  Session s(*model, so);
  const std::vector<float> all = s.prefill(ref.tokens, true);
  ASSERT_EQ(all.size(), ref.tokens.size() * vocab);
  for (size_t i = 0; i < ref.positions.size(); ++i)
    expect_logits_near(all.data() + ref.positions[i] * vocab, ref.logits[i],
                       GetParam() + " position " + std::to_string(ref.positions[i]));
}

TEST_P(TinyModelVsHf, GreedyDecodeMatches) {
  Reference ref;
  if (!load_reference(GetParam(), ref)) GTEST_SKIP() << "fixture " << GetParam() << " absent (scripts/make_tiny_models.py)";
  auto model = Model::load(fixture_dir(GetParam()).string());
  SessionOptions so;
  so.attention.kind = AttentionKind::kFull;
  so.max_context = static_cast<int64_t>(ref.tokens.size() + ref.greedy.size());
  Session s(*model, so);
  std::vector<float> logits = s.prefill(ref.tokens);
  for (size_t step = 0; step < ref.greedy.size(); ++step) {
    for (const auto& [k, v] : ref.greedy_logits)
      if (static_cast<size_t>(k) == step) expect_logits_near(logits.data(), v, GetParam() + " decode step " + std::to_string(step));
    const int32_t tok = argmax(logits);
    if (tok != ref.greedy[step]) {
      // Only a near tie may flip the choice: HF's top-2 margin must be within the logit tolerance.
      EXPECT_LT(ref.greedy_margin[step], 1e-3) << GetParam() << ": greedy token " << step << " is " << tok
                                               << ", HF chose " << ref.greedy[step];
      break;
    }
    s.decode(tok, logits);
  }
  EXPECT_EQ(s.position(), static_cast<int64_t>(ref.tokens.size() + ref.greedy.size()));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TinyModelVsHf,
                         ::testing::Values("tiny-llama3", "tiny-qwen2", "tiny-llama-yarn", "tiny-llama-dynamic"),
                         [](const auto& info) {
                           std::string s = info.param;
                           std::replace(s.begin(), s.end(), '-', '_');
                           return s;
                         });

}  // namespace
}  // namespace retroinfer
