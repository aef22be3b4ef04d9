// The KV placement through the faces' path (SessionOptions::kv_placement -> make_session -> CudaSession) on a
// real model: SmolLM2-135M (30 layers, 3 KV heads of 64), retro attention, bf16 weights, greedy generation of
// 32 tokens after a 1024-token prompt with the KV on the GPU, split (15 / 15 layers) and on the host (every
// layer a wave buffer in pinned host memory). Also generate()'s summary, the eval harness on one tiny sample
// with the host placement, and auto spilling to the host tier when the GPU limit is too small.
//
// What must agree: the wave buffer's host tier selects the same clusters as the GPU tier from the same index
// and differs by f32 rounding only (docs/wave-buffer.md; per layer nmse <= 1e-10, tests/gpu/parity), but a
// model amplifies that rounding through bf16 K/V of later tokens and, at a near tie, one cluster between
// retrieval and estimation (test_cuda_placement.cpp measured up to 2.8e-1 of the logit scale on a random
// model, greedy tokens all equal). So the greedy tokens must be equal, token for token, unless at the first
// difference the GPU run's top-2 margin is below kNearTie of the logit scale (the comparison stops there).
// The host-tier counters: a block-cache hit ratio in [0, 1] and PCIe bytes > 0 (a 5% cache cannot hold every
// retrieved cluster of a 1024-token prompt at the first step: the cache starts empty, every first retrieval
// is a miss).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cuda_model_test_util.h"
#include "eval/eval_runner.h"
#include "eval/tasks.h"
#include "gpu_test_util.h"
#include "retroinfer/cuda_model.h"
#include "retroinfer/engine_model.h"
#include "retroinfer/error.h"
#include "retroinfer/generate.h"
#include "retroinfer/model.h"
#include "retroinfer/model_file.h"
#include "retroinfer/sampler.h"
#include "retroinfer/text_generate.h"

