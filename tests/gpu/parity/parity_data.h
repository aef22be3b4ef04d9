// Inputs of the parity families and their hand-over to the production CPU code: the bf16 K/V of
// gpu_test_util.h as the CPU's KvCache and f32 rows, a RetroLayer's downloaded index as the CPU's
// ClusterIndex / HeadIndex, and one built-and-decoded RetroLayer with everything its stages produced.
#pragma once

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attention/exact.h"
#include "gpu_test_util.h"
#include "index/kmeans.h"
#include "index/wave_index.h"
#include "parity/parity_harness.h"
#include "retroinfer/kv_cache.h"

namespace retroinfer::parity {

using gputest::KvData;

inline constexpr double kU = 0x1p-24;  // f32 unit roundoff

// Flat heads [seq * hkv, (seq + 1) * hkv) of kv, tokens [0, n), as a bf16 KvCache (the values are bf16
// already: the conversion is exact).
inline KvCache to_cache(const KvData& kv, int seq, int hkv, int64_t n) {
  KvCache cache(hkv, kv.d, DType::kBF16);
  const int d = kv.d;
  std::vector<float> k(size_t(n) * hkv * d), v(k.size());
  for (int64_t t = 0; t < n; ++t)
    for (int h = 0; h < hkv; ++h)
      for (int i = 0; i < d; ++i) {
        k[(t * hkv + h) * d + i] = kv.key(seq * hkv + h, t, i);
        v[(t * hkv + h) * d + i] = kv.value(seq * hkv + h, t, i);
      }
  cache.append(k.data(), v.data(), n);
  return cache;
}

// [n, d] f32 keys (or values) of flat head h, tokens [begin, begin + n).
inline std::vector<float> rows(const KvData& kv, int h, int64_t begin, int64_t n, bool keys) {
  std::vector<float> out(size_t(n) * kv.d);
  for (int64_t t = 0; t < n; ++t)
    for (int i = 0; i < kv.d; ++i) out[t * kv.d + i] = keys ? kv.key(h, begin + t, i) : kv.value(h, begin + t, i);
  return out;
}

inline index::KMeansParams kmeans_params(const AttentionConfig& cfg) {
  index::KMeansParams p;
  p.tokens_per_cluster = cfg.tokens_per_cluster;
  p.segment_tokens = cfg.segment_tokens;
  p.segment_iters = cfg.kmeans_segment_iters;
  p.global_iters = cfg.kmeans_global_iters;
  return p;
}

// A flat head's GPU index as the CPU's ClusterIndex (f32 centroids and value sums: the layer keeps them by
// default, set_keep_f32_index).
inline index::ClusterIndex cluster_index(const cuda::RetroDebugState& st, int d) {
  index::ClusterIndex ci;
  ci.num_clusters = st.num_clusters;
  ci.head_dim = d;
  ci.centroids = st.centroids;
  ci.value_sums = st.value_sums;
  ci.sizes = st.sizes;
  ci.assignment = st.assignment;
  ci.offsets = st.offsets;
  ci.members = st.members;
  return ci;
}

// The centroids the decode scores with, as f32 [C, d]: the int8 copies dequantised ((u - 128) * scale, exact
// in f32: |u - 128| <= 127 has 7 bits) when the layer scores int8, else the bf16 centroids.
inline std::vector<float> scored_centroids(const cuda::RetroDebugState& st, int d) {
  std::vector<float> c(size_t(st.num_clusters) * d);
  for (int j = 0; j < st.num_clusters; ++j)
    for (int i = 0; i < d; ++i) c[size_t(j) * d + i] = float(gputest::scored_centroid(st, d, j, i));
  return c;
}

// A flat head's GPU index as the CPU's HeadIndex, with the scored centroids (what score_clusters should see)
// and the bf16 value sums (what the estimation reads); members absolute (idx_begin + index token).
inline index::HeadIndex head_index(const cuda::RetroDebugState& st, int d, int64_t idx_begin) {
  index::HeadIndex hi;
  hi.head_dim = d;
  hi.centroids = scored_centroids(st, d);
  hi.value_sums.resize(st.value_sums_bf16.size());
  for (size_t i = 0; i < hi.value_sums.size(); ++i) hi.value_sums[i] = bf16_to_f32(st.value_sums_bf16[i]);
  hi.sizes = st.sizes;
  hi.offsets.assign(st.offsets.begin(), st.offsets.end());
  for (int32_t m : st.members) hi.members.push_back(idx_begin + m);
  return hi;
}

// One RetroLayer built over clustered bf16 K/V (gpu_test_util.h make_kv, rows past n NaN) and decoded once
// for peaked queries.
struct RetroCase {
  int num_seqs = 1, hkv = 2, group = 4, d = 128;
  int64_t n = 2000;
  AttentionConfig cfg;
  bool int8_scoring = true;  // AttentionConfig::int8_centroid_scoring (the default)
  bool outliers = false;     // RetroLayer::set_outlier_zone
  int centres = 8;           // make_kv: key centres per head
  float spread = 0.5f;       // make_kv: noise around them (0: exact duplicate keys, hence empty clusters)
  std::string describe() const {
    char b[200];
    std::snprintf(b, sizeof b, "seqs %d hkv %d G %d d %d n %lld sink %d window %d seg %d r %.3g e %.3g%s%s%s", num_seqs,
                  hkv, group, d, (long long)n, cfg.sink_tokens, cfg.window_tokens, cfg.segment_tokens,
                  cfg.retrieval_fraction, cfg.estimation ? cfg.estimation_fraction : 0.0,
                  int8_scoring ? "" : " bf16-scoring", outliers ? " outliers" : "",
                  spread == 0.0f ? " duplicates" : "");
    return b;
  }
};

struct RetroRun {
  int H = 0, G = 0, d = 0, C = 0, n_r = 0, n_e = 0;
  int64_t n = 0, idx_begin = 0, n_idx = 0;
  float scale = 0.0f;
  KvData kv;                                   // [H, n + 3, d]
  std::vector<float> q, out;                   // [H, G, d]
  std::vector<cuda::RetroDebugState> heads;    // per flat head, after the decode
  std::vector<std::vector<int32_t>> outliers;  // per flat head (outlier zone on)
};

inline RetroRun run_retro(const RetroCase& rc, uint64_t seed) {
  RetroRun r;
  r.H = rc.num_seqs * rc.hkv;
  r.G = rc.group;
  r.d = rc.d;
  r.n = rc.n;
  r.kv = gputest::make_kv(r.H, rc.n, rc.n + 3, rc.d, seed, rc.centres, rc.spread);
  r.q = gputest::make_q(r.kv, r.G, seed + 1);
  AttentionConfig cfg = rc.cfg;
  cfg.int8_centroid_scoring = rc.int8_scoring;
  cuda::RetroLayer layer(AttentionShape{rc.hkv * rc.group, rc.hkv, rc.d}, cfg, rc.num_seqs);
  layer.set_outlier_zone(rc.outliers);
  auto dk = gputest::upload(r.kv.k), dv = gputest::upload(r.kv.v), dq = gputest::upload(r.q);
  auto dout = gputest::poisoned(r.q.size());
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), rc.n, rc.n + 3);
  layer.decode(dq.as<float>(), dout.as<float>());
  cuda::synchronize();
  r.out = gputest::download_f32(dout, r.q.size());
  r.C = layer.num_clusters();
  r.n_r = layer.n_retrieval();
  r.n_e = layer.n_estimation();
  r.idx_begin = layer.indexed_begin();
  r.n_idx = layer.indexed_tokens();
  r.scale = attention::effective_scale(rc.cfg.scale, rc.d);
  for (int h = 0; h < r.H; ++h) {
    r.heads.push_back(layer.debug_state(h));
    r.outliers.push_back(rc.outliers ? layer.outliers(h) : std::vector<int32_t>{});
  }
  return r;
}

// Paper budgets on short segments with a short steady zone: the shape of most retro cases.
inline AttentionConfig small_retro_config(int segment_tokens, double retrieval, double estimation) {
  AttentionConfig cfg;
  cfg.sink_tokens = 4;
  cfg.window_tokens = 16;
  cfg.segment_tokens = segment_tokens;
  cfg.retrieval_fraction = retrieval;
  cfg.estimation_fraction = estimation;
  cfg.estimation = estimation > 0.0;
  return cfg;
}

}  // namespace retroinfer::parity
