// RetroLayer: the wave index built and used on the GPU (k-means at build, score / select / estimate /
// sparse attention / merge at decode).
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/decode_dense.h"
#include "kernels/layer_budget_kernels.h"
#include "index/layer_budgets.h"
#include "index/cuda/kmeans_phases.h"
#include "index/cuda/kmeans_run.h"
#include "attention/cuda/kv_int8_cache.h"
#include "attention/cuda/layer_common.h"
#include "retroinfer/cuda_backend.h"

namespace retroinfer::cuda {

namespace {
// (Re)allocates `buf` when it is smaller than `bytes` (grow only).
void ensure(DeviceBuffer& buf, size_t bytes) {
  if (buf.bytes() < bytes) buf = DeviceBuffer(bytes);
}
// RETROINFER_SELECT_PHASES=1: decode_stage_ms also replays the decode once as a graph with phase stamps
// (kernels.h kPhaseSlots) after an L2 flush and appends their summary as "phase.*" entries (kernel_bench
// --stages 1). =2 (kernel_bench --stages 2, diagnostics): the stamps of a second replay straight after a
// first one, without the flush (warm L2 and instruction caches), to tell cold-cache costs from work.
int phases_requested() {
  const char* e = std::getenv("RETROINFER_SELECT_PHASES");
  return e == nullptr ? 0 : (e[0] == '1' ? 1 : (e[0] == '2' ? 2 : 0));
}
}  // namespace


// Workspace and result of one k-means run (the prefill build or one index update; kmeans_run.h) and the
// outlier split of its result.
struct KMeansWork : detail::KMeansRun {
  // Outlier split of the run's result.
  DeviceBuffer residual, picked_ids, picked_list, picked_count, picked_scratch, touched;
};

struct RetroLayer::Impl {
  AttentionShape shape;
  AttentionConfig cfg;  // retrieval_fraction: nominal_retrieval x the multiplier (set_retrieval_multiplier)
  double nominal_retrieval = 0.0;
  int num_seqs = 1, H = 0, G = 0, D = 0;
  float scale = 0.0f;
  // Current build (with kv8: k, v only inside build() and an update, where they point at bf16 rows).
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  const KvInt8Cache* kv8 = nullptr;  // set_int8_kv: decode's int8 rows
  DeviceBuffer update_k, update_v;   // kv8: an update's block widened to bf16 ([H, update_tokens, D])
  int64_t n = 0, n_built = 0, kv_stride = 0, idx_begin = 0, n_idx = 0;
  int C = 0, n_r = 0, n_e = 0;
  int64_t list_cap = 0, list_alloc = 0, most_retrieval = 0, max_outliers = 0;
  int attn_splits = 0, est_splits = 0;
  int64_t updates = 0;
  bool decoded = false, grown = false;
  // Settings (the set_* calls); RetroLayer::release carries each of them over to the fresh layer.
  bool outliers_on = false;  // set_outlier_zone(true): cfg.outlier_fraction applies
  bool keep_f32 = true;      // set_keep_f32_index: f32 centroids / value sums kept after build and update
  bool keep_assignment = true;  // set_keep_assignment: the per-token cluster ids kept on the device
  bool int8_on = false;         // cfg.int8_centroid_scoring: clusters scored against centroids_q8 (the index then
                                // keeps no bf16 centroids)
  int build_group = 1;       // set_build_group_seqs: sequences per k-means run of build() (0: all)
  KMeansWork work;
  // The index (compact CSR over flat heads: head h's members are [offsets[h*C], offsets[(h+1)*C])).
  DeviceBuffer mean;            // [H, D] f32: mean key of the prefill build
  DeviceBuffer centroids;       // [H, C, D] f32, de-centred
  DeviceBuffer centroids_bf16;  // [H, C, D] bf16 (int8_on: empty; the k-means result's are quantized and dropped)
  DeviceBuffer centroids_q8;    // [H, C, D] u8: int8 copies of the bf16 centroids (int8_on; quantize_centroids)
  DeviceBuffer centroid_scale;  // [H, C] f32: their row scales
  DeviceBuffer value_sums;      // [H, C, D] f32
  DeviceBuffer value_sums_bf16;  // [H, C, D] bf16
  DeviceBuffer sizes;           // [H, C] int
  DeviceBuffer assignment;      // [H, n_idx] int: cluster of each index token, -1 for an outlier (kept only
                                // with keep_assignment: decode never reads it; debug_state rebuilds it)
  DeviceBuffer members;         // [offsets[H*C]] u32: index tokens (relative to idx_begin) grouped by cluster
  DeviceBuffer offsets;         // [H*C + 1] int: absolute CSR offsets
  DeviceBuffer outliers;        // [H, outlier_stride] int: outlier KV tokens of each head, ascending
  DeviceBuffer outlier_count;   // [H] int
  int64_t outlier_stride = 0;
  // Decode workspace.
  DeviceBuffer logits, norm_partial, scores, ret_ids, est_ids, scan_scratch, token_list, token_count, part_ml, part_o;
  DeviceBuffer merge_counter;  // [H] int: the dense decode's fused merge per-head CTA count (zeroed once; kept zero)
  DeviceBuffer sel_ws;         // [H, kSelectGridWsWords] u32: the grid selection's workspace (zeroed once; kept zero)
  DeviceBuffer phase;          // [H, kPhaseSlots] u64: phase stamps (decode_stage_ms, RETROINFER_SELECT_PHASES=1)
  bool phase_on = false;       // decode_impl passes `phase` (decode_stage_ms's phase graph)