namespace retroinfer {
namespace {

constexpr int kGreedy = 32;
constexpr double kNearTie = 5e-2;  // as the SmolLM2 CPU comparison's row bound (test_cuda_model.cpp kSmolTol)

struct Smol {
  LoadedModel loaded;           // SmolLM2 with its tokenizer, the engine on the GPU (bf16 weights)
  std::vector<int32_t> prompt;  // 1024 tokens of the committed reference prompt
  const Model& model() const { return *loaded.model; }
  const EngineModel& engine() const { return *loaded.engine; }
};

// SmolLM2 on the GPU, or null with the skip reason.
const Smol* smol(std::string& why) {
  // Never destroyed: the device memory must not be freed after the CUDA runtime shuts down at exit.
  static Smol& s = *new Smol;
  static std::string reason;
  static bool tried = false;
  if (!tried) {
    tried = true;
    const auto ref = std::filesystem::path(RETROINFER_TEST_DATA) / "models" / "smollm2-reference.json";
    try {
      RETROINFER_CHECK(std::filesystem::exists(ref), ref.string(), " absent");
      std::ifstream f(ref);
      s.prompt = nlohmann::json::parse(f).at("tokens").get<std::vector<int32_t>>();
      s.prompt.resize(std::min<size_t>(s.prompt.size(), 1024));
      LoadOptions lo;
      lo.engine = {Device::kCuda, DeviceWeights::kBf16};
      s.loaded = load_model(locate_model("smollm2"), lo);
    } catch (const Error& e) {
      reason = std::string("SmolLM2 not available: ") + e.what();
      s.loaded.engine.reset();
    }
  }
  why = reason;
  return s.loaded.engine && s.loaded.tokenizer ? &s : nullptr;
}

SessionOptions retro_options(const Smol& s, KvPlacement placement, int gpu_layers = -1) {
  SessionOptions so = default_session_options(Device::kCuda, AttentionKind::kRetro, s.model().config().head_dim);
  so.max_context = static_cast<int64_t>(s.prompt.size()) + kGreedy + 1;
  so.kv_placement.placement = placement;
  so.kv_placement.gpu_layers = gpu_layers;
  return so;
}

struct GreedyRun {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // [kGreedy][vocab]: the row each token was chosen from
  std::optional<KvPlacementReport> report;
};

GreedyRun greedy(const Smol& s, const SessionOptions& so) {
  const std::unique_ptr<SequenceSession> session = make_session(s.engine(), so);
  GreedyRun r;
  std::vector<float> logits = session->prefill(s.prompt);
  for (int i = 0; i < kGreedy; ++i) {
    r.tokens.push_back(argmax(logits));
    r.logits.push_back(logits);
    if (i + 1 < kGreedy) session->decode(r.tokens.back(), logits);
  }
  r.report = session->kv_placement_report();
  return r;
}

// Tokens equal to the GPU run's, token for token, unless at the first difference the GPU row is a near tie.
void expect_same_tokens(const GreedyRun& gpu, const GreedyRun& got, const char* what) {
  int equal = 0;
  for (int i = 0; i < kGreedy; ++i) {
    if (got.tokens[i] != gpu.tokens[i]) {
      const double margin = gputest::top2_margin_rel(gpu.logits[i]);
      EXPECT_LT(margin, kNearTie) << what << ": greedy token " << i << " is " << got.tokens[i] << ", the GPU placement's "
                                  << gpu.tokens[i] << " (top-2 margin " << margin << " of the logit scale)";
      break;
    }
    ++equal;
  }
  const gputest::RowError e = gputest::row_error(got.logits[0].data(), gpu.logits[0].data(),
                                                 static_cast<int64_t>(gpu.logits[0].size()));
  std::printf("[kv_placement_faces] %s: %d/%d greedy tokens equal to gpu; prefill logits max rel diff %.3g\n", what,
              equal, kGreedy, e.rel);
}

void expect_host_tier(const GreedyRun& r, KvPlacement placement, int gpu_layers, int layers, const char* what) {
  ASSERT_TRUE(r.report.has_value()) << what;
  const KvPlacementReport& p = *r.report;
  EXPECT_EQ(p.placement, placement) << what;
  EXPECT_EQ(p.gpu_layers, gpu_layers) << what;
  EXPECT_EQ(p.host_layers, layers - gpu_layers) << what;
  EXPECT_GT(p.cache_hits + p.cache_misses, 0u) << what;
  EXPECT_GE(p.cache_hit_ratio(), 0.0) << what;
  EXPECT_LE(p.cache_hit_ratio(), 1.0) << what;
  EXPECT_GT(p.pcie_bytes, 0) << what;
  EXPECT_GE(p.pcie_bytes, p.step_pcie_bytes) << what;
  EXPECT_EQ(p.decode_steps, kGreedy - 1) << what;
  std::printf("[kv_placement_faces] %s: %d GPU / %d host layers, hit ratio %.3f (%llu hits, %llu misses), PCIe %lld "
              "bytes in %lld steps (last %lld)\n",
              what, p.gpu_layers, p.host_layers, p.cache_hit_ratio(), static_cast<unsigned long long>(p.cache_hits),
              static_cast<unsigned long long>(p.cache_misses), static_cast<long long>(p.pcie_bytes),
              static_cast<long long>(p.decode_steps), static_cast<long long>(p.step_pcie_bytes));
}

TEST(KvPlacementFaces, SmolLM2HostAndSplitGreedyEqualGpu) {
  RETROINFER_REQUIRE_GPU();
  std::string why;
  const Smol* s = smol(why);
  if (!s) GTEST_SKIP() << why;
  const int layers = s->model().config().num_layers;
  const GreedyRun gpu = greedy(*s, retro_options(*s, KvPlacement::kGpu));
  ASSERT_TRUE(gpu.report.has_value());
  EXPECT_EQ(gpu.report->placement, KvPlacement::kGpu);
  EXPECT_EQ(gpu.report->host_layers, 0);
  EXPECT_EQ(gpu.report->pcie_bytes, 0);

  const GreedyRun split = greedy(*s, retro_options(*s, KvPlacement::kSplit, layers / 2));
  expect_same_tokens(gpu, split, "split");
  expect_host_tier(split, KvPlacement::kSplit, layers / 2, layers, "split");

  const GreedyRun host = greedy(*s, retro_options(*s, KvPlacement::kHost));
  expect_same_tokens(gpu, host, "host");
  expect_host_tier(host, KvPlacement::kHost, 0, layers, "host");

  // generate() (the path of `retroinfer generate`, the server and Python) carries the report in its summary.
  GenerateOptions go;
  go.max_new_tokens = 8;
  go.ignore_eos = true;
  const GenerateSummary g = generate(s->engine(), retro_options(*s, KvPlacement::kHost), s->prompt, go);
  ASSERT_TRUE(g.kv_placement.has_value());
  EXPECT_EQ(g.kv_placement->placement, KvPlacement::kHost);
  EXPECT_EQ(g.kv_placement->decode_steps, g.decode_steps);
  EXPECT_GT(g.kv_placement->pcie_bytes, 0);
  EXPECT_EQ(g.tokens, std::vector<int32_t>(host.tokens.begin(), host.tokens.begin() + 8));  // same session kind
}

// auto: a GPU limit below what the GPU placement needs puts retro's layers on the host tier instead of refusing
// (the server's admission path: make_generation_session -> make_session with the server's placement, auto).
TEST(KvPlacementFaces, AutoSpillsToTheHostTierWhenTheGpuLimitIsTooSmall) {
  RETROINFER_REQUIRE_GPU();
  std::string why;
  const Smol* s = smol(why);
  if (!s) GTEST_SKIP() << why;
  SessionOptions so = retro_options(*s, KvPlacement::kAuto);
  so.max_context = model_max_context(s->model().config());
  cuda::CudaSessionOptions co;
  co.attention = so.attention;
  co.max_context = so.max_context;
  co.prefill_chunk = so.prefill_chunk;
  co.gpu_memory_limit = int64_t{1} << 40;
  const int64_t weights = s->engine().device_weight_bytes();
  co.placement = KvPlacement::kGpu;
  const cuda::CudaSessionPlan all_gpu = cuda::CudaSession::plan(s->model().config(), co, 1, weights);
  co.placement = KvPlacement::kHost;
  const cuda::CudaSessionPlan all_host = cuda::CudaSession::plan(s->model().config(), co, 1, weights);
  std::printf("[kv_placement_faces] %lld-token plans: GPU bytes %lld with every layer on the GPU, %lld with every "
              "layer on the host tier\n",
              static_cast<long long>(so.max_context), static_cast<long long>(all_gpu.gpu_bytes),
              static_cast<long long>(all_host.gpu_bytes));
  // One byte short of the GPU placement: auto spills when a host-tier plan fits under that limit; when even
  // the all-host plan needs more GPU memory (a host-tier layer's block cache, index and execution buffer
  // outweigh its K/V: short contexts with 2-token clusters), auto refuses with the numbers.
  so.kv_placement.gpu_memory_limit = all_gpu.gpu_bytes - weights - 1;
  if (all_host.gpu_bytes >= all_gpu.gpu_bytes) {
    gputest::expect_error([&] { make_session(s->engine(), so); }, "does not fit", "auto, limit below every plan");
    gputest::expect_error([&] { make_session(s->engine(), so); }, "nothing was allocated", "auto, refusal");
    // Under a limit that holds both plans, auto takes the cheaper one: every layer on the GPU. The spill
    // itself is the planner's (tests/unit/test_session_planner*.cpp) and needs contexts where a host-tier
    // layer costs the GPU less than its K/V.
    so.kv_placement.gpu_memory_limit = all_host.gpu_bytes - weights;
    EXPECT_EQ(make_session(s->engine(), so)->kv_placement_report()->placement, KvPlacement::kGpu);
    return;
  }
  const std::unique_ptr<SequenceSession> session = make_session(s->engine(), so);
  const std::optional<KvPlacementReport> r = session->kv_placement_report();
  ASSERT_TRUE(r.has_value());
  EXPECT_NE(r->placement, KvPlacement::kGpu);
  EXPECT_GT(r->host_layers, 0);
  std::vector<float> logits = session->prefill(s->prompt);
  session->decode(argmax(logits), logits);
  EXPECT_GE(session->kv_placement_report()->cache_hit_ratio(), 0.0);
  std::printf("[kv_placement_faces] auto under a %lld-byte GPU limit: %s, %d GPU / %d host layers\n",
              static_cast<long long>(so.kv_placement.gpu_memory_limit),
              std::string(buffer::kv_placement_name(r->placement)).c_str(), r->gpu_layers, r->host_layers);
}

// eval with the host placement: retro prefills its own host-tier session, full forks the GPU prefill; retro's
// result line reports the block cache's hit ratio.
TEST(KvPlacementFaces, EvalWithHostPlacementReportsTheHitRatio) {
  RETROINFER_REQUIRE_GPU();
  std::string why;
  const Smol* s = smol(why);
  if (!s) GTEST_SKIP() << why;
  const Tokenizer& tok = *s->loaded.tokenizer;
  eval::TaskResources res;
  for (int i = 0; i < 2000; ++i) res.essay_words.push_back(i % 7 == 0 ? "river" : "stone");
  for (int i = 0; i < 200; ++i) res.words.push_back(std::string{char('a' + i % 26), char('a' + i / 26 % 26), 'q'});
  const eval::TaskGenerator gen(std::move(res), eval::token_counter(tok), eval::chat_prompt_wrapper(tok), {});
  eval::EvalOptions eo;
  eo.tasks = {"niah_single_1"};
  eo.contexts = {1024};
  eo.samples = 1;
  eo.methods = {"full", "retro"};
  eo.baseline_budget = eval::BaselineBudget::kNominal;
  eo.kv_dtype = DType::kBF16;
  eo.prefill_chunk = 2048;
  eo.attention = default_session_options(Device::kCuda, AttentionKind::kRetro, s->model().config().head_dim).attention;
  eo.kv_placement.placement = KvPlacement::kHost;
  eo.results_path = ::testing::TempDir() + "kv_placement_eval.jsonl";
  std::filesystem::remove(eo.results_path);
  ASSERT_EQ(eval::run_eval(s->engine(), tok, gen, eo), 2);
  const std::vector<nlohmann::json> lines = eval::load_results(eo.results_path);
  ASSERT_EQ(lines.size(), 2u);
  for (const auto& j : lines) {
    if (j.at("method") == "full") {
      EXPECT_EQ(j.at("kv_placement"), "gpu");
      EXPECT_FALSE(j.contains("cache_hit_ratio"));
    } else {
      EXPECT_EQ(j.at("kv_placement"), "host");
      ASSERT_TRUE(j.contains("cache_hit_ratio"));
      if (!j.at("cache_hit_ratio").is_null()) {
        EXPECT_GE(j.at("cache_hit_ratio").get<double>(), 0.0);
        EXPECT_LE(j.at("cache_hit_ratio").get<double>(), 1.0);
      }
      EXPECT_GT(j.at("pcie_bytes").get<int64_t>(), 0);
    }
  }
  std::printf("[kv_placement_faces] eval host: %s\n", lines.back().dump().c_str());
}

}  // namespace
}  // namespace retroinfer
