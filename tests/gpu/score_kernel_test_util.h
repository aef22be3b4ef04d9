// Helpers of the score-kernel tests (test_cuda_score_stream.cpp: v1 / stream / tma; test_cuda_score_dyn.cpp:
// tmadyn): random inputs of one score_clusters call, one launch into poisoned outputs, raw-bit comparison.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backend/cuda/kernels.h"
#include "gpu_test_util.h"
#include "retroinfer/dtype.h"

namespace retroinfer::gputest {

struct KernelCase {
  int H, G, D, C;
  double empty;  // fraction of clusters with size 0 (1.0: every cluster of every head)
};

struct KernelInputs {
  std::vector<float> q;         // [H, G, D] f32
  std::vector<uint16_t> cent;   // [H, C, D] bf16
  std::vector<int32_t> sizes;   // [H, C]
  cuda::DeviceBuffer dq, dc, ds;
};

// q and centroids N(0, 1) (centroids rounded to bf16), sizes uniform in 1..60 or 0 with probability empty.
inline KernelInputs make_inputs(const KernelCase& kc, uint64_t seed) {
  KernelInputs in;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::uniform_int_distribution<int> su(1, 60);
  in.q.resize(size_t(kc.H) * kc.G * kc.D);
  for (auto& x : in.q) x = n01(rng);
  in.cent.resize(size_t(kc.H) * kc.C * kc.D);
  for (auto& x : in.cent) x = f32_to_bf16(n01(rng));
  in.sizes.resize(size_t(kc.H) * kc.C);
  for (auto& s : in.sizes) s = u01(rng) < kc.empty ? 0 : su(rng);
  in.dq = upload(in.q);
  in.dc = upload(in.cent);
  in.ds = upload(in.sizes);
  return in;
}

struct KernelOut {
  std::vector<uint32_t> logits, partial, scores;  // raw bits; partial: (max, sum) pairs [H, G, parts]
  int parts = 0;                                  // normaliser partials per (head, query head)
};

inline std::vector<uint32_t> download_bits(const cuda::DeviceBuffer& b, size_t count) {
  std::vector<uint32_t> out(count);
  b.download(out.data(), count * 4);
  return out;
}

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// The ScoreParams of one launch of `variant` over `in` into the given outputs (form: the cooperative
// formation into scores; tile_counter: tmadyn's per-head counter, null for the static takes).
inline cuda::detail::ScoreParams kernel_params(const KernelCase& kc, const KernelInputs& in, float scale, int variant,
                                               bool early, float* logits, float2* partial, float* scores,
                                               int* tile_counter) {
  cuda::detail::ScoreParams p;
  p.q = in.dq.as<float>();
  p.centroids_bf16 = in.dc.as<uint16_t>();
  p.sizes = in.ds.as<int>();
  p.logits = logits;
  p.norm_partial = partial;
  p.num_heads = kc.H;
  p.group = kc.G;
  p.head_dim = kc.D;
  p.num_clusters = kc.C;
  p.scale = scale;
  p.early_loads = early;
  p.scores = scores;
  p.variant = variant;
  p.tile_counter = tile_counter;
  return p;
}

// One score_clusters launch of `variant` into poisoned outputs (form: the cooperative formation; the
// partials sized by score_norm_parts for the variant).
inline KernelOut run_kernel(const KernelCase& kc, const KernelInputs& in, float scale, int variant, bool early,
                            bool form, int* tile_counter = nullptr) {
  namespace cd = cuda::detail;
  KernelOut o;
  o.parts = cd::score_norm_parts(kc.C, kc.D, kc.H, variant);
  const size_t n_logits = size_t(kc.H) * kc.G * kc.C, n_partial = size_t(kc.H) * kc.G * o.parts * 2,
               n_scores = size_t(kc.H) * kc.C;
  auto dl = poisoned(n_logits), dp = poisoned(n_partial > 0 ? n_partial : 1), dsc = poisoned(n_scores);
  const cd::ScoreParams p = kernel_params(kc, in, scale, variant, early, dl.as<float>(), dp.as<float2>(),
                                          form ? dsc.as<float>() : nullptr, tile_counter);
  cuda::synchronize();  // the poison memsets
  EXPECT_EQ(cd::score_clusters(p, nullptr), cudaSuccess) << cd::score_variant_name(variant);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << cd::score_variant_name(variant);
  o.logits = download_bits(dl, n_logits);
  o.partial = download_bits(dp, n_partial);
  if (form) o.scores = download_bits(dsc, n_scores);
  return o;
}

inline constexpr uint32_t kPoisonBits = 0xffffffffu;  // poisoned(): 0xff bytes (a NaN no kernel writes)

// Bitwise equality of two outputs, and none of `a` left poisoned; returns the first mismatch or -1.
inline int64_t first_difference(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b, int64_t* unwritten) {
  *unwritten = 0;
  int64_t first = -1;
  for (size_t i = 0; i < a.size(); ++i) {
    *unwritten += a[i] == kPoisonBits;
    if (first < 0 && (i >= b.size() || a[i] != b[i])) first = int64_t(i);
  }
  if (first < 0 && a.size() != b.size()) first = int64_t(a.size());
  return first;
}

}  // namespace retroinfer::gputest
