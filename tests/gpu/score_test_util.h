// Shared by the score kernel tests (test_cuda_score_stream.cpp, test_cuda_score_q8.cpp): one score_clusters
// launch into poisoned outputs, returned as raw bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/kernels.h"
#include "gpu_test_util.h"

namespace retroinfer::gputest {

struct ScoreShape {
  int H, G, D, C;
};
// Device inputs; q8 / q8_scale: the int8 copies (both or neither).
struct ScoreInputs {
  const float* q = nullptr;
  const uint16_t* centroids = nullptr;
  const int* sizes = nullptr;
  const uint8_t* q8 = nullptr;
  const float* q8_scale = nullptr;
};
struct ScoreOut {
  std::vector<uint32_t> logits, partial, scores;  // raw bits; partial: (max, sum) pairs; scores: form only
};

// score_clusters of `variant` (early: early loads; form: the cooperative formation, scores returned; query_smem:
// ScoreParams::query_smem, the query staged in shared memory by the stream / tma / wide kernels).
inline ScoreOut run_score_kernel(const ScoreShape& s, const ScoreInputs& in, float scale, int variant, bool early,
                                 bool form, bool query_smem = true) {
  namespace cd = cuda::detail;
  const int blocks = cd::score_blocks(s.C, s.D, s.H);
  const size_t n_logits = size_t(s.H) * s.G * s.C, n_partial = size_t(s.H) * s.G * blocks * 2,
               n_scores = size_t(s.H) * s.C;
  auto dl = poisoned(n_logits), dp = poisoned(n_partial), dsc = poisoned(n_scores);
  cd::ScoreParams p;
  p.q = in.q;
  p.centroids_bf16 = in.centroids;
  p.centroids_q8 = in.q8;
  p.centroid_scale = in.q8_scale;
  p.sizes = in.sizes;
  p.logits = dl.as<float>();
  p.norm_partial = dp.as<float2>();
  p.num_heads = s.H;
  p.group = s.G;
  p.head_dim = s.D;
  p.num_clusters = s.C;
  p.scale = scale;
  p.early_loads = early;
  p.scores = form ? dsc.as<float>() : nullptr;
  p.variant = variant;
  p.query_smem = query_smem;
  cuda::synchronize();  // the poison memsets
  EXPECT_EQ(cd::score_clusters(p, nullptr), cudaSuccess) << cd::score_variant_name(variant);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cd::score_variant_name(variant);
  ScoreOut o;
  o.logits = download_bits(dl, n_logits);
  o.partial = download_bits(dp, n_partial);
  if (form) o.scores = download_bits(dsc, n_scores);
  return o;
}

}  // namespace retroinfer::gputest
