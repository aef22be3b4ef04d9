// Segmented spherical k-means (see kmeans.h for the algorithm and its contract).
#include "index/kmeans.h"

#include <cblas.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <vector>

#include "retroinfer/error.h"
#include "retroinfer/wave_counts.h"

namespace retroinfer::index {
namespace {

// Rows per sgemm block: scores of one block take kScoreBlockFloats floats (4 MiB, so they stay in the
// 32 MiB L3 between sgemm writing them and the argmax reading them), but never fewer than kMinBlockRows rows:
// sgemm packs the whole centroid matrix once per call, which costs as much as the multiply itself when a
// call has only a few dozen rows. Memory stays bounded: at most kMinBlockRows * num_clusters floats
// (8 MiB at 8192 clusters).
constexpr int64_t kScoreBlockFloats = int64_t{1} << 20;
constexpr int64_t kMinBlockRows = 256;
// Work (scores, or member rows x head_dim) below which a loop stays on one thread: waking the team costs more.
constexpr int64_t kParallelMinScores = int64_t{1} << 16;

// First index of the maximum of s[0, k). Eight lanes (lane l sees j = l mod 8) each keep the first
// maximum of their subsequence; the lanes are then reduced by (value desc, index asc), which gives the
// first maximum overall, and the tail (indices above every lane's) is scanned with strict >. The SSE2
// form (x86-64 baseline) halves the time of the plain loop, which GCC does not vectorise (dev machine:
// ~0.55 against ~1.0 ns per score), and the argmax reads n * num_clusters scores per iteration.
int32_t argmax_first(const float* s, int k) {
  constexpr int kLanes = 8;
  if (k < kLanes) {
    int best = 0;
    for (int j = 1; j < k; ++j)
      if (s[j] > s[best]) best = j;
    return best;
  }
  float bv[kLanes];
  int32_t bi[kLanes];
  int j = kLanes;
#if defined(__SSE2__)
  __m128 bv0 = _mm_loadu_ps(s), bv1 = _mm_loadu_ps(s + 4);
  __m128i bi0 = _mm_setr_epi32(0, 1, 2, 3), bi1 = _mm_setr_epi32(4, 5, 6, 7);
  __m128i i0 = bi0, i1 = bi1;
  const __m128i step = _mm_set1_epi32(kLanes);
  for (; j + kLanes <= k; j += kLanes) {
    i0 = _mm_add_epi32(i0, step);
    i1 = _mm_add_epi32(i1, step);
    const __m128 v0 = _mm_loadu_ps(s + j), v1 = _mm_loadu_ps(s + j + 4);
    const __m128 g0 = _mm_cmpgt_ps(v0, bv0), g1 = _mm_cmpgt_ps(v1, bv1);
    bv0 = _mm_or_ps(_mm_and_ps(g0, v0), _mm_andnot_ps(g0, bv0));
    bv1 = _mm_or_ps(_mm_and_ps(g1, v1), _mm_andnot_ps(g1, bv1));
    const __m128i m0 = _mm_castps_si128(g0), m1 = _mm_castps_si128(g1);
    bi0 = _mm_or_si128(_mm_and_si128(m0, i0), _mm_andnot_si128(m0, bi0));
    bi1 = _mm_or_si128(_mm_and_si128(m1, i1), _mm_andnot_si128(m1, bi1));
  }
  _mm_storeu_ps(bv, bv0);
  _mm_storeu_ps(bv + 4, bv1);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(bi), bi0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(bi + 4), bi1);
#else
  for (int l = 0; l < kLanes; ++l) {
    bv[l] = s[l];
    bi[l] = l;
  }
  for (; j + kLanes <= k; j += kLanes)
    for (int l = 0; l < kLanes; ++l)
      if (s[j + l] > bv[l]) {
        bv[l] = s[j + l];
        bi[l] = j + l;
      }
#endif
  int32_t best = bi[0];
  float best_v = bv[0];
  for (int l = 1; l < kLanes; ++l)
    if (bv[l] > best_v || (bv[l] == best_v && bi[l] < best)) {
      best_v = bv[l];
      best = bi[l];
    }
  for (; j < k; ++j)
    if (s[j] > best_v) {
      best_v = s[j];
      best = j;
    }
  return best;
}

// assign[i] = base + argmax_j x_i . c_j for the n rows of x against the k rows of c.
// x: [n, d], c: [k, d], f32 row-major; scratch grows to hold one block of scores.
void assign_rows(const float* x, int64_t n, const float* c, int k, int d, int32_t base, int32_t* assign,
                 std::vector<float>& scratch) {
  if (n == 0) return;
  const int64_t block = std::min<int64_t>(n, std::max<int64_t>(kMinBlockRows, kScoreBlockFloats / k));
  scratch.resize(static_cast<size_t>(block) * k);
  for (int64_t r0 = 0; r0 < n; r0 += block) {
    const int64_t b = std::min(block, n - r0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(b), k, d, 1.0f, x + r0 * d, d, c, d,
                0.0f, scratch.data(), k);
    const float* s = scratch.data();
    // The rows' argmaxes over the threads too: OpenBLAS threads only the sgemm.
#pragma omp parallel for schedule(static) if (b * k >= kParallelMinScores)
    for (int64_t i = 0; i < b; ++i) assign[r0 + i] = base + argmax_first(s + i * k, k);
  }
}

// CSR grouping of n tokens by local cluster id (assign[i] - base, in [0, k)); members ascending inside a
// cluster (counting sort, stable).
void group_by_cluster(const int32_t* assign, int64_t n, int32_t base, int k, std::vector<int32_t>& offsets,
                      std::vector<int32_t>& members) {
  offsets.assign(static_cast<size_t>(k) + 1, 0);
  for (int64_t i = 0; i < n; ++i) ++offsets[assign[i] - base + 1];
  for (int j = 0; j < k; ++j) offsets[j + 1] += offsets[j];
  members.resize(n);
  std::vector<int32_t> fill(offsets.begin(), offsets.end() - 1);
  for (int64_t i = 0; i < n; ++i) members[fill[assign[i] - base]++] = static_cast<int32_t>(i);
}

enum class Update { kSpherical, kPlainMean };

// Recomputes the k centroids c (rows of [k, d]) from the grouped rows of x ([*, d]): the normalised sum
// (spherical) or the mean (plain). An empty cluster, or a spherical one whose members sum to zero, keeps
// its centroid. Sums in double: a cluster can hold thousands of tokens.
void update_centroids(const float* x, int d, int k, const std::vector<int32_t>& offsets,
                      const std::vector<int32_t>& members, Update mode, float* c) {
  // Clusters over the threads: each sums its own members, so the result does not depend on the thread count.
#pragma omp parallel if (static_cast<int64_t>(members.size()) * d >= kParallelMinScores)
  {
    std::vector<double> sum(d);
#pragma omp for schedule(dynamic, 64)
    for (int j = 0; j < k; ++j) {
      const int32_t b = offsets[j], e = offsets[j + 1];
      if (b == e) continue;
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int32_t m = b; m < e; ++m) {
        const float* row = x + static_cast<int64_t>(members[m]) * d;
        for (int i = 0; i < d; ++i) sum[i] += row[i];
      }
      double div = e - b;
      if (mode == Update::kSpherical) {
        double nrm = 0.0;
        for (int i = 0; i < d; ++i) nrm += sum[i] * sum[i];
        if (!(nrm > 0.0)) continue;
        div = std::sqrt(nrm);
      }
      float* cj = c + static_cast<int64_t>(j) * d;
      for (int i = 0; i < d; ++i) cj[i] = static_cast<float>(sum[i] / div);
    }
  }
}

