// Shared by the score kernel tests (test_cuda_score_bf16.cpp, test_cuda_score_int8.cpp): one score_clusters
// launch into poisoned outputs, returned as raw bits, and the host checks of its normaliser partials.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
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

// score_clusters into poisoned outputs (form: the scores formed by the same grid, returned too).
inline ScoreOut run_score_kernel(const ScoreShape& s, const ScoreInputs& in, float scale, bool form) {
  namespace cd = cuda::detail;
  const int blocks = cd::score_blocks(s.C, s.D, s.H);
  const size_t n_logits = size_t(s.H) * s.G * s.C, n_partial = size_t(s.H) * s.G * blocks * 2,
               n_scores = size_t(s.H) * s.C;
  auto dl = poisoned(std::max<size_t>(n_logits, 1)), dp = poisoned(n_partial), dsc = poisoned(std::max<size_t>(n_scores, 1));
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
  p.scores = form ? dsc.as<float>() : nullptr;
  cuda::synchronize();  // the poison memsets
  EXPECT_EQ(cd::score_clusters(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ScoreOut o;
  o.logits = download_bits(dl, n_logits);
  o.partial = download_bits(dp, n_partial);
  if (form) o.scores = download_bits(dsc, n_scores);
  return o;
}

// The normaliser partials of o against its own logits: CTA b of head h covers the clusters of its contiguous
// tile range (score_blocks CTAs per head, 16-cluster tiles split evenly); per query head its (max, sum) must be
// the range's largest logit exactly (-inf and sum 0 when every cluster of the range is empty or there is none)
// and the sum of e^{logit - max} over the range's finite logits within `rel` (the kernel's __expf and f32
// accumulation). Returns the worst relative error of the sums.
inline double expect_partials_match_logits(const ScoreShape& s, const ScoreOut& o, double rel) {
  const int blocks = cuda::detail::score_blocks(s.C, s.D, s.H);
  const int tiles = (s.C + 15) / 16, per_cta = (tiles + blocks - 1) / blocks;
  double worst = 0.0;
  for (int h = 0; h < s.H; ++h)
    for (int g = 0; g < s.G; ++g)
      for (int b = 0; b < blocks; ++b) {
        const int c0 = std::min(s.C, b * per_cta * 16), c1 = std::min(s.C, (b + 1) * per_cta * 16);
        const uint32_t* lg = o.logits.data() + (size_t(h) * s.G + g) * s.C;
        float mx = -INFINITY;
        for (int c = c0; c < c1; ++c) mx = std::max(mx, bits_to_f32(lg[c]));
        double sum = 0.0;
        if (mx != -INFINITY)
          for (int c = c0; c < c1; ++c) {
            const float l = bits_to_f32(lg[c]);
            if (l != -INFINITY) sum += std::exp(double(l) - double(mx));
          }
        const size_t at = ((size_t(h) * s.G + g) * blocks + b) * 2;
        const float got_m = bits_to_f32(o.partial[at]), got_s = bits_to_f32(o.partial[at + 1]);
        EXPECT_EQ(got_m, mx) << "partial max (" << h << ", " << g << ", " << b << ")";
        const double err = std::abs(double(got_s) - sum) / std::max(sum, 1e-30);
        if (mx == -INFINITY) {
          EXPECT_EQ(got_s, 0.0f) << "partial sum of an empty range (" << h << ", " << g << ", " << b << ")";
          continue;
        }
        worst = std::max(worst, err);
        EXPECT_LE(err, rel) << "partial sum (" << h << ", " << g << ", " << b << "): " << got_s << " vs " << sum;
        if (!(err <= rel) || got_m != mx) return worst;
      }
  return worst;
}

// Device copies of data starting `offset_bytes` past a 256-byte aligned allocation (offset 4: a base that is
// not 16-byte aligned). `base` keeps the allocation; the returned pointer is into it.
template <typename T>
const T* upload_at(const std::vector<T>& data, size_t offset_bytes, cuda::DeviceBuffer* base) {
  *base = cuda::DeviceBuffer(data.size() * sizeof(T) + offset_bytes + 16);
  auto* p = reinterpret_cast<T*>(static_cast<char*>(base->data()) + offset_bytes);
  EXPECT_EQ(cudaMemcpy(p, data.data(), data.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return p;
}

}  // namespace retroinfer::gputest
