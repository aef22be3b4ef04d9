// Wave index: cluster storage per KV head, scoring and zone selection (see wave_index.h).
#include "index/wave_index.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>

#include "core/simd.h"
#include "core/vec_math.h"
#include "retroinfer/error.h"

namespace retroinfer::index {

std::string_view zone_name(Zone z) {
  switch (z) {
    case Zone::kSteady: return "steady";
    case Zone::kRetrieval: return "retrieval";
    case Zone::kEstimation: return "estimation";
    case Zone::kIgnored: return "ignored";
    case Zone::kOutlier: return "outlier";
  }
  return "?";
}

void HeadIndex::append(const ClusterIndex& ci, int64_t first_token, const std::vector<int32_t>& outlier_tokens) {
  RETROINFER_CHECK(head_dim == 0 || head_dim == ci.head_dim, "HeadIndex::append: head_dim ", ci.head_dim,
                   " differs from the index's ", head_dim);
  head_dim = ci.head_dim;
  centroids.insert(centroids.end(), ci.centroids.begin(), ci.centroids.end());
  value_sums.insert(value_sums.end(), ci.value_sums.begin(), ci.value_sums.end());
  sizes.insert(sizes.end(), ci.sizes.begin(), ci.sizes.end());
  const int64_t base = offsets.back();
  for (int j = 0; j < ci.num_clusters; ++j) offsets.push_back(base + ci.offsets[j + 1]);
  members.reserve(members.size() + ci.members.size());
  for (int32_t m : ci.members) members.push_back(first_token + m);
  for (int32_t t : outlier_tokens) {
    RETROINFER_CHECK(outliers.empty() || outliers.back() < first_token + t,
                     "HeadIndex::append: outlier tokens must be ascending and after the indexed ones");
    outliers.push_back(first_token + t);
  }
}

void HeadIndex::clear() {
  centroids.clear();
  value_sums.clear();
  sizes.clear();
  offsets.assign(1, 0);
  members.clear();
  outliers.clear();
}

namespace {

// The loops of score_clusters and scores_from_logits, compiled for AVX-512, AVX2 + FMA and the baseline and
// picked at run time (target_clones); core/vec_math.h's kernels vectorise without -ffast-math.
RETROINFER_TARGET_CLONES
void cluster_logits(const float* centroids, int64_t k, int d, const float* q, int group, float scale, float* logits,
                    int64_t ld) {
  for (int64_t j = 0; j < k; ++j) {
    const float* c = centroids + j * d;
    for (int g = 0; g < group; ++g) logits[g * ld + j] = core::dot_lanes(q + static_cast<int64_t>(g) * d, c, d) * scale;
  }
}

// p[j] = e^(lg[j] - m) for the non-empty clusters, 0 for the empty ones; returns their sum (in kLanes partial
// sums, the same with any vector width).
RETROINFER_TARGET_CLONES
float softmax_numerators(const int32_t* sizes, int k, const float* lg, float m, float* p) {
  for (int j = 0; j < k; ++j) p[j] = sizes[j] > 0 ? core::exp_nonpositive(lg[j] - m) : 0.0f;
  float part[core::kLanes] = {};
  const int whole = k - k % core::kLanes;
  for (int j = 0; j < whole; j += core::kLanes)
    for (int l = 0; l < core::kLanes; ++l) part[l] += p[j + l];
  float sum = 0.0f;
  for (int l = 0; l < core::kLanes; ++l) sum += part[l];
  for (int j = whole; j < k; ++j) sum += p[j];
  return sum;
}

}  // namespace

void cluster_logits_range(const HeadIndex& hi, const float* q, int group, float scale, int begin, int end,
                          float* logits) {
  RETROINFER_CHECK(0 <= begin && begin <= end && end <= hi.num_clusters(), "cluster_logits_range: clusters [", begin,
                   ", ", end, ") outside [0, ", hi.num_clusters(), ")");
  const int d = hi.head_dim, k = hi.num_clusters();
  const float* rows = hi.centroids.data() + static_cast<int64_t>(begin) * d;
  if (!core::row_logits_avx512(rows, end - begin, d, q, group, scale, logits + begin, k))
    cluster_logits(rows, end - begin, d, q, group, scale, logits + begin, k);
}

void score_clusters(const HeadIndex& hi, const float* q, int group, float scale, float* logits, float* scores) {
  cluster_logits_range(hi, q, group, scale, 0, hi.num_clusters(), logits);
  scores_from_logits(hi.sizes.data(), hi.num_clusters(), logits, group, scores);
}

void scores_from_logits(const int32_t* sizes, int num_clusters, const float* logits, int group, float* scores) {
  const int k = num_clusters;
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  for (int j = 0; j < k; ++j) scores[j] = sizes[j] > 0 ? 0.0f : kNegInf;
  std::vector<float> p(k);  // [num_clusters] unnormalised softmax of one query head
  for (int g = 0; g < group; ++g) {
    const float* lg = logits + static_cast<int64_t>(g) * k;
    float m = kNegInf;
    for (int j = 0; j < k; ++j)
      if (sizes[j] > 0) m = std::max(m, lg[j]);
    if (!(m > kNegInf)) continue;  // no non-empty cluster (or NaN logits)
    const float inv = 1.0f / softmax_numerators(sizes, k, lg, m, p.data());
    for (int j = 0; j < k; ++j) scores[j] += p[j] * inv;  // -inf + 0 stays -inf for empty clusters
  }
}

void select_zones(const float* scores, int num_clusters, const ZoneCounts& counts, ZoneSelection& out) {
  out.retrieval.clear();
  out.estimation.clear();
  // Each candidate as one 64-bit key that orders as the rule does (score descending, then id ascending): the
  // score's bits mapped to an unsigned integer of the same order above the id's complement. The selection then
  // compares integers, not scores looked up through ids; zero is made +0 so that -0 and +0 tie as they compare.
  thread_local std::vector<uint64_t> keys;
  keys.clear();
  for (int j = 0; j < num_clusters; ++j) {
    const float s = scores[j];
    if (!(s > -std::numeric_limits<float>::infinity())) continue;  // drops empty and NaN
    uint32_t u = std::bit_cast<uint32_t>(s == 0.0f ? 0.0f : s);
    u = (u & 0x80000000u) != 0 ? ~u : u | 0x80000000u;
    keys.push_back(static_cast<uint64_t>(u) << 32 | (0xffffffffu - static_cast<uint32_t>(j)));
  }
  const int64_t n_ids = static_cast<int64_t>(keys.size());
  const int64_t n_ret = std::min<int64_t>(counts.n_retrieval, n_ids);
  const int64_t n_sel = std::min<int64_t>(int64_t{counts.n_retrieval} + counts.n_estimation, n_ids);
  const auto better = std::greater<uint64_t>();
  if (n_sel < n_ids) std::nth_element(keys.begin(), keys.begin() + n_sel, keys.end(), better);
  if (n_ret < n_sel) std::nth_element(keys.begin(), keys.begin() + n_ret, keys.begin() + n_sel, better);
  // Both zones in id order: marked in a table over the clusters, then collected by one scan (no sorts).
  thread_local std::vector<uint8_t> zone;
  zone.assign(static_cast<size_t>(num_clusters), 0);
  for (int64_t i = 0; i < n_sel; ++i) zone[0xffffffffu - static_cast<uint32_t>(keys[i])] = i < n_ret ? 1 : 2;
  out.retrieval.reserve(static_cast<size_t>(n_ret));
  out.estimation.reserve(static_cast<size_t>(n_sel - n_ret));
  for (int j = 0; j < num_clusters; ++j) {
    if (zone[j] == 1) out.retrieval.push_back(j);
    if (zone[j] == 2) out.estimation.push_back(j);
  }
}

namespace {
void load_rows(const KvCache& kv, int h, int64_t begin, int64_t end, std::vector<float>& keys,
               std::vector<float>& values) {
  const int d = kv.head_dim();
  const int64_t n = end - begin;
  keys.resize(static_cast<size_t>(n) * d);
  values.resize(static_cast<size_t>(n) * d);
  for (int64_t t = 0; t < n; ++t) {
    kv.load_key(h, begin + t, keys.data() + t * d);
    kv.load_value(h, begin + t, values.data() + t * d);
  }
}

void check_range(const KvCache& kv, int h, int64_t begin, int64_t end, const char* where) {
  RETROINFER_CHECK(h >= 0 && h < kv.num_heads_kv(), where, ": KV head ", h, " out of [0, ", kv.num_heads_kv(), ")");
  RETROINFER_CHECK(begin >= 0 && begin <= end && end <= kv.size(), where, ": token range [", begin, ", ", end,
                   ") outside the ", kv.size(), " cached tokens");
}
}  // namespace

std::vector<int32_t> split_outliers(ClusterIndex& ci, const float* keys, const float* values, int64_t n,
                                    double fraction) {
  RETROINFER_CHECK(fraction >= 0.0 && fraction <= 1.0, "split_outliers: fraction must be in [0, 1], got ",
                   fraction);
  RETROINFER_CHECK(static_cast<int64_t>(ci.assignment.size()) == n, "split_outliers: the index holds ",
                   ci.assignment.size(), " tokens, not ", n);
  const int d = ci.head_dim;
  const int64_t want = outlier_split_count(fraction, n);
  if (want == 0 || n == 0) return {};
  // Squared residual of every token against its cluster's centroid, in double. A token whose residual is
  // within f32 rounding of the centroid counts as represented exactly and is never taken: a one-member
  // cluster's centroid is the key rebuilt as (k - mu) + mu, off by a few ulps of max(|k|, |mu|) per
  // element; kExactRel = 1e-10 on the squared norms (1e-5 relative on the norms, ~100x f32's 6e-8
  // epsilon) separates that from any real residual.
  constexpr double kExactRel = 1e-10;
  std::vector<double> res(static_cast<size_t>(n));
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < n; ++i) {
    const float* k = keys + i * d;
    const float* c = ci.centroids.data() + static_cast<int64_t>(ci.assignment[i]) * d;
    double s = 0.0, kk = 0.0, cc = 0.0;
    for (int l = 0; l < d; ++l) {
      const double e = static_cast<double>(k[l]) - c[l];
      s += e * e;
      kk += static_cast<double>(k[l]) * k[l];
      cc += static_cast<double>(c[l]) * c[l];
    }
    res[i] = s;
    if (s > kExactRel * (kk + cc)) ids.push_back(static_cast<int32_t>(i));
  }
  const int64_t take = std::min<int64_t>(want, static_cast<int64_t>(ids.size()));
  auto worse = [&res](int32_t a, int32_t b) { return res[a] > res[b] || (res[a] == res[b] && a < b); };
  std::nth_element(ids.begin(), ids.begin() + take, ids.end(), worse);
  ids.resize(take);
  std::sort(ids.begin(), ids.end());
  if (ids.empty()) return ids;
  // Remove them and recompute the touched clusters from their remaining members.
  std::vector<char> touched(ci.num_clusters, 0);
  for (int32_t i : ids) {
    touched[ci.assignment[i]] = 1;
    ci.assignment[i] = -1;
  }
  std::vector<int32_t> members, offsets(ci.num_clusters + 1, 0);
  members.reserve(ci.members.size() - ids.size());
  std::vector<double> ksum(d), vsum(d);
  for (int j = 0; j < ci.num_clusters; ++j) {
    offsets[j] = static_cast<int32_t>(members.size());
    std::fill(ksum.begin(), ksum.end(), 0.0);
    std::fill(vsum.begin(), vsum.end(), 0.0);
    int32_t size = 0;
    for (int32_t m = ci.offsets[j]; m < ci.offsets[j + 1]; ++m) {
      const int32_t t = ci.members[m];
      if (ci.assignment[t] < 0) continue;
      members.push_back(t);
      ++size;
      if (!touched[j]) continue;
      for (int l = 0; l < d; ++l) {
        ksum[l] += keys[static_cast<int64_t>(t) * d + l];
        vsum[l] += values[static_cast<int64_t>(t) * d + l];
      }
    }
    ci.sizes[j] = size;
    if (!touched[j]) continue;
    float* c = ci.centroids.data() + static_cast<int64_t>(j) * d;
    float* v = ci.value_sums.data() + static_cast<int64_t>(j) * d;
    for (int l = 0; l < d; ++l) {
      v[l] = static_cast<float>(vsum[l]);
      if (size > 0) c[l] = static_cast<float>(ksum[l] / size);  // an emptied cluster keeps its centroid
    }
  }
  offsets[ci.num_clusters] = static_cast<int32_t>(members.size());
  ci.members = std::move(members);
  ci.offsets = std::move(offsets);
  return ids;
}

void index_tokens(const KvCache& kv, int h, int64_t begin, int64_t end, const KMeansParams& p, HeadIndex& hi,
                  double outlier_fraction) {
  check_range(kv, h, begin, end, "index_tokens");
  std::vector<float> keys, values;
  load_rows(kv, h, begin, end, keys, values);
  ClusterIndex ci = segmented_kmeans(keys.data(), values.data(), end - begin, kv.head_dim(), p);
  const std::vector<int32_t> out = split_outliers(ci, keys.data(), values.data(), end - begin, outlier_fraction);
  hi.append(ci, begin, out);
}

void index_block(const KvCache& kv, int h, int64_t begin, int64_t end, int num_clusters, const KMeansParams& p,
                 HeadIndex& hi, double outlier_fraction) {
  check_range(kv, h, begin, end, "index_block");
  std::vector<float> keys, values;
  load_rows(kv, h, begin, end, keys, values);
  ClusterIndex ci = block_kmeans(keys.data(), values.data(), end - begin, kv.head_dim(), num_clusters, p);
  const std::vector<int32_t> out = split_outliers(ci, keys.data(), values.data(), end - begin, outlier_fraction);
  hi.append(ci, begin, out);
}

}  // namespace retroinfer::index