  int64_t idx_end() const { return n_idx == 0 ? std::max<int64_t>(idx_begin, cfg.sink_tokens) : idx_begin + n_idx; }
  // The rows decode attends exactly (DenseDecodeArgs or ZoneDecodeArgs): the bf16 k, v, or kv8's int8 rows.
  template <typename Args>
  void set_exact_rows(Args& a) const {
    a.k = k;
    a.v = v;
    a.kv_stride = kv_stride;
    if (kv8 != nullptr) {
      a.kv8 = kv8->rows();
      a.kv_stride = kv8->capacity();
    }
  }
  std::vector<DeviceBuffer> retired;  // index buffers replaced by an update, freed after its sync
  void size_workspace(cudaStream_t st);
  DeviceBuffer top_sum;               // [H] int64: size_workspace's per-head retrieval capacity (top_sizes_sum)
  std::vector<long long> host_top;    // its download
  std::vector<int32_t> host_outliers;  // the outlier counts' download
  std::chrono::steady_clock::time_point t_enqueued, t_synced;  // the latest build's (kmeans_phases.h)
  void set_caps();
  void update(cudaStream_t st);
  void split_outliers(cudaStream_t st, int64_t head0, int heads);
  void build_grouped(const std::vector<int>& seg_t, const std::vector<int>& seg_c, int group, cudaStream_t st);
  // int8_on: rows [row0, row0 + rows) of (q8, scale) from `rows` bf16 centroid rows (quantize_centroids).
  void quantize_rows(const DeviceBuffer& bf16, DeviceBuffer& q8, DeviceBuffer& scale, size_t row0, size_t rows,
                     cudaStream_t st) const {
    if (rows == 0) return;
    detail::launch_check(detail::quantize_centroids(bf16.as<uint16_t>(), int64_t(rows), D, q8.as<uint8_t>() + row0 * D,
                                                    scale.as<float>() + row0, st),
                         "quantize_centroids", st);
  }
};

RetroLayer::RetroLayer(const AttentionShape& shape, const AttentionConfig& cfg, int num_seqs) : impl_(new Impl) {
  detail::validate_layer_shape(shape, num_seqs, "RetroLayer");
  validate(cfg);
  auto& m = *impl_;
  m.shape = shape;
  m.cfg = cfg;
  m.nominal_retrieval = cfg.retrieval_fraction;
  m.int8_on = cfg.int8_centroid_scoring;
  m.num_seqs = num_seqs;
  m.H = num_seqs * shape.num_heads_kv;
  m.G = shape.num_heads_q / shape.num_heads_kv;
  m.D = shape.head_dim;
  m.scale = detail::effective_scale(cfg.scale, shape.head_dim);
}
RetroLayer::~RetroLayer() = default;
RetroLayer::RetroLayer(RetroLayer&&) noexcept = default;
RetroLayer& RetroLayer::operator=(RetroLayer&&) noexcept = default;

void RetroLayer::build(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride, Stream s) {
  const auto t_begin = std::chrono::steady_clock::now();
  detail::validate_kv(k, v, num_tokens, kv_stride, "RetroLayer::build");
  auto& m = *impl_;
  m.t_enqueued = m.t_synced = t_begin;
  auto st = static_cast<cudaStream_t>(s);
  m.k = k;
  m.v = v;
  m.n = m.n_built = num_tokens;
  m.kv_stride = kv_stride;
  m.cfg.retrieval_fraction = m.nominal_retrieval;  // a new index starts at the nominal budget
  m.decoded = m.grown = false;
  m.updates = 0;
  m.max_outliers = 0;
  // As the CPU method (attention/retro.cpp): less than one cluster's worth of tokens stays steady.
  const SteadySplit split = steady_split(num_tokens, m.cfg);
  m.idx_begin = split.sink_end;
  m.n_idx = retro_indexed_tokens(split, m.cfg.tokens_per_cluster);
  const int H = m.H, D = m.D;
  ensure(m.outlier_count, size_t(H) * 4);
  RETROINFER_CUDA_CHECK(cudaMemsetAsync(m.outlier_count.data(), 0, size_t(H) * 4, st));
  // Outlier lists: round(f * n) of the build's tokens and of each update's block, for growth to kv_stride.
  const double f = m.outliers_on ? m.cfg.outlier_fraction : 0.0;
  m.outlier_stride = outlier_capacity(f, m.n_idx, kv_stride - num_tokens, m.cfg.update_tokens);
  ensure(m.outliers, std::max<size_t>(size_t(H) * m.outlier_stride * 4, 16));
  if (m.n_idx == 0) {
    m.C = 0;
    ensure(m.offsets, 4);
    RETROINFER_CUDA_CHECK(cudaMemsetAsync(m.offsets.data(), 0, 4, st));  // the empty CSR: offsets[0] = 0
  } else {
    // Segments and their cluster counts (wave_counts.h, as kmeans.h).
    std::vector<int> seg_t{0}, seg_c{0};
    for (int64_t seg = 0; seg < segment_count(m.n_idx, m.cfg.segment_tokens); ++seg) {
      const int64_t L = segment_length(m.n_idx, m.cfg.segment_tokens, seg);
      seg_t.push_back(seg_t.back() + static_cast<int>(L));
      seg_c.push_back(seg_c.back() + segment_clusters(L, m.cfg.tokens_per_cluster));
    }
    const int group = m.build_group <= 0 ? m.num_seqs : std::min(m.build_group, m.num_seqs);
    if (group < m.num_seqs) {
      m.build_grouped(seg_t, seg_c, group, st);
    } else {
      m.work.run(k, v, kv_stride, H, D, m.cfg, m.idx_begin, m.n_idx, seg_t, seg_c, st);
      m.t_enqueued = std::chrono::steady_clock::now();
      m.split_outliers(st, 0, H);
      // The run's result becomes the index (its buffers; the index's old ones become the next workspace).
      m.C = m.work.C;
      std::swap(m.mean, m.work.mean);
      std::swap(m.centroids, m.work.centroids);
      std::swap(m.centroids_bf16, m.work.centroids_bf16);
      std::swap(m.value_sums, m.work.value_sums);
      std::swap(m.value_sums_bf16, m.work.value_sums_bf16);
      std::swap(m.sizes, m.work.sizes);
      std::swap(m.assignment, m.work.assignment);
      std::swap(m.members, m.work.members);
      std::swap(m.offsets, m.work.offsets);
      if (!m.keep_f32) {  // decode reads the bf16 copies only
        m.centroids = DeviceBuffer{};
        m.value_sums = DeviceBuffer{};
      }
      if (!m.keep_assignment) m.assignment = DeviceBuffer{};
      if (m.int8_on) {  // scored against int8 copies only: quantize the bf16 centroids, then drop them
        const size_t rows = size_t(H) * size_t(m.C);
        ensure(m.centroids_q8, rows * size_t(D));
        ensure(m.centroid_scale, rows * 4);
        m.quantize_rows(m.centroids_bf16, m.centroids_q8, m.centroid_scale, 0, rows, st);
        // The bf16 rows go back to the workspace (the next build's buffer: no free, no allocation, no
        // wait); the index keeps none. Work queued after this on st reads them before any reuse.
        std::swap(m.centroids_bf16, m.work.centroids_bf16);
        if (m.centroids_bf16.bytes() > 0) {  // the former index copy (a build with int8 scoring off)
          RETROINFER_CUDA_CHECK(cudaStreamSynchronize(st));
          m.centroids_bf16 = DeviceBuffer{};
        }
      }
    }
  }
  m.size_workspace(st);  // synchronises: the build has read k, v
  if (m.kv8 != nullptr) {  // decode reads the int8 cache; k, v (the runner's staging) are not kept
    RETROINFER_CHECK(m.kv8->capacity() >= kv_stride, "RetroLayer::build: the 8-bit KV cache holds ",
                     m.kv8->capacity(), " tokens per head, fewer than the ", kv_stride, " rows the layer may grow to");
    m.k = m.v = nullptr;
  }
  const auto t_end = std::chrono::steady_clock::now();
  using Ms = std::chrono::duration<double, std::milli>;
  if (m.t_synced < m.t_enqueued) m.t_synced = m.t_enqueued;
  detail::build_host_times_set({Ms(m.t_enqueued - t_begin).count(), Ms(m.t_synced - m.t_enqueued).count(),
                                Ms(t_end - m.t_synced).count()});
}

// The prefill build in groups of `group` sequences through one workspace sized for a group. Neither the
// k-means nor the outlier split mixes flat heads (every kernel indexes its head's K/V, clusters and
// tokens by the head; the radix sort is stable on keys h * C + cluster), so each head's result is the
// batched run's, bit for bit. Each group's result is copied into the index arrays at its flat heads; its
// CSR offsets (the group's first member at 0) are shifted on the host by the earlier groups' members.
// Synchronous once per group (the offsets' download).
void RetroLayer::Impl::build_grouped(const std::vector<int>& seg_t, const std::vector<int>& seg_c, int group,
                                     cudaStream_t st) {
  const int Hkv = shape.num_heads_kv;
  const size_t Hs = H, Cs = static_cast<size_t>(seg_c.back()), Ds = D, N = static_cast<size_t>(n_idx);
  RETROINFER_CHECK(Hs * N < size_t{1} << 31, "RetroLayer::build: ", Hs, " flat heads x ", N,
                   " indexed tokens exceed the int32 CSR offsets; use fewer sequences per layer");
  C = seg_c.back();
  ensure(mean, Hs * Ds * 4);
  if (int8_on) {  // each group's bf16 centroids are quantized into the index; no bf16 copy is kept
    centroids_bf16 = DeviceBuffer{};
    ensure(centroids_q8, Hs * Cs * Ds);
    ensure(centroid_scale, Hs * Cs * 4);
  } else {
    ensure(centroids_bf16, Hs * Cs * Ds * 2);
  }
  ensure(value_sums_bf16, Hs * Cs * Ds * 2);
  if (keep_f32) {
    ensure(centroids, Hs * Cs * Ds * 4);
    ensure(value_sums, Hs * Cs * Ds * 4);
  } else {
    centroids = DeviceBuffer{};
    value_sums = DeviceBuffer{};
  }
  ensure(sizes, Hs * Cs * 4);
  if (keep_assignment) ensure(assignment, Hs * N * 4);
  else assignment = DeviceBuffer{};
  ensure(members, Hs * N * 4);
  ensure(offsets, (Hs * Cs + 1) * 4);
  int64_t base = 0;  // members of the earlier groups (the CSR is compact over flat heads)
  std::vector<int32_t> off;
  for (int s0 = 0; s0 < num_seqs; s0 += group) {
    const int Hg = std::min(group, num_seqs - s0) * Hkv;
    const size_t h0 = size_t(s0) * Hkv;  // the group's first flat head
    const size_t kv_at = h0 * size_t(kv_stride) * Ds;
    work.run(k + kv_at, v + kv_at, kv_stride, Hg, D, cfg, idx_begin, n_idx, seg_t, seg_c, st);
    split_outliers(st, int64_t(h0), Hg);
    // [Hg, per_head] rows of the group's result -> rows [h0, h0 + Hg) of the index array.
    auto put = [&](DeviceBuffer& dst, const DeviceBuffer& src, size_t per_head) {
      RETROINFER_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst.data()) + h0 * per_head, src.data(),
                                            size_t(Hg) * per_head, cudaMemcpyDeviceToDevice, st));
    };
    put(mean, work.mean, Ds * 4);
    if (int8_on) quantize_rows(work.centroids_bf16, centroids_q8, centroid_scale, h0 * Cs, size_t(Hg) * Cs, st);
    else put(centroids_bf16, work.centroids_bf16, Cs * Ds * 2);
    put(value_sums_bf16, work.value_sums_bf16, Cs * Ds * 2);
    if (keep_f32) {
      put(centroids, work.centroids, Cs * Ds * 4);
      put(value_sums, work.value_sums, Cs * Ds * 4);
    }
    put(sizes, work.sizes, Cs * 4);
    if (keep_assignment) put(assignment, work.assignment, N * 4);
    off.resize(size_t(Hg) * Cs + 1);
    RETROINFER_CUDA_CHECK(cudaMemcpyAsync(off.data(), work.offsets.data(), off.size() * 4, cudaMemcpyDeviceToHost, st));
    RETROINFER_CUDA_CHECK(cudaStreamSynchronize(st));
    const int64_t count = off.back();  // the group's members (outliers removed)
    RETROINFER_CHECK(off.front() == 0 && count >= 0 && count <= int64_t(Hg) * n_idx,
                     "RetroLayer::build: group CSR offsets [", off.front(), ", ", count, "] outside [0, ",
                     int64_t(Hg) * n_idx, "] (internal error)");
    for (auto& o : off) o += static_cast<int32_t>(base);
    // Entry Hg * C of this group is entry 0 of the next one (the same value): written by both.
    RETROINFER_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(offsets.data()) + h0 * Cs * 4, off.data(), off.size() * 4,
                                          cudaMemcpyHostToDevice, st));
    if (count > 0)
      RETROINFER_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(members.data()) + size_t(base) * 4, work.members.data(),
                                            size_t(count) * 4, cudaMemcpyDeviceToDevice, st));
    RETROINFER_CUDA_CHECK(cudaStreamSynchronize(st));  // `off` is reused; the workspace is the next group's
    base += count;
  }
}