void check_params(const float* keys, const float* values, int64_t n, int head_dim, const KMeansParams& p,
                  const char* where) {
  RETROINFER_CHECK(head_dim > 0, where, ": head_dim must be positive, got ", head_dim);
  RETROINFER_CHECK(n >= 0 && n <= INT32_MAX, where, ": token count must be in [0, 2^31), got ", n);
  RETROINFER_CHECK(n == 0 || (keys != nullptr && values != nullptr), where, ": null keys or values for ", n,
                   " tokens");
  RETROINFER_CHECK(p.tokens_per_cluster >= 1, where, ": tokens_per_cluster must be >= 1, got ",
                   p.tokens_per_cluster);
  RETROINFER_CHECK(p.segment_tokens >= 1, where, ": segment_tokens must be >= 1, got ", p.segment_tokens);
  RETROINFER_CHECK(p.segment_iters >= 0 && p.global_iters >= 0, where,
                   ": iteration counts must be >= 0, got segment_iters ", p.segment_iters, " and global_iters ",
                   p.global_iters);
}

// The whole algorithm for given segments: segment s covers tokens [starts[s], starts[s+1]) and gets
// clusters[s] clusters (1 <= clusters[s] <= its length).
ClusterIndex run_kmeans(const float* keys, const float* values, int64_t n, int d, const std::vector<int64_t>& starts,
                        const std::vector<int>& clusters, int segment_iters, int global_iters) {
  ClusterIndex ci;
  ci.head_dim = d;
  int64_t total = 0;
  for (int k : clusters) total += k;
  RETROINFER_CHECK(total <= INT32_MAX, "k-means: too many clusters (", total, ")");
  const int num_clusters = static_cast<int>(total);
  ci.num_clusters = num_clusters;
  if (n == 0) {
    ci.offsets.assign(1, 0);
    return ci;
  }

  // 1. Centre the keys.
  std::vector<double> mu_acc(d, 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < d; ++i) mu_acc[i] += keys[t * d + i];
  std::vector<float> mu(d);
  for (int i = 0; i < d; ++i) mu[i] = static_cast<float>(mu_acc[i] / static_cast<double>(n));
  std::vector<float> x(static_cast<size_t>(n) * d);  // [n, d] centred keys
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < d; ++i) x[t * d + i] = keys[t * d + i] - mu[i];

  std::vector<float> c(static_cast<size_t>(num_clusters) * d);  // [num_clusters, d] centred centroids
  std::vector<int32_t> assign(n);
  std::vector<float> scratch;
  std::vector<int32_t> offsets, members;

  // 2-3. Spherical iterations inside each segment.
  int32_t base = 0;
  for (size_t s = 0; s + 1 < starts.size(); ++s) {
    const int64_t b = starts[s], len = starts[s + 1] - b;
    const int k = clusters[s];
    const float* xs = x.data() + b * d;
    float* cs = c.data() + static_cast<int64_t>(base) * d;
    for (int j = 0; j < k; ++j) {
      const float* row = xs + (static_cast<int64_t>(j) * len / k) * d;
      double nrm = 0.0;
      for (int i = 0; i < d; ++i) nrm += static_cast<double>(row[i]) * row[i];
      const double inv = nrm > 0.0 ? 1.0 / std::sqrt(nrm) : 0.0;
      for (int i = 0; i < d; ++i) cs[static_cast<int64_t>(j) * d + i] = static_cast<float>(row[i] * inv);
    }
    for (int it = 0; it < segment_iters; ++it) {
      assign_rows(xs, len, cs, k, d, base, assign.data() + b, scratch);
      group_by_cluster(assign.data() + b, len, base, k, offsets, members);
      update_centroids(xs, d, k, offsets, members, Update::kSpherical, cs);
    }
    if (segment_iters == 0 && global_iters == 0) assign_rows(xs, len, cs, k, d, base, assign.data() + b, scratch);
    base += k;
  }

  // 4. Global iterations over every cluster (plain means).
  for (int it = 0; it < global_iters; ++it) {
    assign_rows(x.data(), n, c.data(), num_clusters, d, 0, assign.data(), scratch);
    group_by_cluster(assign.data(), n, 0, num_clusters, offsets, members);
    update_centroids(x.data(), d, num_clusters, offsets, members, Update::kPlainMean, c.data());
  }

  // 5. Final membership (the last assignment), sizes, value sums, de-centred centroids.
  group_by_cluster(assign.data(), n, 0, num_clusters, ci.offsets, ci.members);
  ci.assignment = std::move(assign);
  ci.sizes.resize(num_clusters);
  ci.value_sums.assign(static_cast<size_t>(num_clusters) * d, 0.0f);
