// Retrieval budgets by layer on the GPU (docs/wave-index.md, "Retrieval budgets by layer"): RetroLayer's
// calibration kernels against host sums over the same index, and a CUDA session (and a fork of a full
// prefill) giving its layers the calibration's multiples, as the CPU runner does.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "cuda_model_test_util.h"
#include "gpu_test_util.h"
#include "index/layer_budgets.h"
#include "kernels/layer_budget_kernels.h"
#include "retroinfer/cuda_model.h"
#include "retroinfer/model.h"

namespace retroinfer {
namespace {

using index::kLayerBudgetMultipliers;

// The ranking kernel against a host sort: each row's mass past its counts[m] heaviest clusters, with ties,
// zeros and a row of one value; a call ranking fewer rows than its workspace holds.
TEST(CudaLayerBudgets, RankingKernelSumsWhatEachRetrievalSizeLeavesOut) {
  RETROINFER_REQUIRE_GPU();
  const int rows = 5, C = 3001;
  std::mt19937 rng(7);
  std::exponential_distribution<float> heavy(3.0f);
  std::vector<float> mass(size_t(rows) * C);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < C; ++j) {
      float x = heavy(rng) * 1e-3f;
      if (r == 1 && j % 3 == 0) x = 2e-3f;  // ties
      if (r == 2 && j % 2 == 0) x = 0.0f;   // zeros
      if (r == 3) x = 1.0f / C;             // one value
      mass[size_t(r) * C + j] = x;
    }
  const int counts[cuda::detail::kCalibrationMultiples] = {1, 7, 60, 61, 300, 1000, 2999, 3001};
  auto dmass = gputest::upload(mass);
  const size_t temp = cuda::detail::calibration_rank_temp_bytes(rows, C);
  cuda::DeviceBuffer keys(size_t(rows) * C * 8), sorted(size_t(rows) * C * 8), tmp(std::max<size_t>(temp, 1)),
      missed(size_t(rows) * cuda::detail::kCalibrationMultiples * 8);
  for (int first : {0, 2}) {  // all rows; then rows 2.. alone in a workspace sized for all
    cuda::detail::CalibrationRankParams p;
    p.group_mass = dmass.as<float>() + size_t(first) * C;
    p.rows = rows - first;
    p.max_rows = rows;
    p.clusters = C;
    std::copy(std::begin(counts), std::end(counts), p.counts);
    p.keys = keys.as<uint64_t>();
    p.keys_sorted = sorted.as<uint64_t>();
    p.sort_temp = tmp.data();
    p.sort_temp_bytes = temp;
    p.missed = missed.as<double>();
    ASSERT_EQ(cuda::detail::calibration_rank(p, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<double> got(size_t(p.rows) * cuda::detail::kCalibrationMultiples);
    missed.download(got.data(), got.size() * 8);
    for (int r = first; r < rows; ++r) {
      std::vector<double> row(mass.begin() + size_t(r) * C, mass.begin() + size_t(r + 1) * C);
      std::sort(row.begin(), row.end(), std::greater<double>());
      for (int m = 0; m < cuda::detail::kCalibrationMultiples; ++m) {
        const double want = std::accumulate(row.begin() + counts[m], row.end(), 0.0);
        EXPECT_NEAR(got[size_t(r - first) * cuda::detail::kCalibrationMultiples + m], want, 1e-12 + 1e-9 * want)
            << "row " << r << " count " << counts[m];
      }
    }
  }
  cuda::detail::CalibrationRankParams too_many;
  too_many.rows = 3;
  too_many.max_rows = 2;
  too_many.clusters = C;
  EXPECT_EQ(cuda::detail::calibration_rank(too_many, nullptr), cudaErrorInvalidValue);
}

// Exact softmax of each calibration query over its visible keys, each cluster's mass summed over the GQA group
// from the layer's own CSR, and add_missed_mass: what the kernels compute, in f64 on the host.
TEST(CudaLayerBudgets, CalibrationMatchesHostSumsOverTheIndex) {
  RETROINFER_REQUIRE_GPU();
  const int H = 2, G = 4, d = 128, rows = 6;
  const int64_t n = 3000;
  auto kv = gputest::make_kv(H, n, n, d, 131);
  std::vector<float> q;
  for (int i = 0; i < rows; ++i) {
    const std::vector<float> one = gputest::make_q(kv, G, 200 + i);
    q.insert(q.end(), one.begin(), one.end());
  }
  AttentionConfig cfg;
  cfg.segment_tokens = 1024;
  cfg.retrieval_fraction = 0.02;
  cuda::RetroLayer layer(AttentionShape{H * G, H, d}, cfg);
  layer.set_outlier_zone(true);
  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v), dq = gputest::upload(q);
  EXPECT_TRUE(layer.calibration_missed_mass(dq.as<float>(), rows).empty());  // nothing built
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), n, n);
  const std::vector<double> got = layer.calibration_missed_mass(dq.as<float>(), rows);
  ASSERT_EQ(got.size(), kLayerBudgetMultipliers.size());