// Budgets, token-list capacity and decode workspace for the current index. Synchronous when the index is
// non-empty (the capacity needs the cluster sizes).
void RetroLayer::Impl::size_workspace(cudaStream_t st) {
  // (int8_on: the int8 copies are made where the bf16 centroids come from: build, build_grouped, update.)
  const ZoneCounts z = zone_counts(C, cfg);
  n_r = z.n_retrieval;
  n_e = z.n_estimation;
  most_retrieval = 0;
  if (C > 0) {
    // Token-list capacity: the steady zone plus the largest n_r clusters of any head (plus its outliers).
    // Per head, the sum of its n_r largest cluster sizes, computed on the device (top_sizes_sum): only H
    // sums and H outlier counts come back (downloading the H x C sizes and sorting them per head on the host
    // takes ~0.1 ms of a 32K build and ~0.5 ms at 128K, longer than some of its kernels).
    ensure(top_sum, size_t(H) * 8);
    host_top.resize(size_t(H));
    host_outliers.resize(size_t(H));
    long long* top = host_top.data();
    int32_t* oc = host_outliers.data();
    if (n_r > 0) {
      detail::launch_check(detail::top_sizes_sum(sizes.as<int>(), H, C, n_r, top_sum.as<long long>(), st),
                           "top_sizes_sum", st);
      RETROINFER_CUDA_CHECK(cudaMemcpyAsync(top, top_sum.data(), size_t(H) * 8, cudaMemcpyDeviceToHost, st));
    }
    RETROINFER_CUDA_CHECK(cudaMemcpyAsync(oc, outlier_count.data(), size_t(H) * 4, cudaMemcpyDeviceToHost, st));
    RETROINFER_CUDA_CHECK(cudaStreamSynchronize(st));
    t_synced = std::chrono::steady_clock::now();
    retired.clear();
    for (int h = 0; h < H && n_r > 0; ++h) most_retrieval = std::max<int64_t>(most_retrieval, top[h]);
    max_outliers = *std::max_element(oc, oc + H);
  }
  // Exact tokens per head: steady zone [0, idx_begin) + [idx_end, n) (while tokens are appended its tail
  // grows to at most window + update_tokens - 1 tokens before an update takes update_tokens of them, and
  // never past kv_stride), the retrieval clusters and the outliers.
  const int64_t steady_now = n_idx == 0 ? n : idx_begin + (n - idx_end());
  const int64_t tail_max = std::min<int64_t>(steady_tail_max(cfg), kv_stride - idx_end());
  const int64_t steady_grow = std::max(steady_now, idx_begin + tail_max);
  list_alloc = steady_grow + most_retrieval + max_outliers;
  set_caps();
  const size_t Hs = H;
  ensure(token_list, Hs * list_alloc * 4);
  ensure(token_count, Hs * 4);
  const int splits_max = n_idx == 0 ? detail::decode_splits(kv_stride, H, 1) : detail::decode_splits(list_alloc, H, 1);
  est_splits = static_cast<int>(detail::ceil_div(n_e, detail::kEstimateChunk));
  const int total = std::max(splits_max, attn_splits) + est_splits;
  ensure(part_ml, Hs * total * G * 8);
  ensure(part_o, Hs * total * G * D * 4);
  if (merge_counter.bytes() < Hs * 4) {  // zero once: every decode's last CTA per head leaves it zero
    merge_counter = DeviceBuffer(Hs * 4);
    RETROINFER_CUDA_CHECK(cudaMemsetAsync(merge_counter.data(), 0, Hs * 4, st));
  }
  if (sel_ws.bytes() < detail::select_grid_ws_bytes(H)) {  // zero once: every grid selection leaves it zero
    sel_ws = DeviceBuffer(detail::select_grid_ws_bytes(H));
    RETROINFER_CUDA_CHECK(cudaMemsetAsync(sel_ws.data(), 0, sel_ws.bytes(), st));
  }
  if (C > 0) {
    ensure(logits, Hs * G * C * 4);
    ensure(norm_partial, Hs * G * detail::score_blocks(C, D, H) * 8);
    ensure(scores, Hs * C * 4);
    ensure(ret_ids, Hs * std::max(n_r, 1) * 4);
    ensure(est_ids, Hs * std::max(n_e, 1) * 4);
    ensure(scan_scratch, Hs * (n_r + 1) * 4);
  }
}