#pragma omp parallel if (n * d >= kParallelMinScores)
  {
    std::vector<double> sum(d);
#pragma omp for schedule(dynamic, 64)
    for (int j = 0; j < num_clusters; ++j) {
      const int32_t b = ci.offsets[j], e = ci.offsets[j + 1];
      ci.sizes[j] = e - b;
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int32_t m = b; m < e; ++m) {
        const float* row = values + static_cast<int64_t>(ci.members[m]) * d;
        for (int i = 0; i < d; ++i) sum[i] += row[i];
      }
      float* vs = ci.value_sums.data() + static_cast<int64_t>(j) * d;
      for (int i = 0; i < d; ++i) vs[i] = static_cast<float>(sum[i]);
      float* cj = c.data() + static_cast<int64_t>(j) * d;
      for (int i = 0; i < d; ++i) cj[i] += mu[i];
    }
  }
  ci.centroids = std::move(c);
  return ci;
}

}  // namespace

ClusterIndex segmented_kmeans(const float* keys, const float* values, int64_t n, int head_dim,
                              const KMeansParams& p) {
  check_params(keys, values, n, head_dim, p, "segmented_kmeans");
  std::vector<int64_t> starts{0};
  std::vector<int> clusters;
  for (int64_t seg = 0; seg < segment_count(n, p.segment_tokens); ++seg) {
    const int64_t len = segment_length(n, p.segment_tokens, seg);
    clusters.push_back(segment_clusters(len, p.tokens_per_cluster));
    starts.push_back(starts.back() + len);
  }
  return run_kmeans(keys, values, n, head_dim, starts, clusters, p.segment_iters, p.global_iters);
}

