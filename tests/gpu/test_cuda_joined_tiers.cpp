// Joined decode across KV placements (CudaJoinedDecoder, cuda_model.h): one-sequence sessions whose layers keep
// their KV on the GPU (kGpu), in pinned host memory through the wave buffer (kHost) or both (kSplit), prefilled
// apart with different prompt lengths, decode in one step; each against a twin session of the same placement
// decoded alone. One "[cuda_joined_tiers]" line per case.
//
// Model: synthetic_config(128) with 3 layers (Qwen2-style: 8 query / 2 KV heads, head_dim 128), retro with a
// 16-token window. Sessions: 0 kGpu (300 tokens), 1 kHost (520), 2 kSplit with 1 GPU layer (180: layer 0 on the
// GPU, layers 1-2 on the host), 3 kHost (410). Steps mix them: all four, host-tier sessions only (side streams
// only), one host session alone in the decoder, a GPU and a split session; a session outside a step decodes
// alone that step (it leaves and rejoins).
//
// What must agree and how closely:
//   logits: a host-tier layer's attention in the joined step is the session's own WaveLayerAttention on the same
//     q / k_new / v_new row (appended to its own steady zone as in its own decode), so the joined logits differ
//     from alone only by the products' summation order over n rows instead of 1: the bounds of
//     test_cuda_joined.cpp (f32: 1e-3 of the logit scale, retro's e^logit weights amplify the ~1e-5 of the
//     products; bf16: 3e-2, the tuned kernels per row count). A wrong q / K / V row, a missed or doubled append,
//     or an attention reading q before the segment wrote it (a stream-ordering fault) is off by O(1).
//     The bf16 case retrieves every cluster: with retro's 2% a q that differs from its twin's by the
//     products' rounding (2^-9) can select another cluster, an O(1) change of that head's output (seen on an
//     H100: 0.2-0.34 of the logit scale at one step), so it would test the selection's stability instead of
//     the joined step.
//   f32 case: the host-tier sessions' block cache has no pages (cache_pages 0), so every retrieval cluster is a
//     miss read from pinned host memory each step and the execution buffer's row order is the same joined and
//     alone (no dependence on the manager's timing); index updates every 8 tokens (window 16, update_tokens 8,
//     one cluster each) fall due during the run, mostly in joined steps, on both tiers (a host-tier update
//     synchronises on the session's stream in the middle of the joined layer). bf16
//     case: the default cache (hits and misses, the manager free-running), every cluster retrieved (above) and
//     no update within the run.
//   wave-buffer counts after each step: the host-tier sessions' steady rows equal their alone twin's (one append
//     per step, updates at the same tokens); the last step's retrieval clusters (hits + misses) > 0, and with the
//     f32 case's empty cache all misses.
//   greedy tokens: equal wherever the top-2 margin exceeds twice that step's measured error (as
//     test_cuda_joined.cpp); decode_greedy's device argmax: equal wherever the margin exceeds twice the bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cuda_model_test_util.h"
#include "gpu_test_util.h"
#include "retroinfer/cuda_model.h"
#include "retroinfer/error.h"

