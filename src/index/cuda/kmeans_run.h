// One GPU k-means run (docs/design.md §2; kernels in kmeans.cu, kmeans_assign.cu, kmeans_group.cu,
// kmeans_sort.cu): the device workspace and result of kmeans_kernels.h KMeansKernelParams, sized for a run over
// the index tokens [begin, begin + n) of H flat heads with C clusters in S segments, and the launch sequence
// of the algorithm. RetroLayer's builds and index updates (retro_layer.cpp KMeansWork) and the k-means GPU
// tests use it. Included only from src/attention/cuda and tests/gpu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kernels/kernels.h"
#include "retroinfer/attention_config.h"
#include "retroinfer/cuda_device.h"

namespace retroinfer::cuda::detail {

// Threading: one host thread at a time; the buffers are used by the work queued on the stream given to
// prepare / run until that work completes.
struct KMeansRun {
  // Shapes as KMeansKernelParams' fields of the same names (C = the run's clusters, n_idx = n).
  DeviceBuffer seg_tokens, seg_clusters, mean_partial, mean, centred_q8, centroids, centroids_bf16,
      centroids_q8, centroid_scale, value_sums, value_sums_bf16, sizes, assignment, sort_keys, sort_keys_out, iota,
      members, offsets, sort_temp;
  int64_t iota_items = -1, iota_n = -1;  // the iota's contents (rebuilt when the shape changes)
  std::vector<int> seg_t_dev, seg_c_dev;  // the segment tables on the device (uploaded when they change)
  int C = 0, S = 0, max_seg = 0, max_seg_c = 0;
  int64_t begin = 0, n = 0;  // first KV token and token count of the run

  // Sizes every buffer (grow only) for a run over tokens [first, first + count) of H flat heads of head_dim
  // D, and uploads the segment tables (seg_t / seg_c: the segments' token and cluster prefix sums,
  // kmeans.h) and the iota through st; the host vectors may be freed when it returns.
  void prepare(int H, int D, int64_t first, int64_t count, const std::vector<int>& seg_t, const std::vector<int>& seg_c,
               cudaStream_t st);
  // The parameters of a run over keys k and values v ([H, kv_stride, D] bf16) into these buffers (after
  // prepare).
  KMeansKernelParams params(const uint16_t* k, const uint16_t* v, int64_t kv_stride, int H, int D) const;
  // prepare, then the segmented k-means of cfg (kmeans_segment_iters spherical segment iterations,
  // kmeans_global_iters plain-mean global ones; with none, one segment assignment) and its final outputs.
  // Asynchronous on st; while set_kmeans_phase_timing(true) is in force (kmeans_phases.h) it also times
  // the phases and waits for the run.
  void run(const uint16_t* k, const uint16_t* v, int64_t kv_stride, int H, int D, const AttentionConfig& cfg,
           int64_t first, int64_t count, const std::vector<int>& seg_t, const std::vector<int>& seg_c, cudaStream_t st);
};

}  // namespace retroinfer::cuda::detail
