// The selection's score formation as its own grid (kernels.h form_scores): the decode's formation where neither
// the bins selection nor the score grid can form the scores (layer_common.h ZoneDecodeArgs: G > 4, C % 4 != 0
// or past the bins kernel's items, with a score grid too large to be resident at once). A selection that formed
// them inside its one CTA per head would read, exponentiate and sum every logit of the head's G query heads on
// one multiprocessor (~12 us per head at 128K); here ceil(N / 1024) CTAs per head do it in one round of
// independent loads each, and the selection reads the finished scores (N floats instead of G * N logits).
#include <cuda_runtime.h>

#include "kernels/common.cuh"
#include "kernels/kernels.h"
#include "kernels/select_common.cuh"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kItemsPerCta = kFormThreads * kFormItemsPerThread;

// CTA (block b, head h): items [b * kItemsPerCta, (b + 1) * kItemsPerCta), thread tid owns items
// b * kItemsPerCta + tid + j * kFormThreads (j < kFormItemsPerThread: coalesced, all loads issued before
// any use). Warp g (< G) merges query head g's normaliser partials first (select_common.cuh
// merge_head_normaliser, as select_bins_kernel does; select_cluster_kernel's loop is the same arithmetic), so
// that every CTA of the head, and the selection kernels that form the scores themselves, get the same
// (M_g, 1 / L_g) bit for bit, and forms each score by the same form_head_score.
__global__ void __launch_bounds__(kFormThreads) form_scores_kernel(const FormScoresParams p) {
  __shared__ float gmax[kMaxGroup], ginv[kMaxGroup];
  const int h = blockIdx.y, N = p.num_items, G = p.group, tid = threadIdx.x;
  const int warp = tid >> 5;
  // PDL (p.pdl): the selection may launch now (it waits for this grid before reading the scores); the
  // logits and partials are read only after the score kernel has completed.
  grid_launch_dependents();
  grid_dependency_wait();
  if (warp < G) merge_head_normaliser(p.norm_partial + (int64_t{h} * G + warp) * p.norm_parts, p.norm_parts, warp, gmax, ginv);
  // The logit loads do not depend on the normaliser: issue them before the barrier.
  const int i0 = blockIdx.x * kItemsPerCta + tid;
  const float* lgh = p.logits + int64_t{h} * G * N;
  float lv[kFormItemsPerThread][kMaxGroup];
  load_logits<kFormItemsPerThread, false>(lv, lgh, N, G, i0, kFormThreads, N);
  __syncthreads();
  float* gsc = p.scores + int64_t{h} * N;
#pragma unroll
  for (int b = 0; b < kFormItemsPerThread; ++b) {
    const int i = i0 + b * kFormThreads;
    if (i >= N) break;
    gsc[i] = form_head_score(lv[b], G, gmax, ginv);  // select_bins_kernel's, bit for bit
  }
}

}  // namespace

cudaError_t form_scores(const FormScoresParams& p, cudaStream_t s) {
  if (p.num_items == 0 || p.num_heads == 0) return cudaSuccess;  // nothing indexed: no scores
  if (p.group < 1 || p.group > kMaxGroup || p.num_items < 0 || p.num_heads < 0) return cudaErrorInvalidValue;
  const dim3 grid((p.num_items + kItemsPerCta - 1) / kItemsPerCta, p.num_heads);
  if (grid.y > 65535u) return cudaErrorInvalidValue;
  return launch_maybe_pdl(form_scores_kernel, grid, dim3(kFormThreads), 0, s, p.pdl, p);
}

}  // namespace retroinfer::cuda::detail