// The list capacity decode sizes its splits by: as at build until the first append (so that a layer that
// is never appended to behaves exactly as before), then the growth capacity.
void RetroLayer::Impl::set_caps() {
  const int64_t steady_now = n_idx == 0 ? n : idx_begin + (n - idx_end());
  list_cap = grown ? list_alloc : steady_now + most_retrieval + max_outliers;
  // Splits: about one wave of CTAs for the exact part (its lists are short; layer_common.h exact_splits), a
  // fraction for estimation; the dense decode of an unindexed layer as DenseDecoder's.
  attn_splits = n_idx == 0 ? detail::decode_splits(n, H, 1) : detail::exact_splits(list_cap, H);
}

void RetroLayer::append(int64_t num_tokens, Stream s) {
  auto& m = *impl_;
  RETROINFER_CHECK(m.n > 0, "RetroLayer::append: build() was not called");
  RETROINFER_CHECK(num_tokens >= m.n && num_tokens <= m.kv_stride, "RetroLayer::append: ", num_tokens,
                   " tokens, but the layer holds ", m.n, " and K/V rows end at kv_stride ", m.kv_stride,
                   " (tokens are only appended, up to kv_stride)");
  if (num_tokens == m.n) return;
  m.n = num_tokens;
  m.grown = true;
  m.set_caps();
  // CPU rule (attention/retro.cpp sync()): while the tokens after the indexed region number at least
  // window + update_tokens, the oldest update_tokens of them become update_clusters new clusters.
  while (index_update_due(m.n - m.idx_end(), m.cfg)) m.update(static_cast<cudaStream_t>(s));
}

// One index update: block k-means over [idx_end, idx_end + update_tokens) into the workspace, its outliers,
// then the block appended to the index arrays (new allocations, the old ones retired until the sync).
void RetroLayer::Impl::update(cudaStream_t st) {
  auto& m = *this;
  const int H = m.H, D = m.D;
  const int64_t b = m.idx_end(), U = m.cfg.update_tokens;
  const int Cu = m.cfg.update_clusters;
  if (m.n_idx == 0) m.idx_begin = b;  // the first clusters (CPU: indexed_begin = sink)
  const int64_t kv_stride = m.kv_stride;
  if (m.kv8 != nullptr) {
    // The block's int8 rows widened to bf16 [H, U, D]; k, v point U rows per head apart and b rows before the
    // buffer, so that the k-means and outlier kernels' row t of head h (t in [b, b + U), absolute token ids in
    // the index) is the buffer's (h * U + t - b). The address arithmetic stays in uintptr_t: only rows inside
    // the buffer are dereferenced.
    ensure(m.update_k, size_t(H) * size_t(U) * D * 2);
    ensure(m.update_v, size_t(H) * size_t(U) * D * 2);
    m.kv8->widen(b, U, m.update_k.as<uint16_t>(), m.update_v.as<uint16_t>(), st);
    const uintptr_t back = uintptr_t(b) * uintptr_t(D) * 2;
    m.k = reinterpret_cast<const uint16_t*>(reinterpret_cast<uintptr_t>(m.update_k.data()) - back);
    m.v = reinterpret_cast<const uint16_t*>(reinterpret_cast<uintptr_t>(m.update_v.data()) - back);
    m.kv_stride = U;
  }
  m.work.run(m.k, m.v, m.kv_stride, H, D, m.cfg, b, U, {0, static_cast<int>(U)}, {0, Cu}, st);
  m.split_outliers(st, 0, H);
  if (m.kv8 != nullptr) {
    m.k = m.v = nullptr;
    m.kv_stride = kv_stride;
  }
  const int Co = m.C;
  const int64_t no = m.n_idx;
  auto grow = [&](DeviceBuffer& buf, const DeviceBuffer& blk, size_t orow, size_t brow) {
    DeviceBuffer nb(std::max<size_t>(size_t(H) * (orow + brow), 16));
    if (orow > 0)
      RETROINFER_CUDA_CHECK(cudaMemcpy2DAsync(nb.data(), orow + brow, buf.data(), orow, orow, H, cudaMemcpyDeviceToDevice, st));
    RETROINFER_CUDA_CHECK(cudaMemcpy2DAsync(static_cast<char*>(nb.data()) + orow, orow + brow, blk.data(), brow, brow, H,
                                            cudaMemcpyDeviceToDevice, st));
    m.retired.push_back(std::move(buf));
    buf = std::move(nb);
  };
  if (m.keep_f32) grow(m.centroids, m.work.centroids, size_t(Co) * D * 4, size_t(Cu) * D * 4);
  if (m.int8_on) {  // the block's int8 copies, appended as the other arrays (no bf16 centroids are kept)
    DeviceBuffer bq8(std::max<size_t>(size_t(H) * Cu * D, 16)), bscl(std::max<size_t>(size_t(H) * Cu * 4, 16));
    m.quantize_rows(m.work.centroids_bf16, bq8, bscl, 0, size_t(H) * Cu, st);
    grow(m.centroids_q8, bq8, size_t(Co) * D, size_t(Cu) * D);
    grow(m.centroid_scale, bscl, size_t(Co) * 4, size_t(Cu) * 4);
    m.retired.push_back(std::move(bq8));  // read by the copies above until the sync
    m.retired.push_back(std::move(bscl));
  } else {
    grow(m.centroids_bf16, m.work.centroids_bf16, size_t(Co) * D * 2, size_t(Cu) * D * 2);
  }
  if (m.keep_f32) grow(m.value_sums, m.work.value_sums, size_t(Co) * D * 4, size_t(Cu) * D * 4);
  grow(m.value_sums_bf16, m.work.value_sums_bf16, size_t(Co) * D * 2, size_t(Cu) * D * 2);
  grow(m.sizes, m.work.sizes, size_t(Co) * 4, size_t(Cu) * 4);
  if (Co == 0) std::swap(m.mean, m.work.mean);  // no prefill index: the first block's mean for debug_state
  DeviceBuffer off(size_t(H) * (Co + Cu) * 4 + 4), mem(std::max<size_t>(size_t(H) * (no + U) * 4, 16)), asg;
  if (m.keep_assignment) asg = DeviceBuffer(std::max<size_t>(size_t(H) * (no + U) * 4, 16));
  detail::IndexAppendParams ap;
  ap.num_heads = H;
  ap.c_old = Co;
  ap.c_blk = Cu;
  ap.n_old = no;
  ap.n_blk = U;
  ap.off_old = m.offsets.as<int>();
  ap.mem_old = m.members.as<uint32_t>();
  ap.asg_old = m.keep_assignment ? m.assignment.as<int>() : nullptr;  // null: no assignment is kept
  ap.off_blk = m.work.offsets.as<int>();
  ap.mem_blk = m.work.members.as<uint32_t>();
  ap.asg_blk = m.keep_assignment ? m.work.assignment.as<int>() : nullptr;
  ap.off_new = off.as<int>();
  ap.mem_new = mem.as<uint32_t>();
  ap.asg_new = m.keep_assignment ? asg.as<int>() : nullptr;
  detail::launch_check(detail::index_append(ap, st), "index_append", st);
  m.retired.push_back(std::move(m.offsets));
  m.retired.push_back(std::move(m.members));
  m.retired.push_back(std::move(m.assignment));
  m.offsets = std::move(off);
  m.members = std::move(mem);
  m.assignment = std::move(asg);
  m.C = Co + Cu;
  m.n_idx = no + U;
  ++m.updates;
  m.size_workspace(st);  // synchronises, then frees the retired buffers
  // The update's k-means workspace (~(2 D + 36) bytes per block token and flat head) is not kept between
  // updates (every update_tokens steps): the plan counts it once, as a transient (session_planner.h); nor
  // are an 8-bit cache's widened block rows (4 D bytes per block token and flat head).
  m.work = KMeansWork{};
  m.update_k = DeviceBuffer{};
  m.update_v = DeviceBuffer{};
}

