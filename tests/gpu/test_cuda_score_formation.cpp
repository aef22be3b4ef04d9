// The three places the decode forms the selection's scores, chosen by shape (layer_common.h ZoneDecodeArgs):
// the score grid after its grid-wide barrier (score_clusters with ScoreParams::scores, where the one-wave grid
// fits at once), their own grid (form_scores) and the bins selection (select_and_expand_bins with group > 0,
// where G <= 4 and C % 4 == 0). On the same score kernel's logits and normaliser partials the three must give
// the same scores bit for bit (they all call select_common.cuh form_head_score's arithmetic; the bins
// selection's quad path takes the exponential's hardware instruction alone where __expf would, and __expf's own
// path item by item below), so that the shape never changes a selection. Queries scaled up (gain 30, 300) put
// most logits far (> 87) below their head's largest: tiny terms and scores below 2^-100. Each head's finite
// scores sum to G (one softmax per query head). One "[score formation]" line per case.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/kernels.h"

namespace retroinfer {
namespace {

namespace cd = cuda::detail;

struct FormCase {
  int heads, group, head_dim, clusters;
  float gain;  // query scale (N(0, gain^2) entries)
};

std::vector<float> download_scores(const cuda::DeviceBuffer& b, size_t n) {
  std::vector<float> out(n);
  b.download(out.data(), n * 4);
  return out;
}

int64_t first_difference(const std::vector<float>& a, const std::vector<float>& b) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], 4) != 0) return int64_t(i);
  return -1;
}