ClusterIndex block_kmeans(const float* keys, const float* values, int64_t n, int head_dim, int num_clusters,
                          const KMeansParams& p) {
  check_params(keys, values, n, head_dim, p, "block_kmeans");
  RETROINFER_CHECK(num_clusters >= 1 && num_clusters <= n, "block_kmeans: num_clusters must be in [1, n = ", n,
                   "], got ", num_clusters);
  return run_kmeans(keys, values, n, head_dim, {0, n}, {num_clusters}, p.segment_iters, p.global_iters);
}

double kmeans_objective(const float* keys, int64_t n, int head_dim, const ClusterIndex& ci) {
  RETROINFER_CHECK(head_dim == ci.head_dim && static_cast<int64_t>(ci.assignment.size()) == n,
                   "kmeans_objective: the index covers ", ci.assignment.size(), " tokens of dim ", ci.head_dim,
                   ", the keys are ", n, " of dim ", head_dim);
  const int d = head_dim;
  std::vector<double> mu(d, 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < d; ++i) mu[i] += keys[t * d + i];
  for (int i = 0; i < d; ++i) mu[i] /= static_cast<double>(std::max<int64_t>(n, 1));
  // Normalised centred centroids.
  std::vector<double> u(static_cast<size_t>(ci.num_clusters) * d);
  for (int j = 0; j < ci.num_clusters; ++j) {
    double nrm = 0.0;
    for (int i = 0; i < d; ++i) {
      const double v = ci.centroids[static_cast<size_t>(j) * d + i] - mu[i];
      u[static_cast<size_t>(j) * d + i] = v;
      nrm += v * v;
    }
    const double inv = nrm > 0.0 ? 1.0 / std::sqrt(nrm) : 0.0;
    for (int i = 0; i < d; ++i) u[static_cast<size_t>(j) * d + i] *= inv;
  }
  double obj = 0.0;
  for (int64_t t = 0; t < n; ++t) {
    const int32_t j = ci.assignment[t];
    RETROINFER_CHECK(j >= 0 && j < ci.num_clusters, "kmeans_objective: token ", t, " has cluster ", j);
    for (int i = 0; i < d; ++i) obj += (keys[t * d + i] - mu[i]) * u[static_cast<size_t>(j) * d + i];
  }
  return obj;
}

}  // namespace retroinfer::index