// Outlier zone (index/wave_index.h split_outliers) of the k-means result in the workspace: residuals,
// per-head top round(f * n) by residual (the selection kernel, ties to the lower token), removal from
// their clusters and compaction; their KV tokens go to the outlier lists.
void RetroLayer::Impl::split_outliers(cudaStream_t st, int64_t head0, int heads) {
  if (!outliers_on) return;
  const int64_t want = outlier_split_count(cfg.outlier_fraction, work.n);
  if (want == 0 || work.n == 0) return;
  const size_t Hs = heads;  // flat heads [head0, head0 + heads) of the layer are the run's heads 0 ..
  const size_t kv_at = size_t(head0) * size_t(kv_stride) * size_t(D);
  ensure(work.residual, Hs * work.n * 4);
  ensure(work.picked_ids, Hs * want * 4);
  ensure(work.picked_list, Hs * want * 4);
  ensure(work.picked_count, Hs * 4);
  ensure(work.picked_scratch, Hs * (want + 1) * 4);
  ensure(work.touched, Hs * work.C);
  ensure(work.sort_keys_out, Hs * work.n * 4);
  detail::OutlierParams op;
  op.keys = k + kv_at;
  op.values = v + kv_at;
  op.kv_stride = kv_stride;
  op.begin = work.begin;
  op.n = work.n;
  op.num_heads = heads;
  op.head_dim = D;
  op.num_clusters = work.C;
  op.residual = work.residual.as<float>();
  op.picked = work.picked_list.as<int>();
  op.picked_count = work.picked_count.as<int>();
  op.picked_stride = want;
  op.touched = work.touched.as<uint8_t>();
  op.centroids = work.centroids.as<float>();
  op.centroids_bf16 = work.centroids_bf16.as<uint16_t>();
  op.value_sums = work.value_sums.as<float>();
  op.value_sums_bf16 = work.value_sums_bf16.as<uint16_t>();
  op.sizes = work.sizes.as<int>();
  op.assignment = work.assignment.as<int>();
  op.members = work.members.as<uint32_t>();
  op.offsets = work.offsets.as<int>();
  op.members_out = work.sort_keys_out.as<uint32_t>();
  op.outliers = outliers.as<int>() + head0 * outlier_stride;
  op.outlier_count = outlier_count.as<int>() + head0;
  op.out_stride = outlier_stride;
  detail::launch_check(detail::outlier_residuals(op, st), "outlier_residuals", st);
  // Tokens as items of one token each: the selected ids come out ascending in the token list.
  detail::SelectParams se;
  se.scores = op.residual;
  se.num_heads = heads;
  se.group = 0;
  se.num_items = static_cast<int>(work.n);
  se.k_retrieval = static_cast<int>(want);
  se.k_estimation = 0;
  se.retrieval_ids = work.picked_ids.as<int>();
  se.page_tokens = 1;
  se.n_idx = work.n;
  se.idx_begin = 0;
  se.num_tokens = work.n;
  se.token_list = work.picked_list.as<int>();
  se.token_count = work.picked_count.as<int>();
  se.scan_scratch = work.picked_scratch.as<int>();
  se.list_stride = want;
  detail::launch_check(detail::select_and_expand(se, st), "select_and_expand(outliers)", st);
  detail::launch_check(detail::outlier_remove(op, st), "outlier_remove", st);
  std::swap(work.members, work.sort_keys_out);
}

void RetroLayer::decode(const float* q, float* out, Stream s) { decode_impl(q, out, s, nullptr); }

std::vector<std::pair<std::string, float>> RetroLayer::decode_stage_ms(const float* q, float* out) {
  std::vector<std::pair<std::string, float>> stages;
  decode_impl(q, out, nullptr, &stages);
  auto& m = *impl_;
  if (m.n_idx > 0 && phases_requested()) {
    // Phase stamps from one graph replay of the decode (the timed path: programmatic launches), cold L2 as
    // in the benchmark; nothing is allocated during the capture.
    ensure(m.phase, size_t(m.H) * detail::kPhaseSlots * 8);
    StreamHandle stream;
    struct On {
      bool& b;
      explicit On(bool& x) : b(x) { b = true; }
      ~On() { b = false; }
    };
    std::unique_ptr<CapturedGraph> graph;
    {
      On on(m.phase_on);
      graph = std::make_unique<CapturedGraph>(stream.get(), [&] { decode_impl(q, out, stream.get(), nullptr); });
    }
    if (phases_requested() == 2) {
      graph->launch(stream.get());  // warm-up; the stamps below are the second replay's
    } else {
      const char* pf = std::getenv("RETROINFER_PHASE_FLUSH");  // kernel_bench --flush read sets "read"
      if (pf != nullptr && pf[0] == 'r') flush_l2_read(stream.get());
      else flush_l2(stream.get());
    }
    graph->launch(stream.get());
    synchronize(stream.get());
    std::vector<uint64_t> raw(size_t(m.H) * detail::kPhaseSlots);
    m.phase.download(raw.data(), raw.size() * 8);
    for (auto& ph : detail::summarize_phases(raw, m.H)) stages.push_back(std::move(ph));
  }
  return stages;
}