void formation_case(const FormCase& fc, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "H=" << fc.heads << " G=" << fc.group << " D=" << fc.head_dim
                                  << " C=" << fc.clusters << " gain=" << fc.gain << " seed=" << seed);
  const int H = fc.heads, G = fc.group, D = fc.head_dim, C = fc.clusters;
  const size_t rows = size_t(H) * C, items = size_t(H) * C;
  cuda::DeviceBuffer centroids(rows * D * 2), q(size_t(H) * G * D * 4);
  cuda::fill_random_bf16(centroids.as<uint16_t>(), rows * D, seed, 1.0f);
  cuda::fill_random_f32(q.as<float>(), size_t(H) * G * D, seed + 1, fc.gain);
  std::mt19937_64 rng(seed + 2);
  std::uniform_int_distribution<int> size_of(1, 40);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  std::vector<int> sizes(items);
  for (int& s : sizes) s = u01(rng) < 0.05f ? 0 : size_of(rng);  // empty clusters: logit -inf, score -inf
  auto d_sizes = gputest::upload(sizes);
  const int parts = cd::score_blocks(C, D, H);
  cuda::DeviceBuffer logits(size_t(H) * G * C * 4), partials(size_t(H) * G * parts * 8);
  cuda::DeviceBuffer in_grid(items * 4), own_grid(items * 4), in_select(items * 4);
  for (auto* b : {&in_grid, &own_grid, &in_select}) b->fill_bytes(0xff);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cuda::StreamHandle stream;
  const auto st = static_cast<cudaStream_t>(stream.get());

  // The score kernel, forming the scores in its grid where it fits at once.
  const bool grid_forms = cd::score_form_fits(C, D, H);
  cd::ScoreParams sp;
  sp.q = q.as<float>();
  sp.centroids_bf16 = centroids.as<uint16_t>();
  sp.sizes = d_sizes.as<int>();
  sp.logits = logits.as<float>();
  sp.norm_partial = partials.as<float2>();
  sp.num_heads = H;
  sp.group = G;
  sp.head_dim = D;
  sp.num_clusters = C;
  sp.scale = 1.0f / std::sqrt(float(D));
  sp.scores = grid_forms ? in_grid.as<float>() : nullptr;
  ASSERT_EQ(cd::score_clusters(sp, st), cudaSuccess);

  // Their own grid.
  cd::FormScoresParams fp;
  fp.logits = sp.logits;
  fp.norm_partial = sp.norm_partial;
  fp.norm_parts = parts;
  fp.scores = own_grid.as<float>();
  fp.num_heads = H;
  fp.group = G;
  fp.num_items = C;
  ASSERT_EQ(cd::form_scores(fp, st), cudaSuccess);

  // The bins selection, over clusters of kPer index tokens each as the layers give them (CSR offsets and
  // members); only its scores are compared here.
  const bool select_forms = G <= 4 && C % 4 == 0 && C <= cd::kSelectGridMinItems;
  constexpr int kPer = 16;
  const int64_t n_idx = int64_t{C} * kPer;
  const int k_r = std::max(1, C / 20), k_e = std::max(1, C / 5);
  cuda::DeviceBuffer ret(size_t(H) * k_r * 4), est(size_t(H) * k_e * 4), list(size_t(H) * k_r * kPer * 4),
      count(size_t(H) * 4), scratch(size_t(H) * (k_r + 1) * 4), d_offsets, d_members;
  if (select_forms) {
    std::vector<int> offsets(items + 1);
    std::vector<uint32_t> members(size_t(H) * n_idx);
    for (int h = 0; h < H; ++h) {
      for (int c = 0; c < C; ++c) offsets[size_t(h) * C + c] = int(h * n_idx + int64_t{c} * kPer);
      for (int64_t j = 0; j < n_idx; ++j) members[size_t(h) * n_idx + j] = uint32_t(j);
    }
    offsets[items] = int(H * n_idx);
    d_offsets = gputest::upload(offsets);
    d_members = gputest::upload(members);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the uploads before the created stream's kernels
    cd::SelectParams se;
    se.logits = sp.logits;
    se.norm_partial = sp.norm_partial;
    se.norm_parts = parts;
    se.scores = in_select.as<float>();
    se.num_heads = H;
    se.group = G;
    se.num_items = C;
    se.k_retrieval = k_r;
    se.k_estimation = k_e;
    se.retrieval_ids = ret.as<int>();
    se.estimation_ids = est.as<int>();
    se.offsets = d_offsets.as<int>();
    se.members = d_members.as<uint32_t>();
    se.n_idx = n_idx;
    se.idx_begin = 0;
    se.num_tokens = n_idx;
    se.token_list = list.as<int>();
    se.token_count = count.as<int>();
    se.scan_scratch = scratch.as<int>();
    se.list_stride = int64_t{k_r} * kPer;
    ASSERT_EQ(cd::select_and_expand_bins(se, st), cudaSuccess);
  }
  ASSERT_EQ(cudaStreamSynchronize(st), cudaSuccess);

  const std::vector<float> b = download_scores(own_grid, items);
  int finite = 0, tiny = 0;
  for (int h = 0; h < H; ++h) {
    double sum = 0.0;
    for (int c = 0; c < C; ++c) {
      const float x = b[size_t(h) * C + c];
      ASSERT_FALSE(std::isnan(x)) << "score " << c << " of head " << h << " not written";
      ASSERT_EQ(x == -INFINITY, sizes[size_t(h) * C + c] == 0) << "score " << c << " of head " << h;
      if (x == -INFINITY) continue;
      ++finite;
      tiny += x < 0x1p-100f;
      sum += x;
    }
    EXPECT_NEAR(sum, double(G), 1e-4 * G) << "head " << h << ": the scores of G softmaxes";
  }
  if (fc.gain > 100.0f) {
    EXPECT_GT(tiny, finite / 10) << "the scaled query leaves too few tiny scores to test the tiny terms";
  }
  if (grid_forms) {
    EXPECT_EQ(first_difference(download_scores(in_grid, items), b), -1) << "score grid vs form_scores";
  }
  if (select_forms) {
    EXPECT_EQ(first_difference(download_scores(in_select, items), b), -1) << "bins selection vs form_scores";
  }
  std::printf("[score formation] H=%d G=%d D=%d C=%d gain %.0f: form_scores%s%s identical%s; %d of %d finite scores "
              "below 2^-100\n",
              H, G, D, C, fc.gain, grid_forms ? ", score grid" : "", select_forms ? ", bins selection" : "",
              ::testing::Test::HasFailure() ? " NOT (see failures)" : "", tiny, finite);
}

TEST(CudaScoreFormation, SameScoresWherever) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 1700;
  formation_case({8, 4, 128, 8188, 1.0f}, seed++);   // 128K batch 1 (Llama-3-8B: 8 KV heads): all three
  formation_case({32, 4, 128, 8188, 1.0f}, seed++);  // 128K batch 4
  formation_case({6, 3, 128, 1000, 1.0f}, seed++);   // G 3
  formation_case({5, 1, 64, 4096, 1.0f}, seed++);    // G 1, D 64
  formation_case({4, 8, 64, 2051, 1.0f}, seed++);    // G 8, C % 4 != 0: score grid and form_scores only
  formation_case({3, 4, 128, 1025, 1.0f}, seed++);   // C % 4 != 0, a score block of one item
  formation_case({900, 1, 64, 40, 1.0f}, seed++);    // 900 one-CTA heads: the score grid does not fit
}

// Tiny terms: most logits > 87 below their head's largest (exp flushes them, the scores span many octaves).
TEST(CudaScoreFormation, TinyTerms) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 1800;
  for (const float gain : {30.0f, 300.0f}) {
    formation_case({4, 4, 128, 5000, gain}, seed++);
    formation_case({4, 2, 64, 2048, gain}, seed++);
    formation_case({2, 8, 128, 3001, gain}, seed++);
  }
}

}  // namespace
}  // namespace retroinfer
