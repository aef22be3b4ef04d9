// The bins selection kernel (select_bins.cu: one CTA per head, the selection up to 40960 items) against the CPU
// rule "sort by (score desc, id asc), cut at k_r and k_r + k_e" and the host expansion of the retrieval items
// into the exact-token list. Inputs: the selection kernels' shared cases (select_test_util.h kSelectCases:
// ready scores of 1 .. 40960 items with tails around the compaction's 128-item halves and 256-item steps,
// k_r / k_e including 0, k_r + k_e beyond the finite items, many and all -inf items, exact ties taken partially
// at a threshold (few levels; signed zeros; the band that overflows the threshold bin into the radix passes),
// CSR clusters of random sizes and pages (Quest), steady zones of 0 and > 0 tokens, more than 1024 retrieval
// items) and a 128-head grid of more than one wave. Every case runs twice, plainly and as the layers launch it
// (programmatic dependent launch, the CSR offsets and members prefetched, a half-warp per expanded item): the
// two launches' outputs (ids, token lists, counts, the scan scratch) bit-identical, every output poisoned first
// and compared whole; with stamps on, every head's selection phases stamped. One "[select bins]" line per case.
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

// Whether every head has all its selection phase stamps (slots 2 .. 2 + 2 kSelPhases; 0xff.. = unwritten).
bool all_phases_stamped(const std::vector<uint64_t>& phase, int H) {
  using cuda::detail::kPhaseSlots;
  using cuda::detail::kSelPhases;
  for (int h = 0; h < H; ++h)
    for (int j = 2; j < 2 + 2 * kSelPhases; ++j)
      if (phase[size_t(h) * kPhaseSlots + j] == ~uint64_t{0}) return false;
  return true;
}

void run_bins_case(const gputest::SelectCase& c, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(c, seed));
  gputest::SelectInputs in = gputest::make_select_inputs(c, seed);
  in.p.pdl = in.p.prefetch = false;
  const gputest::SelectOutputs plain = gputest::run_select(in, "plain", c.phases);
  in.p.pdl = in.p.prefetch = true;
  const gputest::SelectOutputs layer = gputest::run_select(in, "pdl + prefetch", c.phases);
  const bool same = gputest::expect_same_outputs(plain, layer, "", "plain", "pdl + prefetch");
  if (c.phases) {
    EXPECT_TRUE(all_phases_stamped(plain.phase, in.H)) << "plain";
    EXPECT_TRUE(all_phases_stamped(layer.phase, in.H)) << "pdl + prefetch";
  }
  int64_t max_out = 0;
  for (int h = 0; h < in.H && !::testing::Test::HasFailure(); ++h) {
    SCOPED_TRACE(testing::Message() << "head " << h);
    int64_t n_r = 0;
    const std::vector<int32_t> r = gputest::expect_cpu_rule_ids(in, plain, h, &n_r);
    max_out = std::max(max_out, n_r);
    gputest::expect_token_list(in, plain, h, r);
  }
  std::printf("[select bins] %s H=%d N=%d k_r=%d k_e=%d levels=%d empty=%.2f P=%d steady=%d phases=%d: plain vs "
              "pdl + prefetch %s; CPU rule and expansion %s; max retrieval items %lld\n",
              c.name, in.H, in.N, c.k_r, c.k_e, c.levels, c.empty, c.page_tokens, int(c.steady), int(c.phases),
              same ? "identical" : "DIFFER", ::testing::Test::HasFailure() ? "FAILED (see above)" : "ok",
              (long long)max_out);
}

// {name, heads, items, k_r, k_e, levels, empty, page_tokens, steady, pdl_prefetch, phases}
const gputest::SelectCase kExtraCases[] = {
    {"one item, estimation only", 3, 1, 0, 1, 0, 0.0, 0, true, true, true},
    {"128K shape, 128 heads (batch 16)", 128, 8188, 148, 1900, -1, 0.01, 0, true, true, true},
};

TEST(CudaSelectBins, MatchesCpuRule) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 16000;
  for (const auto& c : gputest::kSelectCases) run_bins_case(c, ++seed);
  for (const auto& c : kExtraCases) run_bins_case(c, ++seed);
}

// More items than its shared memory holds: refused before any launch.
TEST(CudaSelectBins, RefusesMoreThanItsLimit) {
  RETROINFER_REQUIRE_GPU();
  cuda::detail::SelectParams p;
  p.num_heads = 1;
  p.num_items = cuda::detail::kSelectBinsMaxItems + 1;
  EXPECT_EQ(cuda::detail::select_and_expand_bins(p, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace retroinfer