void RetroLayer::decode_impl(const float* q, float* out, Stream s,
                             std::vector<std::pair<std::string, float>>* stages) {
  auto& m = *impl_;
  // Stage timing (diagnostics): an event after each stage on the stream, read at the end.
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  auto mark = [&](const char* name) {
    if (stages == nullptr) return;
    cudaEvent_t e;
    RETROINFER_CUDA_CHECK(cudaEventCreate(&e));
    RETROINFER_CUDA_CHECK(cudaEventRecord(e, static_cast<cudaStream_t>(s)));
    marks.emplace_back(name, e);
  };
  mark("start");
  RETROINFER_CHECK(m.n > 0, "RetroLayer::decode: build() was not called");
  RETROINFER_CHECK(q != nullptr && out != nullptr, "RetroLayer::decode: null q or out");
  auto st = static_cast<cudaStream_t>(s);
  if (m.n_idx == 0) {  // everything is steady zone: exact attention (the dense decode of DenseDecoder)
    detail::DenseDecodeArgs a;
    a.q = q;
    m.set_exact_rows(a);
    a.num_tokens = m.n;
    a.num_heads = m.H;
    a.group = m.G;
    a.head_dim = m.D;
    a.scale = m.scale;
    a.part_ml = m.part_ml.as<float2>();
    a.part_o = m.part_o.as<float>();
    a.max_splits = m.attn_splits;  // the workspace holds at least attn_splits + est_splits slots per head
    a.merge_counter = m.merge_counter.as<int>();
    a.out = out;
    detail::dense_decode(a, st, "dense_decode(retro)");
    mark("exact_attention");
    mark("combine");
  } else {
    detail::ZoneDecodeArgs a;
    detail::fill_index_args(a, m, m.offsets.as<int>(), q, out);
    if (m.int8_on) {
      a.centroids_q8 = m.centroids_q8.as<uint8_t>();
      a.centroid_scale = m.centroid_scale.as<float>();
    }
    m.set_exact_rows(a);
    a.exact_list = a.token_list;
    a.exact_count = a.token_count;
    a.exact_list_stride = m.list_cap;
    a.timing = stages != nullptr;
    if (m.phase_on) {  // decode_stage_ms's phase graph (the buffer is allocated before the capture)
      RETROINFER_CUDA_CHECK(cudaMemsetAsync(m.phase.data(), 0xff, size_t(m.H) * detail::kPhaseSlots * 8, st));
      a.phase = m.phase.as<uint64_t>();
    }
    std::function<void()> add_outliers;
    if (m.max_outliers > 0)
      add_outliers = [&] {
        detail::ListAppendParams lp;
        lp.num_heads = m.H;
        lp.src = m.outliers.as<int>();
        lp.src_count = m.outlier_count.as<int>();
        lp.src_stride = m.outlier_stride;
        lp.list = m.token_list.as<int>();
        lp.count = m.token_count.as<int>();
        lp.list_stride = m.list_cap;
        detail::launch_check(detail::list_append(lp, st), "list_append(outliers)", st);
      };
    detail::launch_zone_decode(a, st, mark, add_outliers);
  }
  m.decoded = true;
  if (stages != nullptr) {
    RETROINFER_CUDA_CHECK(cudaEventSynchronize(marks.back().second));
    for (size_t i = 1; i < marks.size(); ++i) {
      float ms = 0.0f;
      RETROINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, marks[i - 1].second, marks[i].second));
      stages->emplace_back(marks[i].first, ms);
    }
    for (auto& mk : marks) cudaEventDestroy(mk.second);
  }
}

int64_t RetroLayer::num_tokens() const { return impl_->n; }
int64_t RetroLayer::indexed_begin() const { return impl_->idx_begin; }
int64_t RetroLayer::indexed_tokens() const { return impl_->n_idx; }
int RetroLayer::num_clusters() const { return impl_->C; }
std::vector<double> RetroLayer::calibration_missed_mass(const float* q, int64_t n, Stream s) {
  Impl& m = *impl_;
  if (m.num_seqs != 1 || m.n_idx == 0 || m.C == 0 || n <= 0 || m.kv8 != nullptr) return {};
  RETROINFER_CHECK(q != nullptr && n <= m.n, "RetroLayer::calibration_missed_mass: ", n,
                   " calibration queries for a layer of ", m.n, " tokens (or a null q)");
  auto st = static_cast<cudaStream_t>(s);
  const int Hq = m.shape.num_heads_q;
  // Queries per pass: their rows of one KV head (x the group) within the kernels' limit.
  const int64_t slice = std::clamp<int64_t>(detail::calibration_max_rows(m.D) / m.G, 1, n);
  RETROINFER_CHECK(slice * m.G <= detail::calibration_max_rows(m.D), "RetroLayer::calibration_missed_mass: a group of ",
                   m.G, " query heads of dimension ", m.D, " exceeds the calibration kernels' ",
                   detail::calibration_max_rows(m.D), " rows");
  static_assert(detail::kCalibrationMultiples == index::kLayerBudgetMultipliers.size());
  AttentionConfig nominal = m.cfg;
  nominal.retrieval_fraction = m.nominal_retrieval;
  const std::array<int, detail::kCalibrationMultiples> counts = index::layer_budget_retrieval_counts(m.C, nominal);
  // Rows ranked per sort: a pass's rows, fewer when their keys would pass ~64 MiB (1M-token heads).
  const int pass_rows = static_cast<int>(slice * m.H);
  const int rank_rows = static_cast<int>(std::clamp<int64_t>((int64_t{4} << 20) / m.C, 1, pass_rows));
  const int64_t tiles = detail::calibration_tiles(m.n);
  const int64_t all_rows = n * m.H;
  // One workspace for the layer: tile and row statistics, token -> cluster, the pass's masses, the sort's keys
  // and temporary storage, every row's missed mass.
  size_t at = 0;
  const auto carve = [&at](size_t bytes) {
    const size_t off = at;
    at += (bytes + 255) / 256 * 256;
    return off;
  };
  const size_t o_tile = carve(size_t(slice) * Hq * tiles * sizeof(float2));
  const size_t o_row = carve(size_t(slice) * Hq * sizeof(float2));
  const size_t o_tc = carve(size_t(m.H) * m.n_idx * sizeof(int));
  const size_t mass_bytes = size_t(pass_rows) * m.C * sizeof(float);
  const size_t o_mass = carve(mass_bytes);
  const size_t o_keys = carve(size_t(rank_rows) * m.C * sizeof(uint64_t));
  const size_t o_sorted = carve(size_t(rank_rows) * m.C * sizeof(uint64_t));
  const size_t temp_bytes = detail::calibration_rank_temp_bytes(rank_rows, m.C);
  const size_t o_temp = carve(temp_bytes);
  const size_t o_missed = carve(size_t(all_rows) * detail::kCalibrationMultiples * sizeof(double));
  DeviceBuffer ws(at);
  char* base = ws.as<char>();
  auto* token_cluster = reinterpret_cast<int*>(base + o_tc);
  auto* mass = reinterpret_cast<float*>(base + o_mass);
  auto* missed_rows = reinterpret_cast<double*>(base + o_missed);
  detail::launch_check(detail::calibration_token_clusters(m.offsets.as<int>(), m.members.as<uint32_t>(), m.H, m.C,
                                                          m.n_idx, token_cluster, st),
                       "calibration_token_clusters", st);
  for (int64_t i0 = 0; i0 < n; i0 += slice) {
    detail::CalibrationMassParams p;
    p.n = static_cast<int>(std::min(slice, n - i0));
    p.q = q + i0 * Hq * m.D;
    p.k = m.k;
    p.kv_stride = m.kv_stride;
    p.num_tokens = m.n;
    p.first_pos = m.n - n + i0;
    p.num_heads_q = Hq;
    p.num_heads_kv = m.H;
    p.head_dim = m.D;
    p.scale = m.scale;
    p.tile_stats = reinterpret_cast<float2*>(base + o_tile);
    p.row_stats = reinterpret_cast<float2*>(base + o_row);
    p.token_cluster = token_cluster;
    p.idx_begin = m.idx_begin;
    p.n_idx = m.n_idx;
    p.clusters = m.C;
    p.group_mass = mass;
    const int rows = p.n * m.H;  // (query, KV head) rows of this pass, query-major
    RETROINFER_CUDA_CHECK(cudaMemsetAsync(mass, 0, size_t(rows) * m.C * sizeof(float), st));
    detail::launch_check(detail::calibration_row_stats(p, st), "calibration_row_stats", st);
    detail::launch_check(detail::calibration_cluster_mass(p, st), "calibration_cluster_mass", st);
    for (int r0 = 0; r0 < rows; r0 += rank_rows) {
      detail::CalibrationRankParams rp;
      rp.group_mass = mass + int64_t{r0} * m.C;
      rp.rows = std::min(rank_rows, rows - r0);
      rp.max_rows = rank_rows;
      rp.clusters = m.C;
      std::copy(counts.begin(), counts.end(), rp.counts);
      rp.keys = reinterpret_cast<uint64_t*>(base + o_keys);
      rp.keys_sorted = reinterpret_cast<uint64_t*>(base + o_sorted);
      rp.sort_temp = base + o_temp;
      rp.sort_temp_bytes = temp_bytes;
      rp.missed = missed_rows + (i0 * m.H + r0) * detail::kCalibrationMultiples;
      detail::launch_check(detail::calibration_rank(rp, st), "calibration_rank", st);
    }
  }
  std::vector<double> host(size_t(all_rows) * detail::kCalibrationMultiples);
  RETROINFER_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), missed_rows, host.size() * sizeof(double), cudaMemcpyDeviceToHost, st));
  RETROINFER_CUDA_CHECK(cudaStreamSynchronize(st));
  // Summed in row order, as the host ranking (index::add_missed_mass) would.
  std::vector<double> missed(detail::kCalibrationMultiples, 0.0);
  for (int64_t w = 0; w < all_rows; ++w)
    for (int k = 0; k < detail::kCalibrationMultiples; ++k)
      missed[k] += host[size_t(w) * detail::kCalibrationMultiples + k];
  for (double& x : missed) x /= static_cast<double>(n) * Hq;
  return missed;
}

