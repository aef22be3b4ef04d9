// The cluster selection kernel (select_cluster.cu: 8 CTAs of a thread-block cluster per head, the selection past
// 40960 items where the grid kernel does not apply) against the CPU rule "sort by (score desc, id asc), cut at
// k_r and k_r + k_e" and the host expansion of the retrieval items into the exact-token list, every output
// poisoned first. Inputs: the selection kernels' shared cases (select_test_util.h kSelectCases, 1 .. 40960
// items: item ranges of the 8 CTAs that are empty or hold a single item, exact ties split over the CTAs) and
// sizes past the bins kernel's limit: 1M tokens' 65532 clusters, exact ties and a narrow band over 100000
// items, 300001 items (more than the CTAs' shared memory holds: the scores read from global memory). The zero
// retrieval budget (k_r = 0, k_e > 0) is among them at every size: the estimation list then holds the k_e best
// items, as the bins and grid kernels select it. One "[select cluster]" line per case.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include "kernels/kernels.h"
#include "gpu_test_util.h"
#include "select_test_util.h"

namespace retroinfer {
namespace {

void run_cluster_case(const gputest::SelectCase& c, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(c, seed));
  const gputest::SelectInputs in = gputest::make_select_inputs(c, seed);
  const gputest::SelectOutputs o = gputest::run_select(
      in, "cluster", /*own_phase=*/false, {},
      [](const cuda::detail::SelectParams& p, cudaStream_t s) { return cuda::detail::select_and_expand_cluster(p, s); });
  int64_t max_out = 0;
  for (int h = 0; h < in.H && !::testing::Test::HasFailure(); ++h) {
    SCOPED_TRACE(testing::Message() << "head " << h);
    int64_t n_r = 0;
    const std::vector<int32_t> r = gputest::expect_cpu_rule_ids(in, o, h, &n_r);
    max_out = std::max(max_out, n_r);
    gputest::expect_token_list(in, o, h, r);
  }
  std::printf("[select cluster] %s H=%d N=%d k_r=%d k_e=%d levels=%d empty=%.2f P=%d steady=%d: CPU rule and "
              "expansion %s; max retrieval items %lld\n",
              c.name, in.H, in.N, c.k_r, c.k_e, c.levels, c.empty, c.page_tokens, int(c.steady),
              ::testing::Test::HasFailure() ? "FAILED (see above)" : "ok", (long long)max_out);
}

// Past the bins kernel's 40960 items. {name, heads, items, k_r, k_e, levels, empty, page_tokens, steady, pdl_prefetch,
// phases}
const gputest::SelectCase kLargeCases[] = {
    {"1M shape", 8, 65532, 1180, 15204, -1, 0.01, 0, true, false, false},
    {"1M shape, k_r 0", 2, 65532, 0, 15204, -1, 0.01, 0, true, false, false},
    {"1M ties", 2, 65536, 1180, 15204, 40, 0.0, 0, true, false, false},
    {"1M ties, k_r 0", 2, 65536, 0, 15204, 40, 0.0, 0, false, false, false},
    {"100000 band", 2, 100000, 300, 20000, -2, 0.0, 0, true, false, false},
    {"300001 pages, scores in global memory", 1, 300001, 5400, 69600, 1000, 0.02, 1, true, false, false},
    {"300001 pages, k_r 0", 1, 300001, 0, 69600, -1, 0.02, 1, true, false, false},
};

TEST(CudaSelectCluster, MatchesCpuRule) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 17000;
  for (const auto& c : gputest::kSelectCases) run_cluster_case(c, ++seed);
}

TEST(CudaSelectCluster, LargeShapesMatchCpuRule) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 17100;
  for (const auto& c : kLargeCases) run_cluster_case(c, ++seed);
}

}  // namespace
}  // namespace retroinfer
