// CudaSessionOptions::decode_graphs: the model's non-attention work of a decode step replayed from CUDA
// graphs (captured once per session, one per gap between two layers' attention) must give exactly the
// logits of eager launches: the graphs hold the same kernels with the same arguments, in the same order, on
// the same buffers. Every attention method the runner serves, KV on the GPU and split with host-tier layers,
// sequences of equal and of different lengths (one attention object per layer vs per sequence and layer).
// The same for CudaJoinedDecoder's decode_graphs (one step over several one-sequence sessions).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cuda_model_test_util.h"
#include "gpu_test_util.h"
#include "retroinfer/cuda_model.h"
#include "retroinfer/model.h"

namespace retroinfer {
namespace {

using cuda::CudaJoinedDecoder;
using cuda::CudaModel;
using cuda::CudaSequenceSession;
using cuda::CudaSession;
using cuda::CudaSessionOptions;

constexpr int kLayers = 3;
constexpr int kSteps = 8;

struct Case {
  AttentionKind kind;
  KvPlacement placement;
  int gpu_layers;
  std::vector<int64_t> lengths;
};

std::string case_name(const Case& c) {
  char buf[96];
  std::snprintf(buf, sizeof buf, "%s %s %lld/%lld", std::string(attention_kind_name(c.kind)).c_str(),
                c.placement == KvPlacement::kGpu ? "gpu" : "split", (long long)c.lengths[0], (long long)c.lengths[1]);
  return buf;
}

// Prefill, then kSteps decode steps fed with `feed` (empty: greedy from this run, recorded into feed).
std::vector<std::vector<float>> run(const CudaModel& gm, const Case& tc, bool graphs,
                                    std::vector<std::vector<int32_t>>& feed, bool& active) {
  const ModelConfig& c = gm.config();
  CudaSessionOptions o;
  o.attention.kind = tc.kind;
  o.max_context = 1024;
  o.prefill_chunk = 256;
  o.placement = tc.placement;
  o.gpu_layers = tc.gpu_layers;
  o.decode_graphs = graphs;
  const int n = static_cast<int>(tc.lengths.size());
  std::vector<std::vector<int32_t>> prompts;
  for (int q = 0; q < n; ++q) prompts.push_back(gputest::random_tokens(tc.lengths[q], c.vocab_size, 300 + q));
  CudaSession s(gm, o, n);
  const std::vector<float> first = s.prefill(prompts);
  std::vector<int32_t> cur(n);
  for (int q = 0; q < n; ++q) {
    const float* row = first.data() + static_cast<size_t>(q) * c.vocab_size;
    cur[q] = static_cast<int32_t>(std::max_element(row, row + c.vocab_size) - row);
  }
  std::vector<std::vector<float>> steps;
  std::vector<float> logits(static_cast<size_t>(n) * c.vocab_size);
  const bool record = feed.empty();
  for (int i = 0; i < kSteps; ++i) {
    if (!record) cur = feed[i];
    else feed.push_back(cur);
    s.decode(cur, logits);
    steps.push_back(logits);
    for (int q = 0; q < n; ++q) {
      const float* row = logits.data() + static_cast<size_t>(q) * c.vocab_size;
      cur[q] = static_cast<int32_t>(std::max_element(row, row + c.vocab_size) - row);
    }
  }
  active = s.decode_graphs_active();
  return steps;
}

TEST(CudaDecodeGraphs, ReplayEqualsEagerLaunches) {
  RETROINFER_REQUIRE_GPU();
  ModelConfig c = gputest::synthetic_config(128);
  c.num_layers = kLayers;
  c.max_position_embeddings = 1024;
  gputest::MemoryModelFile f(c, 31);
  auto m = Model::load(f);
  auto gm = CudaModel::upload(*m, cuda::WeightType::kBf16);
  const std::vector<Case> cases = {
      {AttentionKind::kFull, KvPlacement::kGpu, -1, {700, 700}},
      {AttentionKind::kRetro, KvPlacement::kGpu, -1, {700, 700}},
      {AttentionKind::kRetro, KvPlacement::kGpu, -1, {700, 500}},
      {AttentionKind::kRetro, KvPlacement::kSplit, 1, {700, 700}},
      {AttentionKind::kQuest, KvPlacement::kGpu, -1, {700, 700}},
      {AttentionKind::kStreaming, KvPlacement::kGpu, -1, {700, 500}},
      {AttentionKind::kOracle, KvPlacement::kGpu, -1, {700, 700}},
  };
  for (const Case& tc : cases) {
    SCOPED_TRACE(case_name(tc));
    std::vector<std::vector<int32_t>> feed;
    bool eager_active = true, graph_active = false;
    const auto eager = run(*gm, tc, false, feed, eager_active);
    const auto graph = run(*gm, tc, true, feed, graph_active);
    EXPECT_FALSE(eager_active);
    EXPECT_TRUE(graph_active) << "the graph session fell back to eager launches (see stderr)";
    int64_t differing = 0;
    for (int i = 0; i < kSteps; ++i)
      for (size_t j = 0; j < eager[i].size(); ++j) differing += !(eager[i][j] == graph[i][j]);
    std::printf("[decode_graphs] %s: %d steps, graphs active %d, logits differing from eager %lld of %zu\n",
                case_name(tc).c_str(), kSteps, int(graph_active), (long long)differing,
                size_t(kSteps) * eager[0].size());
    EXPECT_EQ(differing, 0);
  }
}

// Joined decode steps of three one-sequence sessions (different prompt lengths) through a decoder with and
// without decode graphs, greedy tokens of the eager run fed to both: the same logits bit for bit.
TEST(CudaDecodeGraphs, JoinedReplayEqualsEagerLaunches) {
  RETROINFER_REQUIRE_GPU();
  ModelConfig c = gputest::synthetic_config(128);
  c.num_layers = kLayers;
  c.max_position_embeddings = 1024;
  gputest::MemoryModelFile f(c, 37);
  auto m = Model::load(f);
  auto gm = CudaModel::upload(*m, cuda::WeightType::kBf16);
  const std::vector<int64_t> lengths = {300, 520, 180};
  const int n = static_cast<int>(lengths.size());
  std::vector<std::vector<int32_t>> feed;  // [step][session], recorded by the eager run
  std::vector<std::vector<float>> eager;
  for (const bool graphs : {false, true}) {
    CudaSessionOptions o;
    o.attention.kind = AttentionKind::kRetro;
    o.max_context = 1024;
    o.prefill_chunk = 256;
    o.decode_graphs = graphs;
    std::vector<std::unique_ptr<CudaSequenceSession>> sessions;
    std::vector<CudaSession*> ptrs;
    std::vector<int32_t> cur(n);
    for (int i = 0; i < n; ++i) {
      sessions.push_back(std::make_unique<CudaSequenceSession>(*gm, o));
      const auto first = sessions.back()->prefill(gputest::random_tokens(lengths[i], c.vocab_size, 500 + i));
      cur[i] = static_cast<int32_t>(std::max_element(first.begin(), first.end()) - first.begin());
      ptrs.push_back(&sessions.back()->session());
    }
    CudaJoinedDecoder dec(*gm, graphs);
    std::vector<float> logits(static_cast<size_t>(n) * c.vocab_size);
    int64_t differing = 0;
    for (int step = 0; step < kSteps; ++step) {
      if (graphs) cur = feed[step];
      else feed.push_back(cur);
      dec.decode(ptrs, cur, logits);
      if (graphs) {
        for (size_t j = 0; j < logits.size(); ++j) differing += !(logits[j] == eager[step][j]);
      } else {
        eager.push_back(logits);
      }
      for (int i = 0; i < n; ++i) {
        const float* row = logits.data() + static_cast<size_t>(i) * c.vocab_size;
        cur[i] = static_cast<int32_t>(std::max_element(row, row + c.vocab_size) - row);
      }
    }
    if (graphs) {
      std::printf("[decode_graphs] joined retro %d sessions: %d steps, logits differing from eager %lld of %zu\n", n,
                  kSteps, (long long)differing, size_t(kSteps) * logits.size());
      EXPECT_EQ(differing, 0);
    }
  }
}

}  // namespace
}  // namespace retroinfer