void RetroLayer::set_retrieval_multiplier(double mult, Stream s) {
  RETROINFER_CHECK(mult > 0.0 && std::isfinite(mult), "RetroLayer: retrieval multiplier ", mult,
                   " is not a positive number");
  Impl& m = *impl_;
  m.cfg.retrieval_fraction = std::min(1.0, m.nominal_retrieval * mult);
  m.size_workspace(static_cast<cudaStream_t>(s));
}

int RetroLayer::n_retrieval() const { return impl_->n_r; }
int RetroLayer::n_estimation() const { return impl_->n_e; }
int64_t RetroLayer::num_updates() const { return impl_->updates; }
int64_t RetroLayer::max_outliers() const { return impl_->max_outliers; }
int64_t RetroLayer::retrieval_capacity() const { return impl_->most_retrieval; }
int64_t RetroLayer::device_bytes() const {
  const auto& m = *impl_;
  const KMeansWork& w = m.work;
  const DeviceBuffer* bufs[] = {&m.mean, &m.top_sum, &m.centroids, &m.centroids_bf16, &m.centroids_q8, &m.centroid_scale,
                                &m.value_sums, &m.value_sums_bf16, &m.sizes, &m.assignment, &m.members, &m.offsets,
                                &m.outliers, &m.outlier_count,
                                &m.logits, &m.norm_partial, &m.scores, &m.ret_ids, &m.est_ids, &m.scan_scratch,
                                &m.token_list, &m.token_count, &m.part_ml, &m.part_o, &m.merge_counter,
                                &m.sel_ws,
                                &m.phase, &w.seg_tokens,
                                &w.seg_clusters, &w.mean_partial, &w.mean, &w.centred_q8,
                                &w.centroids_q8, &w.centroid_scale, &w.centroids, &w.centroids_bf16, &w.value_sums, &w.value_sums_bf16, &w.sizes, &w.assignment,
                                &w.sort_keys, &w.sort_keys_out, &w.iota, &w.members, &w.offsets, &w.sort_temp,
                                &w.residual, &w.picked_ids, &w.picked_list, &w.picked_count, &w.picked_scratch,
                                &w.touched};
  int64_t b = 0;
  for (const DeviceBuffer* x : bufs) b += static_cast<int64_t>(x->bytes());
  return b;
}
void RetroLayer::release_build_workspace() {
  synchronize();  // the workspace may still be read by work queued before (the build is synchronous anyway)
  impl_->work = KMeansWork{};
}
void RetroLayer::release() {
  synchronize();  // queued work may still read the buffers
  const Impl& m = *impl_;
  AttentionConfig nominal = m.cfg;
  nominal.retrieval_fraction = m.nominal_retrieval;
  RetroLayer fresh(m.shape, nominal, m.num_seqs);
  Impl& f = *fresh.impl_;
  f.outliers_on = m.outliers_on;
  f.keep_f32 = m.keep_f32;
  f.keep_assignment = m.keep_assignment;
  f.build_group = m.build_group;
  f.kv8 = m.kv8;
  *this = std::move(fresh);
}
void RetroLayer::set_int8_kv(const KvInt8Cache* cache) {
  RETROINFER_CHECK(impl_->n == 0, "RetroLayer::set_int8_kv: call before build()");
  impl_->kv8 = cache;
}
void RetroLayer::set_keep_f32_index(bool keep) {
  RETROINFER_CHECK(impl_->n == 0, "RetroLayer::set_keep_f32_index: call before build()");
  impl_->keep_f32 = keep;
}
bool RetroLayer::int8_scoring() const { return impl_->int8_on; }
void RetroLayer::set_keep_assignment(bool keep) {
  RETROINFER_CHECK(impl_->n == 0, "RetroLayer::set_keep_assignment: call before build()");
  impl_->keep_assignment = keep;
}
void RetroLayer::set_build_group_seqs(int seqs) {
  RETROINFER_CHECK(seqs >= 0, "RetroLayer::set_build_group_seqs: sequences per k-means run must be >= 0 (0: all), got ",
                   seqs);
  impl_->build_group = seqs;
}
void RetroLayer::set_outlier_zone(bool on) {
  RETROINFER_CHECK(impl_->n == 0, "RetroLayer::set_outlier_zone: call before build()");
  impl_->outliers_on = on;
}
bool RetroLayer::outlier_zone() const { return impl_->outliers_on; }
std::vector<int32_t> RetroLayer::outliers(int flat_head) const {
  const auto& m = *impl_;
  RETROINFER_CHECK(flat_head >= 0 && flat_head < m.H, "RetroLayer::outliers: flat head ", flat_head, " outside [0, ",
                   m.H, ")");
  synchronize();
  int32_t cnt = 0;
  m.outlier_count.download(&cnt, 4, size_t(flat_head) * 4);
  std::vector<int32_t> out(cnt);
  if (cnt > 0) m.outliers.download(out.data(), size_t(cnt) * 4, size_t(flat_head) * m.outlier_stride * 4);
  return out;
}
int64_t RetroLayer::token_list_capacity() const { return impl_->list_cap; }