namespace retroinfer {
namespace {

using cuda::CudaModel;
using cuda::CudaSequenceSession;
using cuda::CudaSession;
using cuda::CudaSessionOptions;

struct TierCase {
  cuda::WeightType weights;
  int64_t cache_pages;  // host-tier block cache per flat head (-1: cache_fraction)
  int update_tokens;    // retro index updates
  int update_clusters;
  double tol;           // row max |diff| / max |logit| (header)
  bool retrieve_all;    // retro attends every cluster exactly (no estimation zone, no budgets by layer)
};

struct Member {
  KvPlacement placement;
  int gpu_layers;  // kSplit
  int prompt;
};

const std::vector<Member> kMembers = {
    {KvPlacement::kGpu, -1, 300}, {KvPlacement::kHost, -1, 520}, {KvPlacement::kSplit, 1, 180}, {KvPlacement::kHost, -1, 410}};

CudaSessionOptions member_options(const TierCase& tc, const Member& m) {
  CudaSessionOptions o;
  o.attention.kind = AttentionKind::kRetro;
  o.attention.window_tokens = 16;  // a short steady zone: retro selects clusters of these prompts
  o.attention.update_tokens = tc.update_tokens;
  o.attention.update_clusters = tc.update_clusters;
  o.max_context = 1024;
  o.prefill_chunk = 128;
  o.placement = m.placement;
  o.gpu_layers = m.gpu_layers;
  o.wave.cache_pages = tc.cache_pages;
  if (tc.retrieve_all) {
    o.attention.retrieval_fraction = 1.0;
    o.attention.estimation = false;
    o.attention.layer_budget_queries = 0;
  }
  return o;
}

int32_t argmax_of(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

// max |a - b| / max |b| over one row.
double rel_err(std::span<const float> a, std::span<const float> b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    num = std::max(num, std::fabs(double(a[i]) - double(b[i])));
    den = std::max(den, std::fabs(double(b[i])));
  }
  return den > 0.0 ? num / den : num;
}

void tiers_case(const TierCase& tc, const char* name) {
  RETROINFER_REQUIRE_GPU();
  ModelConfig c = gputest::synthetic_config(128);
  c.num_layers = 3;
  gputest::MemoryModelFile f(c, 41);
  auto m = Model::load(f);
  auto gm = CudaModel::upload(*m, tc.weights);
  const int64_t V = c.vocab_size;
  const int S = static_cast<int>(kMembers.size());
  std::vector<std::unique_ptr<CudaSequenceSession>> joined, alone;
  std::vector<int32_t> next(S);
  for (int i = 0; i < S; ++i) {
    const auto prompt = gputest::random_tokens(kMembers[i].prompt, c.vocab_size, 800 + i);
    const CudaSessionOptions o = member_options(tc, kMembers[i]);
    joined.push_back(std::make_unique<CudaSequenceSession>(*gm, o));
    alone.push_back(std::make_unique<CudaSequenceSession>(*gm, o));
    const auto la = joined[i]->prefill(prompt);
    const auto lb = alone[i]->prefill(prompt);
    ASSERT_EQ(la, lb) << "two prefills of one prompt, session " << i;
    next[i] = argmax_of(lb);
    const int host_layers = joined[i]->session().memory_plan().host_layers;
    ASSERT_EQ(host_layers, kMembers[i].placement == KvPlacement::kGpu ? 0 : kMembers[i].placement == KvPlacement::kSplit ? 2 : 3)
        << "session " << i;
    ASSERT_NE(joined[i]->join_key(), nullptr) << "session " << i << " (any placement joins)";
    EXPECT_EQ(joined[i]->join_key(), joined[0]->join_key());
  }
  // Through the batch scheduler's interface, made by a host-tier session.
  auto jd = joined[1]->make_joined_decode();
  ASSERT_NE(jd, nullptr);
  double worst = 0.0;
  int greedy_equal = 0, greedy_total = 0, joined_rows = 0, alone_in_decoder_bitwise = 0, alone_in_decoder_steps = 0;
  // Every session decodes at every step (joined or alone); the f32 case's index updates fall due within the
  // first 8 steps after the prompt and again 8 tokens later.
  const std::vector<std::vector<int>> steps = {{0, 1, 2, 3}, {0, 1, 2, 3}, {1, 3},       {1},         {0, 2},
                                               {3, 2, 1, 0}, {2, 1},       {0, 1, 2, 3}, {0, 1, 2, 3}, {1, 2, 3}};
  for (size_t st = 0; st < steps.size(); ++st) {
    const std::vector<int>& who = steps[st];
    std::vector<SequenceSession*> ss;
    std::vector<int32_t> tk;
    for (int i : who) {
      ss.push_back(joined[i].get());
      tk.push_back(next[i]);
    }
    std::vector<float> got(who.size() * V);
    jd->decode(ss, tk, got);
    for (int i = 0; i < S; ++i) {
      const auto at = std::find(who.begin(), who.end(), i);
      std::vector<float> want(V);
      if (at == who.end()) {  // decodes alone this step
        std::vector<float> a(V);
        joined[i]->decode(next[i], a);
        alone[i]->decode(next[i], want);
        EXPECT_LE(rel_err(a, want), tc.tol) << "step " << st << " session " << i << " (alone in a joined session)";
        next[i] = argmax_of(want);
        continue;
      }
      alone[i]->decode(next[i], want);
      ++joined_rows;
      const std::span<const float> row(got.data() + (at - who.begin()) * V, V);
      const double e = rel_err(row, want);
      worst = std::max(worst, e);
      EXPECT_LE(e, tc.tol) << "step " << st << " session " << i;
      if (who.size() == 1) {  // one row: the products' shapes are the session's own
        ++alone_in_decoder_steps;
        alone_in_decoder_bitwise += std::equal(row.begin(), row.end(), want.begin());
      }
      next[i] = argmax_of(want);
      if (gputest::top2_margin_rel(want) > 2 * e) {
        ++greedy_total;
        greedy_equal += argmax_of(row) == argmax_of(want);
      }
    }
    for (int i = 0; i < S; ++i) {
      ASSERT_EQ(joined[i]->position(), alone[i]->position()) << "step " << st << " session " << i;
      if (kMembers[i].placement == KvPlacement::kGpu) continue;
      const cuda::CudaWaveCounts jw = joined[i]->session().last_wave_counts();
      const cuda::CudaWaveCounts aw = alone[i]->session().last_wave_counts();
      EXPECT_EQ(jw.objects, joined[i]->session().memory_plan().host_layers) << "step " << st << " session " << i;
      EXPECT_EQ(jw.step.steady_rows, aw.step.steady_rows) << "step " << st << " session " << i;
      EXPECT_GT(jw.step.hit_clusters + jw.step.miss_clusters, 0) << "step " << st << " session " << i;
      if (tc.cache_pages == 0) {
        EXPECT_EQ(jw.step.hit_clusters, 0) << "step " << st << " session " << i;
        EXPECT_EQ(jw.step.miss_clusters, aw.step.miss_clusters) << "step " << st << " session " << i;
      }
    }
  }
  EXPECT_EQ(greedy_equal, greedy_total);
  // A quarter of the rows, as test_cuda_joined.cpp's 4 of 16 (bf16: errors of a few 1e-3 hide near ties).
  EXPECT_GE(4 * greedy_total, joined_rows) << "too few clear-margin rows (" << greedy_total << " of " << joined_rows
                                           << ") for the greedy check";
  // One greedy joined step (argmax on the device) of all four, against each twin's own decode.
  {
    cuda::CudaJoinedDecoder dec(*gm);
    std::vector<CudaSession*> ss;
    for (auto& j : joined) ss.push_back(&j->session());
    std::vector<int32_t> got(S);
    dec.decode_greedy(ss, next, got);
    for (int i = 0; i < S; ++i) {
      std::vector<float> want(V);
      alone[i]->decode(next[i], want);
      if (gputest::top2_margin_rel(want) > 2 * tc.tol) {
        EXPECT_EQ(got[i], argmax_of(want)) << "greedy, session " << i;
      }
      next[i] = argmax_of(want);
      ASSERT_EQ(joined[i]->position(), alone[i]->position()) << "greedy step, session " << i;
    }
  }
  // Afterwards every session decodes alone from where the joined steps left it.
  double after = 0.0;
  for (int k = 0; k < 3; ++k)
    for (int i = 0; i < S; ++i) {
      std::vector<float> a(V), b(V);
      joined[i]->decode(next[i], a);
      alone[i]->decode(next[i], b);
      after = std::max(after, rel_err(a, b));
      next[i] = argmax_of(b);
    }
  EXPECT_LE(after, tc.tol);
  const cuda::CudaWaveCounts hw = joined[1]->session().last_wave_counts();
  std::printf("[cuda_joined_tiers] %s: gpu/host/split/host sessions (prompts 300/520/180/410), %zu joined steps: max "
              "rel logit err vs alone %.2e (bound %.0e), greedy %d/%d clear-margin steps equal, one-row joined "
              "steps bitwise equal alone %d/%d; 3 alone steps after: %.2e; host session's last step: %lld hit / "
              "%lld miss clusters, manager saw %llu steps\n",
              name, steps.size(), worst, tc.tol, greedy_equal, greedy_total, alone_in_decoder_bitwise,
              alone_in_decoder_steps, after, static_cast<long long>(hw.step.hit_clusters),
              static_cast<long long>(hw.step.miss_clusters), static_cast<unsigned long long>(hw.totals.steps_seen));
}

// f32 weights, an empty host-tier cache (every retrieval cluster read over PCIe), index updates every 8 tokens.
TEST(CudaJoinedTiers, MixedPlacementsMatchAloneF32) {
  tiers_case(TierCase{cuda::WeightType::kF32, 0, 8, 1, 1e-3, false},
             "f32 weights, cache 0 pages, updates every 8 tokens");
}

// bf16 weights, the default cache (hits and misses), every cluster retrieved, no index update within the run.
TEST(CudaJoinedTiers, MixedPlacementsMatchAloneBf16) {
  tiers_case(TierCase{cuda::WeightType::kBf16, -1, 1024, 64, 3e-2, true},
             "bf16 weights, default cache, every cluster retrieved");
}

}  // namespace
}  // namespace retroinfer
