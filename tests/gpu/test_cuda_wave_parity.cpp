// The GPU wave index against the CPU specification written on branch wave: index::segmented_kmeans
// (src/index/kmeans.h) and the retro attention method (src/attention/retro.cpp) on the same bf16 K/V.
//
// What can and cannot agree exactly: the GPU scores assignments as bf16(key - mean) . bf16(centroid) on
// the tensor cores, the CPU in f32 (OpenBLAS). Where two centroids score within the bf16 rounding of each
// other the argmax can differ, and k-means iterations amplify a flip, so the tests measure the assignment
// mismatch rate and compare the clustering quality (spherical objective, kmeans_objective) instead of
// demanding equal assignments (test_cuda_kmeans.cpp checks exact equality where the arithmetic matches).
// Downstream, different clusters select different exact tokens, so retro outputs are compared through
// their error against dense attention rather than element by element.
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "gpu_test_util.h"
#include "index/kmeans.h"
#include "retroinfer/attention.h"
#include "retroinfer/kv_cache.h"

namespace retroinfer {
namespace {

// [n, d] f32 keys (or values) of flat head h, indexed tokens [begin, begin + n).
std::vector<float> rows(const gputest::KvData& kv, int h, int64_t begin, int64_t n, bool keys) {
  std::vector<float> out(size_t(n) * kv.d);
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < kv.d; ++i) out[t * kv.d + i] = keys ? kv.key(h, begin + t, i) : kv.value(h, begin + t, i);
  return out;
}

TEST(CudaWaveParity, KMeansAgainstCpuSpecification) {
  RETROINFER_REQUIRE_GPU();
  const int heads = 2, d = 128;
  const int64_t n = 6000;
  auto kv = gputest::make_kv(heads, n, n, d, 4242, 24, 0.7f);
  AttentionConfig cfg;  // paper defaults except a short segment so that several segments exist
  cfg.segment_tokens = 2048;
  cuda::RetroLayer layer(AttentionShape{heads * 4, heads, d}, cfg);
  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v);
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), n, n);
  const int64_t begin = layer.indexed_begin(), n_idx = layer.indexed_tokens();
  index::KMeansParams kp;
  kp.tokens_per_cluster = cfg.tokens_per_cluster;
  kp.segment_tokens = cfg.segment_tokens;
  kp.segment_iters = cfg.kmeans_segment_iters;
  kp.global_iters = cfg.kmeans_global_iters;
  for (int h = 0; h < heads; ++h) {
    SCOPED_TRACE(testing::Message() << "head " << h);
    const auto keys = rows(kv, h, begin, n_idx, true), values = rows(kv, h, begin, n_idx, false);
    const index::ClusterIndex cpu = index::segmented_kmeans(keys.data(), values.data(), n_idx, d, kp);
    const auto st = layer.debug_state(h);
    ASSERT_EQ(st.num_clusters, cpu.num_clusters);
    index::ClusterIndex gpu;
    gpu.num_clusters = st.num_clusters;
    gpu.head_dim = d;
    gpu.centroids = st.centroids;
    gpu.value_sums = st.value_sums;
    gpu.sizes = st.sizes;
    gpu.assignment = st.assignment;
    gpu.offsets = st.offsets;
    gpu.members = st.members;
    int64_t mism = 0;
    for (int64_t t = 0; t < n_idx; ++t) mism += gpu.assignment[t] != cpu.assignment[t];
    const double og = index::kmeans_objective(keys.data(), n_idx, d, gpu);
    const double oc = index::kmeans_objective(keys.data(), n_idx, d, cpu);
    const double rate = double(mism) / double(n_idx);
    std::printf("[wave parity] k-means head %d: assignment mismatch %.4f, objective gpu %.2f cpu %.2f (rel %+.2e)\n",
                h, rate, og, oc, (og - oc) / std::abs(oc));
    // Equal clustering quality within 1% (measured: ~1e-4; a wrong update or assignment costs >10%).
    EXPECT_NEAR(og, oc, 0.01 * std::abs(oc));
    // Same index shape: the segment layout and cluster count match exactly; the sizes sum to n_idx.
    EXPECT_EQ(std::accumulate(gpu.sizes.begin(), gpu.sizes.end(), int64_t{0}), n_idx);
    EXPECT_LT(rate, 0.3);
  }
}

