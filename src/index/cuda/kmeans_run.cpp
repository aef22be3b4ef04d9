// One GPU k-means run (kmeans_run.h): workspace sizing and the launch sequence.
#include "index/cuda/kmeans_run.h"

#include <algorithm>
#include <vector>

#include "kernels/cuda_check.h"
#include "index/cuda/kmeans_phases.h"

namespace retroinfer::cuda::detail {
namespace {
// (Re)allocates `buf` when it is smaller than `bytes` (grow only).
void ensure(DeviceBuffer& buf, size_t bytes) {
  if (buf.bytes() < bytes) buf = DeviceBuffer(bytes);
}
}  // namespace

void KMeansRun::prepare(int H, int D, int64_t first, int64_t count, const std::vector<int>& seg_t,
                        const std::vector<int>& seg_c, cudaStream_t st) {
  begin = first;
  n = count;
  S = static_cast<int>(seg_t.size()) - 1;
  C = seg_c.back();
  max_seg = max_seg_c = 0;
  for (int i = 0; i < S; ++i) {
    max_seg = std::max(max_seg, seg_t[i + 1] - seg_t[i]);
    max_seg_c = std::max(max_seg_c, seg_c[i + 1] - seg_c[i]);
  }
  const size_t items = size_t(H) * n, flat = size_t(H) * C;
  // Upload through the stream (pageable source: the copy completes before the call returns), only when a
  // table differs from the device's (a rebuild of the same length skips both copies and their host time).
  auto upload = [&](DeviceBuffer& buf, const std::vector<int>& table, std::vector<int>& on_device) {
    if (buf.bytes() >= table.size() * 4 && table == on_device) return;
    ensure(buf, table.size() * 4);
    RETROINFER_CUDA_CHECK(cudaMemcpyAsync(buf.data(), table.data(), table.size() * 4, cudaMemcpyHostToDevice, st));
    on_device = table;
  };
  upload(seg_tokens, seg_t, seg_t_dev);
  upload(seg_clusters, seg_c, seg_c_dev);
  ensure(mean_partial, size_t(H) * kMeanChunks * D * 4);
  ensure(mean, size_t(H) * D * 4);
  ensure(centred_q8, items * D);
  ensure(centroids_q8, flat * D);
  ensure(centroid_scale, flat * 4);
  ensure(centroids, flat * D * 4);
  ensure(centroids_bf16, flat * D * 2);
  ensure(value_sums, flat * D * 4);
  ensure(value_sums_bf16, flat * D * 2);
  ensure(sizes, flat * 4);
  ensure(assignment, items * 4);
  ensure(sort_keys, items * 4);
  ensure(sort_keys_out, items * 4);
  ensure(members, items * 4);
  ensure(offsets, (flat + 1) * 4);
  ensure(iota, items * 4);
  if (iota_items != int64_t(items) || iota_n != n) {
    std::vector<uint32_t> io(items);
    for (size_t i = 0; i < items; ++i) io[i] = static_cast<uint32_t>(i % n);
    RETROINFER_CUDA_CHECK(cudaMemcpyAsync(iota.data(), io.data(), items * 4, cudaMemcpyHostToDevice, st));
    RETROINFER_CUDA_CHECK(cudaStreamSynchronize(st));  // io is a local
    iota_items = int64_t(items);
    iota_n = n;
  }
  int bits = 1;
  while ((size_t{1} << bits) < flat) ++bits;
  ensure(sort_temp, std::max<size_t>(kmeans_sort_temp_bytes(int64_t(items), bits), 16));
}

KMeansKernelParams KMeansRun::params(const uint16_t* k, const uint16_t* v, int64_t kv_stride, int H, int D) const {
  KMeansKernelParams p;
  p.keys = k;
  p.values = v;
  p.kv_stride = kv_stride;
  p.idx_begin = begin;
  p.n_idx = n;
  p.num_heads = H;
  p.head_dim = D;
  p.num_clusters = C;
  p.num_segments = S;
  p.seg_token_begin = seg_tokens.as<int>();
  p.seg_cluster_begin = seg_clusters.as<int>();
  p.max_seg_tokens = max_seg;
  p.max_seg_clusters = max_seg_c;
  p.mean_partial = mean_partial.as<float>();
  p.mean = mean.as<float>();
  p.centred_q8 = centred_q8.as<int8_t>();
  p.centroids_q8 = centroids_q8.as<int8_t>();
  p.centroid_scale = centroid_scale.as<float>();
  p.centroids = centroids.as<float>();
  p.centroids_bf16 = centroids_bf16.as<uint16_t>();
  p.value_sums = value_sums.as<float>();
  p.value_sums_bf16 = value_sums_bf16.as<uint16_t>();
  p.sizes = sizes.as<int>();
  p.assignment = assignment.as<int>();
  p.sort_keys = sort_keys.as<uint32_t>();
  p.sort_keys_out = sort_keys_out.as<uint32_t>();
  p.iota = iota.as<uint32_t>();
  p.members = members.as<uint32_t>();
  p.offsets = offsets.as<int>();
  p.sort_temp = sort_temp.data();
  p.sort_temp_bytes = sort_temp.bytes();
  return p;
}

void KMeansRun::run(const uint16_t* k, const uint16_t* v, int64_t kv_stride, int H, int D, const AttentionConfig& cfg,
                    int64_t first, int64_t count, const std::vector<int>& seg_t, const std::vector<int>& seg_c,
                    cudaStream_t st) {
  prepare(H, D, first, count, seg_t, seg_c, st);
  const KMeansKernelParams p = params(k, v, kv_stride, H, D);
  KMeansPhaseEvents ev(st, kmeans_phase_timing());  // kernel_bench --kmeans-phases only
  launch_check(kmeans_mean(p, st), "kmeans_mean", st);
  launch_check(kmeans_init(p, st), "kmeans_init", st);
  ev.mark(kKmMeanInit);
  if (cfg.kmeans_segment_iters + cfg.kmeans_global_iters == 0) {
    launch_check(kmeans_assign(p, false, st), "kmeans_assign", st);
    ev.mark(kKmAssignSegment);
    launch_check(kmeans_group_pass(p, false, st), "kmeans_group", st);
    ev.mark(kKmGroup);
  }
  for (int it = 0; it < cfg.kmeans_segment_iters; ++it) {
    launch_check(kmeans_assign(p, false, st), "kmeans_assign(segment)", st);
    ev.mark(kKmAssignSegment);
    launch_check(kmeans_group_pass(p, false, st), "kmeans_group", st);
    ev.mark(kKmGroup);
    launch_check(kmeans_update(p, true, st), "kmeans_update(spherical)", st);
    ev.mark(kKmUpdate);
  }
  for (int it = 0; it < cfg.kmeans_global_iters; ++it) {
    launch_check(kmeans_assign(p, true, st), "kmeans_assign(global)", st);
    ev.mark(kKmAssignGlobal);
    launch_check(kmeans_group(p, st), "kmeans_group", st);
    ev.mark(kKmGroup);
    if (it + 1 == cfg.kmeans_global_iters) break;  // the last mean update runs inside the finalize
    launch_check(kmeans_update(p, false, st), "kmeans_update(mean)", st);
    ev.mark(kKmUpdate);
  }
  // After a global iteration its plain-mean update is fused into the finalize (one pass over the members).
  launch_check(kmeans_finalize(p, st, cfg.kmeans_global_iters > 0), "kmeans_finalize", st);
  ev.mark(kKmFinalize);
  ev.finish();
}

}  // namespace retroinfer::cuda::detail
