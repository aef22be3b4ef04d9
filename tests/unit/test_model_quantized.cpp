// SmolLM2-135M-Instruct (Q4_1 GGUF) with its weights kept in their blocks (WeightStorage::kBlocks: decode
// products against 8-bit activations) against the same model widened to f32 (WeightStorage::kF32, the path
// that matches transformers and llama.cpp's f32 run to 1e-4 of the logit range: test_model_smollm2.cpp,
// test_model_llamacpp.cpp): logits of a 256-token prefill and 24 teacher-forced decode steps, the top-1 token of
// every step (equal but at near ties), and the weights' memory. Skips when the model or the reference prompt is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "retroinfer/error.h"
#include "retroinfer/model.h"
#include "retroinfer/model_file.h"
#include "retroinfer/sampler.h"

namespace retroinfer {
namespace {

namespace fs = std::filesystem;

// Bound on max |blocks - f32| over a row, relative to the row's logit range. Derivation: an activation block
// of 32 is rounded to d = max|x| / 127 steps, an error uniform in +-d/2 per element, RMS d / sqrt(12) =
// max|x| / 440; a product y = w . x then carries a relative RMS error of (max|x| / rms(x)) / 440, about 3 / 440
// = 0.7% for activation blocks whose max is 3 times their RMS (the residual stream's outlier channels make it
// up to ~6: 1.4%). The per-product errors are independent and enter the residual stream additively, so the
// logits carry an error of the same relative size, and the worst of a vocabulary's logits, a few RMS: 5% of the
// range bounds it (measured on this model: docs/model-runner.md, "Weight storage").
constexpr double kDecodeRelTol = 5e-2;
// Prefill products widen the blocks to f32 (bit-identical weights) and run the same cblas_sgemm on tiles of
// rows; only the last row's LM head goes through the block product (same bound as decode).

std::vector<float> row_of(const std::vector<float>& v, int64_t r, int64_t vocab) {
  return {v.begin() + r * vocab, v.begin() + (r + 1) * vocab};
}

double rel_err(const std::vector<float>& a, const std::vector<float>& b) {
  const auto [lo, hi] = std::minmax_element(b.begin(), b.end());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
  return worst / (static_cast<double>(*hi) - *lo);
}

TEST(QuantizedModel, SmolLM2BlocksMatchF32) {
  const fs::path ref_path = fs::path(RETROINFER_TEST_DATA) / "models" / "smollm2-reference.json";
  if (!fs::exists(ref_path)) GTEST_SKIP() << ref_path << " absent";
  std::string gguf;
  try {
    gguf = locate_model("smollm2");
  } catch (const Error& e) {
    GTEST_SKIP() << "SmolLM2 not installed: " << e.what();
  }
  std::ifstream f(ref_path);
  auto tokens = nlohmann::json::parse(f).at("tokens").get<std::vector<int32_t>>();
  tokens.resize(std::min<size_t>(tokens.size(), 256));
  auto file = ModelFile::open(gguf);
  ModelOptions of32;
  of32.weight_storage = WeightStorage::kF32;
  const auto blocks = Model::load(*file);
  const auto wide = Model::load(*file, of32);
  EXPECT_EQ(blocks->weight_storage(), WeightStorage::kBlocks);
  // Q4_1 layers (20 bytes / 32 weights) and a Q8_0 embedding (34 / 32) against 4 bytes a weight: 4.5x smaller.
  EXPECT_LT(blocks->weight_bytes() * 4, wide->weight_bytes())
      << blocks->weight_bytes() << " vs " << wide->weight_bytes();

  constexpr int kSteps = 24;
  SessionOptions so;
  so.attention.kind = AttentionKind::kFull;
  so.max_context = static_cast<int64_t>(tokens.size()) + kSteps + 1;
  Session sb(*blocks, so), sf(*wide, so);
  const int64_t vocab = blocks->config().vocab_size;
  const std::vector<float> pb = sb.prefill(tokens, /*all_logits=*/true), pf = sf.prefill(tokens, true);
  double prefill_worst = 0;
  for (int64_t r = 0; r + 1 < static_cast<int64_t>(tokens.size()); ++r)
    prefill_worst = std::max(prefill_worst, rel_err(row_of(pb, r, vocab), row_of(pf, r, vocab)));
  // All rows but the last go through the f32 sgemm on the same f32 weights: equal up to sgemm's blocking.
  EXPECT_LE(prefill_worst, 1e-5);

  std::vector<float> lb = row_of(pb, static_cast<int64_t>(tokens.size()) - 1, vocab);
  std::vector<float> lf = row_of(pf, static_cast<int64_t>(tokens.size()) - 1, vocab);
  double decode_worst = rel_err(lb, lf);
  int same = 0;
  for (int i = 0; i <= kSteps; ++i) {
    // Teacher forcing with the f32 path's greedy tokens. The top-1 may differ only where the f32 path's top two
    // are closer than twice the bound (each path's logits within the bound of the same values).
    const int32_t t = argmax(lf);
    if (argmax(lb) == t) {
      ++same;
    } else {
      std::vector<float> sorted = lf;
      std::nth_element(sorted.begin(), sorted.begin() + 1, sorted.end(), std::greater<float>());
      const auto [lo, hi] = std::minmax_element(lf.begin(), lf.end());
      const double margin = (static_cast<double>(sorted[0]) - sorted[1]) / (static_cast<double>(*hi) - *lo);
      EXPECT_LT(margin, 2 * kDecodeRelTol) << "step " << i << ": block top-1 " << argmax(lb) << ", f32 " << t;
    }
    if (i == kSteps) break;
    sb.decode(t, lb);
    sf.decode(t, lf);
    decode_worst = std::max(decode_worst, rel_err(lb, lf));
  }
  if (std::getenv("RETROINFER_PRINT_ERR"))
    std::printf("prefill rows max rel %.3g, decode max rel %.3g, top-1 equal %d/%d\n", prefill_worst, decode_worst,
                same, kSteps + 1);
  EXPECT_LE(decode_worst, kDecodeRelTol);
  EXPECT_GT(decode_worst, 0.0);  // the block products do differ from f32 (the test compares two paths)
  EXPECT_GE(same, kSteps * 3 / 4) << "the block products' top-1 differs from f32's on most steps";
}

}  // namespace
}  // namespace retroinfer