  const double scale = 1.0 / std::sqrt(double(d));
  const int64_t begin = layer.indexed_begin();
  std::vector<double> want(kLayerBudgetMultipliers.size(), 0.0);
  for (int i = 0; i < rows; ++i) {
    const int64_t pos = n - rows + i;
    for (int h = 0; h < H; ++h) {
      const cuda::RetroDebugState st = layer.debug_state(h);
      const int C = static_cast<int>(st.sizes.size());
      std::vector<float> mass(C, 0.0f);
      for (int g = 0; g < G; ++g) {
        const float* qh = q.data() + (size_t(i) * H * G + size_t(h) * G + g) * d;
        std::vector<double> p(pos + 1);
        double mx = -INFINITY, z = 0.0;
        for (int64_t t = 0; t <= pos; ++t) {
          double s = 0.0;
          for (int e = 0; e < d; ++e) s += double(qh[e]) * kv.key(h, t, e);
          mx = std::max(mx, p[t] = s * scale);
        }
        for (int64_t t = 0; t <= pos; ++t) z += (p[t] = std::exp(p[t] - mx));
        for (int c = 0; c < C; ++c) {
          double m = 0.0;
          for (int32_t e = st.offsets[c]; e < st.offsets[c + 1]; ++e) m += p[begin + st.members[e]];
          mass[c] += static_cast<float>(m / z);
        }
      }
      index::add_missed_mass(mass.data(), C, cfg, want.data());
    }
  }
  for (size_t m = 0; m < want.size(); ++m) {
    want[m] /= double(rows) * H * G;
    EXPECT_NEAR(got[m], want[m], 2e-4) << "multiplier " << kLayerBudgetMultipliers[m];
    if (m > 0) {
      EXPECT_LE(got[m], got[m - 1] + 1e-9);
    }
  }
  EXPECT_GT(got.front(), got.back());
  // The multiple scales the retrieval zone; a new build restores the nominal one.
  const int nominal = layer.n_retrieval();
  layer.set_retrieval_multiplier(3.0);
  EXPECT_GE(layer.n_retrieval(), 3 * nominal - 2);
  auto out = gputest::poisoned(size_t(H) * G * d);
  layer.decode(dq.as<float>(), out.as<float>());
  cuda::synchronize();
  for (float x : gputest::download_f32(out, size_t(H) * G * d)) ASSERT_TRUE(std::isfinite(x));
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), n, n);
  EXPECT_EQ(layer.n_retrieval(), nominal);
  EXPECT_THROW(layer.set_retrieval_multiplier(-1.0), Error);
}

TEST(CudaLayerBudgets, SessionAndAForkOfAFullPrefillCalibrateTheirLayers) {
  RETROINFER_REQUIRE_GPU();
  // A two-layer random-weight model of head_dim 64 (the tiny fixtures' head_dim 16 has no CUDA kernels).
  const ModelConfig c = gputest::synthetic_config(64);
  gputest::MemoryModelFile f(c, 19);
  const std::unique_ptr<Model> cpu = Model::load(f);
  auto gm = cuda::CudaModel::upload(*cpu, cuda::WeightType::kBf16);
  cuda::CudaSessionOptions o;
  o.attention.kind = AttentionKind::kRetro;
  o.attention.tokens_per_cluster = 2;
  o.attention.window_tokens = 16;
  o.attention.retrieval_fraction = 0.05;
  o.attention.layer_budget_queries = 16;
  o.max_context = 700;
  o.prefill_chunk = 280;  // the kept 64 queries span chunks (the last holds 40 rows)
  const std::vector<int32_t> prompt = gputest::random_tokens(600, c.vocab_size, 23);
  cuda::CudaSession s(*gm, o, 1);
  s.prefill({prompt});
  const std::vector<double> m = s.layer_budget_multipliers();
  ASSERT_EQ(m.size(), size_t(cpu->config().num_layers));
  EXPECT_LE(std::accumulate(m.begin(), m.end(), 0.0) / double(m.size()), 1.0 + 1e-12);
  for (double x : m)
    EXPECT_NE(std::find(kLayerBudgetMultipliers.begin(), kLayerBudgetMultipliers.end(), x), kLayerBudgetMultipliers.end());
  std::vector<float> logits(cpu->config().vocab_size);
  const int32_t tok = 1;
  s.decode(std::span<const int32_t>(&tok, 1), logits);
  for (float x : logits) ASSERT_TRUE(std::isfinite(x));

  cuda::CudaSessionOptions full = o;
  full.attention.kind = AttentionKind::kFull;
  full.attention.layer_budget_queries = 0;
  cuda::CudaSession base(*gm, full, 1);
  base.prefill({prompt});
  EXPECT_TRUE(base.layer_budget_multipliers().empty());
  EXPECT_EQ(base.fork(o.attention)->layer_budget_multipliers(), m);  // same prompt, same K/V and queries
  o.attention.layer_budget_queries = 0;
  EXPECT_TRUE(base.fork(o.attention)->layer_budget_multipliers().empty());
}

}  // namespace
}  // namespace retroinfer
