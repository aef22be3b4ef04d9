// Zone selection (docs/design.md §2 "Scoring"; also Quest's page selection): the kernel for a launch is chosen by
// the number of items per head, each kernel giving the same result ("sort by (score desc, id asc) and cut at
// k_r and k_r + k_e", ids ascending, the retrieval items expanded into the head's exact-token list after the
// steady zone):
//   up to kSelectGridMinItems = 40960 items: the one-CTA-per-head bins kernel (select_bins.cu), whose scores
//     live in its shared memory;
//   beyond, where the caller gives a workspace and the scores are ready (group 0): the grid kernel
//     (select_grid.cu, several CTAs per head), if all its CTAs are resident at once;
//   else the 8-CTA thread-block-cluster kernel (select_cluster.cu).
// Below the bins kernel's limit the other two are slower: the cluster kernel costs ~47 us per head at 32K
// batch 1 whatever the size (a chain of ~50 barrier phases, several through distributed shared memory) and
// grows with the batch, the grid kernel's per-head barriers cost more than one multiprocessor's work (128K
// batch 4: 23.7 against 12.3 us). Past it, the grid kernel beats the cluster kernel (1M tokens, batch 1: 29
// against 76 us).
#include <cuda_runtime.h>

#include "kernels/kernels.h"

namespace retroinfer::cuda::detail {

cudaError_t select_and_expand(const SelectParams& p, cudaStream_t s) {
  if (p.grid_ws != nullptr && p.num_items > kSelectGridMinItems) {
    int ipt = 0, chunks = 0;
    const cudaError_t e = select_grid_plan(p, &ipt, &chunks);
    if (e != cudaSuccess) return e;
    if (ipt > 0) return select_and_expand_grid(p, ipt, chunks, s);
  }
  if (p.num_items > kSelectBinsMaxItems) return select_and_expand_cluster(p, s);
  return select_and_expand_bins(p, s);
}

}  // namespace retroinfer::cuda::detail