// GPU and CPU retro on the same cache: each against exact attention. The GPU's error must be of the
// CPU's size (both approximate the same way with slightly different clusters).
TEST(CudaWaveParity, RetroAgainstCpuRetro) {
  RETROINFER_REQUIRE_GPU();
  const int hkv = 2, G = 4, d = 128;
  const int64_t n = 8000;
  auto kv = gputest::make_kv(hkv, n, n, d, 777, 16, 0.8f);
  auto q = gputest::make_q(kv, G, 778, 1.0f);
  AttentionShape shape{hkv * G, hkv, d};
  AttentionConfig cfg;
  cfg.segment_tokens = 4096;
  cfg.retrieval_fraction = 0.05;
  cfg.estimation_fraction = 0.25;
  cfg.outlier_fraction = 0.0;  // the CUDA RetroLayer has no outlier zone (yet): compare like with like
  // The paper's 9 segment iterations, not the default 1: each query here is one key plus noise, and only
  // the noise directions tell that key's cluster from the 30 others around its centre, so with 1 iteration
  // both backends miss the dominant token for some queries (run 27: error against full 1.12 on the CPU,
  // 1.11 on the GPU) and the comparison below says nothing; converged clusters keep it sharp.
  cfg.kmeans_segment_iters = 9;
  // CPU: a bf16 KvCache holding exactly the GPU's bf16 values.
  KvCache cache(hkv, d, DType::kBF16);
  {
    std::vector<float> k(size_t(n) * hkv * d), v(k.size());
    for (int64_t t = 0; t < n; ++t)
      for (int h = 0; h < hkv; ++h)
        for (int i = 0; i < d; ++i) {
          k[(t * hkv + h) * d + i] = kv.key(h, t, i);
          v[(t * hkv + h) * d + i] = kv.value(h, t, i);
        }
    cache.append(k.data(), v.data(), n);
  }
  cfg.kind = AttentionKind::kRetro;
  auto cpu = make_attention(cfg, shape);
  cpu->on_prefill(cache);
  std::vector<float> out_cpu(q.size());
  cpu->decode(cache, q.data(), out_cpu.data());
  cfg.kind = AttentionKind::kFull;
  auto full = make_attention(cfg, shape);
  std::vector<float> out_full(q.size());
  full->decode(cache, q.data(), out_full.data());

  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v), dq = gputest::upload(q);
  {
    cuda::RetroLayer layer(shape, cfg);
    auto dout = gputest::poisoned(q.size());
    layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), n, n);
    layer.decode(dq.as<float>(), dout.as<float>());
    const auto out_gpu = gputest::download_f32(dout, q.size());

    const auto g_vs_full = gputest::compare(out_gpu, out_full), c_vs_full = gputest::compare(out_cpu, out_full);
    const auto g_vs_c = gputest::compare(out_gpu, out_cpu);
    EXPECT_EQ(g_vs_full.unwritten, 0);
    double jacc = 0;
    for (int h = 0; h < hkv; ++h) {
      std::vector<uint8_t> zones;
      ASSERT_TRUE(cpu->last_zones(h, zones));
      std::vector<int32_t> cpu_exact;
      for (int64_t t = 0; t < n; ++t)
        if (zones[t] == AttentionMethod::kZoneExact) cpu_exact.push_back(int32_t(t));
      jacc = std::max(jacc, gputest::jaccard_distance(cpu_exact, layer.debug_state(h).token_list));
    }
    std::printf("[wave parity] retro n=%lld: nmse vs full gpu %.3e cpu %.3e, gpu vs cpu %.3e; exact-token "
                "Jaccard distance %.3f\n",
                (long long)n, g_vs_full.nmse, c_vs_full.nmse, g_vs_c.nmse, jacc);
    // Derivation: both methods miss the same kind of mass (ignored clusters, Jensen's lower bound in the
    // estimation zone); with different but equally good clusters their errors are of one size. 2x plus
    // an absolute floor of 1e-4 (below which both are "exact enough" and the ratio is noise).
    EXPECT_LT(g_vs_full.nmse, 2.0 * c_vs_full.nmse + 1e-4);
    // Most exact tokens in common. The k-means' int8 assignment moves 9-12% of the tokens away from the CPU's
    // f32 clusters (test_cuda_kmeans.cpp FullIterationsCloseToCpu), at an equal objective, so the selected
    // tokens overlap the CPU's only in part (0.53 at n = 8000, with the GPU's error against full attention
    // below the CPU's: 0.256 against 0.265).
    EXPECT_LT(jacc, 0.6);
  }
}

}  // namespace
}  // namespace retroinfer