int64_t RetroLayer::last_exact_tokens() const {
  const auto& m = *impl_;
  if (m.n_idx == 0) return int64_t{m.H} * m.n;
  RETROINFER_CHECK(m.decoded, "RetroLayer::last_exact_tokens: call decode() first");
  std::vector<int32_t> cnt(m.H);
  m.token_count.download(cnt.data(), cnt.size() * 4);  // synchronous (after the decode's stream work)
  return std::accumulate(cnt.begin(), cnt.end(), int64_t{0});
}

void RetroLayer::copy_selection_async(int32_t* ids, int32_t* sizes, Stream s) const {
  const auto& m = *impl_;
  RETROINFER_CHECK(m.decoded, "RetroLayer::copy_selection_async: call decode() first");
  RETROINFER_CHECK(ids != nullptr && sizes != nullptr, "RetroLayer::copy_selection_async: null destination");
  auto st = static_cast<cudaStream_t>(s);
  if (m.n_r > 0)
    RETROINFER_CUDA_CHECK(cudaMemcpyAsync(ids, m.ret_ids.data(), size_t(m.H) * m.n_r * 4, cudaMemcpyDeviceToHost, st));
  if (m.C > 0)
    RETROINFER_CUDA_CHECK(cudaMemcpyAsync(sizes, m.sizes.data(), size_t(m.H) * m.C * 4, cudaMemcpyDeviceToHost, st));
}

double RetroLayer::decode_bytes_required() {
  auto& m = *impl_;
  const double H = m.H, D = m.D, io = 2.0 * H * m.G * D * 4;  // q and out
  if (m.n_idx == 0) return H * m.n * D * 4 + io;
  RETROINFER_CHECK(m.decoded, "RetroLayer::decode_bytes_required: call decode() first");
  std::vector<int32_t> cnt(m.H);
  m.token_count.download(cnt.data(), cnt.size() * 4);
  const double exact = std::accumulate(cnt.begin(), cnt.end(), 0.0);
  // Per cluster the scored centroid (int8 row + f32 scale with int8 scoring, else bf16) and its size.
  const double centroid = m.int8_on ? D + 4 : D * 2;
  return H * m.C * (centroid + 4) + H * m.n_e * D * 2 + exact * (D * 2 * 2 + 4) + io;
}

double RetroLayer::decode_bytes_moved() {
  auto& m = *impl_;
  double b = decode_bytes_required();
  if (m.n_idx == 0) return b;
  const double H = m.H, C = m.C, G = m.G, D = m.D;
  const int total = m.attn_splits + m.est_splits;
  b += H * G * C * 4 * 2;  // logits: written, read once for the scores
  b += H * C * 4 * 11;     // scores: written, read by the count, up to 8 radix passes and the compaction
  b += H * (m.n_r + m.n_e) * 4 * 2 + H * G * m.n_e * 4;  // ids written and read, estimation logits
  b += H * m.n_r * 8 * 2;                                  // CSR offsets and scan scratch
  b += 2.0 * H * total * G * (D + 2) * 4;                  // partial states written and merged
  return b;
}

RetroDebugState RetroLayer::debug_state(int flat_head) const {
  const auto& m = *impl_;
  RETROINFER_CHECK(flat_head >= 0 && flat_head < m.H, "RetroLayer::debug_state: flat head ", flat_head,
                   " outside [0, ", m.H, ")");
  RetroDebugState d;
  d.num_clusters = m.C;
  if (m.n_idx == 0) {  // decode attends densely to every (steady) token
    if (m.decoded) {
      d.token_list.resize(m.n);
      std::iota(d.token_list.begin(), d.token_list.end(), 0);
    }
    return d;
  }
  const size_t C = m.C, D = m.D, h = flat_head;
  auto get = [](auto& vec, const DeviceBuffer& buf, size_t count, size_t offset_elems) {
    vec.resize(count);
    buf.download(vec.data(), count * sizeof(vec[0]), offset_elems * sizeof(vec[0]));
  };
  synchronize();
  get(d.mean, m.mean, D, h * D);
  if (m.keep_f32) get(d.centroids, m.centroids, C * D, h * C * D);
  if (!m.int8_on) get(d.centroids_bf16, m.centroids_bf16, C * D, h * C * D);  // int8_on: none kept
  if (m.int8_on) {
    get(d.centroids_q8, m.centroids_q8, C * D, h * C * D);
    get(d.centroid_scale, m.centroid_scale, C, h * C);
  }
  if (m.keep_f32) get(d.value_sums, m.value_sums, C * D, h * C * D);
  get(d.value_sums_bf16, m.value_sums_bf16, C * D, h * C * D);
  get(d.sizes, m.sizes, C, h * C);
  if (m.keep_assignment) get(d.assignment, m.assignment, m.n_idx, h * m.n_idx);
  get(d.offsets, m.offsets, C + 1, h * C);
  const int32_t base = d.offsets[0];  // compact CSR: head h's members start at offsets[h * C]
  for (auto& o : d.offsets) o -= base;
  std::vector<uint32_t> mem;
  get(mem, m.members, size_t(d.offsets[C]), size_t(base));
  d.members.assign(mem.begin(), mem.end());
  if (!m.keep_assignment) {  // not kept on the device: the CSR's inverse (a token in no cluster is an outlier)
    d.assignment.assign(size_t(m.n_idx), -1);
    for (size_t c = 0; c < C; ++c)
      for (int32_t j = d.offsets[c]; j < d.offsets[c + 1]; ++j) {
        const int32_t t = d.members[size_t(j)];
        RETROINFER_CHECK(t >= 0 && t < m.n_idx, "RetroLayer::debug_state: member ", t, " of cluster ", c,
                         " outside the ", m.n_idx, " indexed tokens (internal error)");
        d.assignment[size_t(t)] = int32_t(c);
      }
  }
  if (!m.decoded) return d;
  get(d.logits, m.logits, size_t(m.G) * C, h * m.G * C);
  get(d.scores, m.scores, C, h * C);
  get(d.retrieval_ids, m.ret_ids, m.n_r, h * m.n_r);
  std::erase(d.retrieval_ids, -1);
  if (m.n_e > 0) {
    get(d.estimation_ids, m.est_ids, m.n_e, h * m.n_e);
    std::erase(d.estimation_ids, -1);
  }
  int32_t cnt = 0;
  m.token_count.download(&cnt, 4, h * 4);
  get(d.token_list, m.token_list, cnt, h * m.list_cap);
  return d;
}

}  // namespace retroinfer::cuda
