// Cluster traces on the GPU: the recorder of the CUDA retro layer writes exactly the RetroLayer's retrieval
// selection (debug_state) with its cluster sizes, and the wave buffer's retrieval override replaces the
// selection's ids before the lookup (the cache sees the override's clusters: misses, then hits).
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>

#include <unistd.h>

#include "attention/cuda/selection_recorder.h"
#include "cuda_model_test_util.h"
#include "gpu_test_util.h"
#include "retroinfer/cuda_model.h"
#include "retroinfer/cluster_trace.h"
#include "retroinfer/error.h"
#include "retroinfer/wave_buffer.h"

namespace retroinfer {
namespace {

struct TraceRig {
  int num_seqs = 2, hkv = 2, group = 4, d = 128;
  int64_t n = 6000;
  AttentionConfig cfg;
  gputest::KvData kv;
  cuda::DeviceBuffer dk, dv;
  explicit TraceRig(uint64_t seed) {
    kv = gputest::make_kv(num_seqs * hkv, n, n + 5, d, seed);
    dk = gputest::upload(kv.k);
    dv = gputest::upload(kv.v);
  }
  AttentionShape shape() const { return AttentionShape{hkv * group, hkv, d}; }
  size_t q_elems() const { return size_t(num_seqs) * hkv * group * d; }
  int flat_heads() const { return num_seqs * hkv; }
};

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("retroinfer_gpu_trace_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

TEST(CudaClusterTrace, RecorderWritesTheRetroLayerSelection) {
  RETROINFER_REQUIRE_GPU();
  const uint64_t seed = 31;
  TraceRig su(seed);
  cuda::RetroLayer layer(su.shape(), su.cfg, su.num_seqs);
  layer.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
  ASSERT_GT(layer.num_clusters(), 0);
  ASSERT_GT(layer.n_retrieval(), 0);
  const std::string path = temp_path("recorder");
  ClusterTraceHeader h;
  h.num_layers = 4;
  h.num_heads_kv = su.hkv;
  h.head_dim = su.d;
  const int S = 3;
  std::vector<std::vector<std::vector<int32_t>>> want(S);  // [step][flat head] ids
  std::vector<std::vector<int32_t>> sizes(size_t(su.flat_heads()));
  {
    ClusterTraceWriter w(path, h);
    cuda::SelectionRecorder rec;
    rec.set_trace(&w, 3, 5, su.num_seqs, su.hkv);
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto q = gputest::make_q(su.kv, su.group, seed + 1);
    auto dq = gputest::upload(q);
    auto out = gputest::poisoned(su.q_elems());
    for (int s = 0; s < S; ++s) {
      for (auto& x : q) x += 0.3f * nd(rng);  // another selection each step
      dq.upload(q.data(), q.size() * 4);
      layer.decode(dq.as<float>(), out.as<float>());
      rec.after_decode(layer, su.n, nullptr);
      for (int f = 0; f < su.flat_heads(); ++f) {
        const cuda::RetroDebugState ds = layer.debug_state(f);
        want[size_t(s)].push_back(ds.retrieval_ids);
        sizes[size_t(f)] = ds.sizes;
      }
    }
    rec.drain();
  }
  const ClusterTrace t = read_cluster_trace(path);
  ASSERT_EQ(t.records.size(), size_t(S) * su.flat_heads());
  for (size_t i = 0; i < t.records.size(); ++i) {
    const ClusterTraceRecord& r = t.records[i];
    const int s = int(i) / su.flat_heads(), f = int(i) % su.flat_heads();
    SCOPED_TRACE(testing::Message() << "seed " << seed << " step " << s << " flat head " << f);
    EXPECT_EQ(r.step, s);
    EXPECT_EQ(r.layer, 3);
    EXPECT_EQ(r.seq, 5 + f / su.hkv);
    EXPECT_EQ(r.head, f % su.hkv);
    EXPECT_EQ(r.num_clusters, layer.num_clusters());
    EXPECT_EQ(r.context_tokens, su.n);
    EXPECT_EQ(r.ids, want[size_t(s)][size_t(f)]);
    ASSERT_EQ(r.sizes.size(), r.ids.size());
    for (size_t j = 0; j < r.ids.size(); ++j) EXPECT_EQ(r.sizes[j], sizes[size_t(f)][size_t(r.ids[j])]);
  }
  std::remove(path.c_str());
}

TEST(CudaClusterTrace, WaveBufferOverrideReplacesTheSelection) {
  RETROINFER_REQUIRE_GPU();
  const uint64_t seed = 47;
  TraceRig su(seed);
  WaveBufferConfig w;
  w.tier = KvTier::kHost;
  w.cache_pages = su.n;  // room for everything: the override's clusters hit once admitted
  cuda::WaveBufferLayer layer(su.shape(), su.cfg, w, su.num_seqs);
  layer.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
  ASSERT_GE(layer.n_retrieval(), 3);
  const std::vector<int32_t> pick = {0, 2, 4};
  int64_t calls = 0;
  layer.set_retrieval_override([&](int64_t step, int num_clusters, int n_r, int32_t* ids) {
    EXPECT_EQ(step, calls);
    EXPECT_EQ(num_clusters, layer.num_clusters());
    ++calls;
    for (int f = 0; f < su.flat_heads(); ++f)
      for (int j = 0; j < n_r; ++j) ids[size_t(f) * n_r + j] = j < 3 ? pick[size_t(j)] : -1;
  });
  int64_t picked_rows = 0;
  for (int f = 0; f < su.flat_heads(); ++f) {
    const cuda::RetroDebugState ds = layer.index().debug_state(f);
    for (int32_t c : pick) picked_rows += ds.sizes[size_t(c)];
  }
  const auto q = gputest::make_q(su.kv, su.group, seed + 1);
  auto dq = gputest::upload(q);
  auto out = gputest::poisoned(su.q_elems());
  layer.decode(dq.as<float>(), out.as<float>());
  const WaveStepCounts c0 = layer.last_step_counts();
  EXPECT_EQ(c0.hit_clusters, 0);
  EXPECT_EQ(c0.miss_clusters, 3 * su.flat_heads());
  EXPECT_EQ(c0.miss_rows, picked_rows);
  layer.wait_manager();
  layer.decode(dq.as<float>(), out.as<float>());
  const WaveStepCounts c1 = layer.last_step_counts();
  EXPECT_EQ(c1.miss_clusters, 0);
  EXPECT_EQ(c1.hit_clusters, 3 * su.flat_heads());
  EXPECT_EQ(c1.hit_rows, picked_rows);
  EXPECT_EQ(calls, 2);
  cuda::StreamHandle stream;
  EXPECT_THROW(layer.capture_graph(dq.as<float>(), out.as<float>(), stream.get()), Error);
  // Ids that are not ascending are refused before they reach the device.
  layer.set_retrieval_override([](int64_t, int, int n_r, int32_t* ids) {
    for (int j = 0; j < n_r; ++j) ids[j] = n_r - j;
  });
  EXPECT_THROW(layer.decode(dq.as<float>(), out.as<float>()), Error);
}

// Through the runner: a GPU-tier session records every layer, sequence and KV head of every step; a host-tier
// session of the same model and prompts that follows that trace selects exactly the trace's clusters (same
// index, so the mapping is the identity up to the per-sequence step offset).
TEST(CudaClusterTrace, SessionRecordsAndAHostTierSessionFollowsTheTrace) {
  RETROINFER_REQUIRE_GPU();
  ModelConfig c = gputest::synthetic_config(128);
  c.num_layers = 3;
  c.max_position_embeddings = 4096;
  gputest::MemoryModelFile f(c, 21);
  auto m = Model::load(f);
  auto gm = cuda::CudaModel::upload(*m, cuda::WeightType::kBf16);
  const int n = 2, S = 5;
  const std::vector<std::vector<int32_t>> prompts = {gputest::random_tokens(3000, c.vocab_size, 1),
                                                     gputest::random_tokens(3000, c.vocab_size, 2)};
  auto options = [&](KvPlacement p) {
    cuda::CudaSessionOptions o;
    o.attention.kind = AttentionKind::kRetro;
    o.max_context = 4096;
    o.placement = p;
    return o;
  };
  const std::string path = temp_path("session");
  ClusterTraceHeader h;
  h.num_layers = c.num_layers;
  h.num_heads_kv = c.num_heads_kv;
  h.head_dim = c.head_dim;
  std::vector<float> logits(size_t(n) * c.vocab_size);
  const std::vector<int32_t> feed = {5, 9};
  {
    cuda::CudaSessionOptions o = options(KvPlacement::kGpu);
    o.cluster_trace = std::make_shared<ClusterTraceWriter>(path, h);
    cuda::CudaSession s(*gm, o, n);
    s.prefill(prompts);
    for (int i = 0; i < S; ++i) s.decode(feed, logits);
  }  // the last step's records are written when the session closes
  const ClusterTrace t = read_cluster_trace(path);
  ASSERT_EQ(t.records.size(), size_t(S) * c.num_layers * n * c.num_heads_kv);
  for (const ClusterTraceRecord& r : t.records) {
    EXPECT_LT(r.step, S);
    EXPECT_LT(r.seq, n);
    EXPECT_EQ(r.context_tokens, 3001 + r.step);
    EXPECT_GT(r.ids.size(), 0u);
  }
  auto schedule = std::make_shared<const ClusterTraceSchedule>(t);
  cuda::CudaSessionOptions o = options(KvPlacement::kHost);
  o.query_trace = schedule;
  cuda::CudaSession s(*gm, o, n);
  s.prefill(prompts);
  for (int i = 0; i < S; ++i) s.decode(feed, logits);
  const cuda::CudaWaveCounts w = s.last_wave_counts();
  ASSERT_EQ(w.objects, c.num_layers);
  // The last step (4): flat head f of layer l follows sequence 0's head f % H at step (4 + 16 * (f / H)) % S.
  int64_t want = 0;
  for (const ClusterTraceRecord& r : t.records)
    if (r.seq == 0)
      for (int q = 0; q < n; ++q)
        if (r.step == (S - 1 + ClusterTraceSchedule::kHeadStepOffset * q) % S) want += int64_t(r.ids.size());
  EXPECT_EQ(w.step.hit_clusters + w.step.miss_clusters, want);
  std::remove(path.c_str());
}

}  // namespace
}  // namespace retroinfer
