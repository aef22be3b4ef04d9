// The grid selection (select_grid.cu: C CTAs per head meeting at per-head barriers, an exact radix select of
// both thresholds through three global histograms; the selection past 40960 items where it applies) against
// the one-CTA bins kernel on the same inputs in one process: retrieval and estimation ids, token lists, token
// counts and the scan scratch bit-identical (every output poisoned first and compared whole), the ids equal to
// the CPU rule "sort by (score desc, id asc), cut at k_r and k_r + k_e", the token lists equal to the host
// expansion, and the workspace all zero again after every launch (the layers zero it once). Each case runs at
// every chunk size that fits (8, 16, 32, 64 items per thread: one to 64 CTAs per head) and twice on one
// workspace. Past the bins kernel's 40960 items (1M tokens: 65536 clusters) the CPU rule and the expansion are
// the reference. Then the plan: where the kernel applies. One "[select grid]" line per case.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "gpu_test_util.h"
#include "select_test_util.h"

namespace retroinfer {
namespace {

// One grid launch with `ipt` items per thread (0: the plan's choice) on the zeroed workspace ws; *used: the
// ipt the launch took (0 when the plan does not apply).
gputest::SelectOutputs run_grid(const gputest::SelectInputs& in, cuda::DeviceBuffer& ws, int ipt, bool phases,
                                int* used) {
  *used = 0;
  return gputest::run_select(
      in, "grid", phases, {}, [&](const cuda::detail::SelectParams& p0, cudaStream_t s) {
        cuda::detail::SelectParams p = p0;
        p.grid_ws = ws.as<unsigned>();
        int plan_ipt = 0, chunks = 0;
        cudaError_t e = cuda::detail::select_grid_plan(p, &plan_ipt, &chunks);
        if (e != cudaSuccess) return e;
        if (ipt > 0) {
          const int64_t chunk = 256 * int64_t{ipt};
          chunks = static_cast<int>((p.num_items + chunk - 1) / chunk);
          plan_ipt = ipt;
        }
        if (plan_ipt == 0) return cudaErrorInvalidConfiguration;
        *used = plan_ipt;
        return cuda::detail::select_and_expand_grid(p, plan_ipt, chunks, s);
      });
}

// Whether every head's histograms and barrier count are zero (the state a launch must leave; the chunk counts
// and the barrier generation are scratch).
bool all_zero(const cuda::DeviceBuffer& ws) {
  using cuda::detail::kSelectGridWsWords;
  std::vector<unsigned> w(ws.bytes() / 4);
  ws.download(w.data(), ws.bytes());
  for (size_t h = 0; h < w.size() / kSelectGridWsWords; ++h) {
    const unsigned* x = w.data() + h * kSelectGridWsWords;
    if (!std::all_of(x, x + cuda::detail::kSelectGridWsZeroWords, [](unsigned v) { return v == 0u; })) return false;
    if (x[cuda::detail::kSelectGridWsBarWord] != 0u) return false;
  }
  return true;
}

void run_grid_case(const gputest::SelectCase& c, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(c, seed));
  const gputest::SelectInputs in = gputest::make_select_inputs(c, seed);
  const int H = in.H, N = in.N;
  const bool bins_ref = N <= cuda::detail::kSelectBinsMaxItems;  // the one-CTA kernel's limit
  gputest::SelectOutputs ref;
  if (bins_ref) ref = gputest::run_select(in, "bins", false);
  cuda::DeviceBuffer ws(cuda::detail::select_grid_ws_bytes(H));
  ws.fill_bytes(0);
  std::string sizes;
  bool same = true;
  gputest::SelectOutputs last;
  for (int ipt : {0, 8, 16, 32, 64}) {
    const int64_t chunks = (N + 256 * int64_t{ipt > 0 ? ipt : 8} - 1) / (256 * int64_t{ipt > 0 ? ipt : 8});
    int capacity = 0;
    ASSERT_EQ(cuda::detail::select_grid_capacity(ipt > 0 ? ipt : 8, c.k_r, &capacity), cudaSuccess);
    if (ipt > 0 && (chunks > cuda::detail::kSelectGridMaxChunks || H * chunks > capacity)) continue;
    for (int rep = 0; rep < 2; ++rep) {
      SCOPED_TRACE(testing::Message() << "ipt " << ipt << " rep " << rep);
      int used = 0;
      gputest::SelectOutputs o = run_grid(in, ws, ipt, c.phases && rep == 0, &used);
      if (ipt == 0) {
        ASSERT_GT(used, 0) << "the plan does not take the case";
      }
      EXPECT_TRUE(all_zero(ws)) << "workspace not zero after the launch";
      if (bins_ref && !gputest::expect_same_outputs(ref, o, "grid vs bins: ", "bins", "grid")) same = false;
      if (!bins_ref && !last.ret.empty() &&
          !gputest::expect_same_outputs(last, o, "grid vs grid: ", "earlier", "this")) same = false;
      if (c.phases && rep == 0) {
        for (int h = 0; h < H; ++h)
          for (int j = 2; j < 2 + 2 * cuda::detail::kSelPhases; ++j)
            EXPECT_NE(o.phase[size_t(h) * cuda::detail::kPhaseSlots + j], ~uint64_t{0}) << "head " << h << " slot " << j;
      }
      if (rep == 0) sizes += (sizes.empty() ? "" : ",") + std::to_string(used);
      last = std::move(o);
    }
  }
  for (int h = 0; h < H && !::testing::Test::HasFailure(); ++h) {
    SCOPED_TRACE(testing::Message() << "head " << h);
    const std::vector<int32_t> r = gputest::expect_cpu_rule_ids(in, last, h);
    gputest::expect_token_list(in, last, h, r);
  }
  std::printf("[select grid] %s H=%d N=%d k_r=%d k_e=%d levels=%d empty=%.2f P=%d steady=%d pdl=%d: items per "
              "thread %s; vs %s %s; CPU rule and expansion %s; workspace zero after each launch\n",
              c.name, H, N, c.k_r, c.k_e, c.levels, c.empty, c.page_tokens, int(c.steady), int(c.pdl_prefetch), sizes.c_str(),
              bins_ref ? "bins kernel" : "each other", same ? "identical" : "DIFFER",
              ::testing::Test::HasFailure() ? "FAILED (see above)" : "ok");
}

// Past the one-CTA kernel: Llama-3-8B's 512K and 1M shapes and a batch-16 head count.
// {name, heads, items, k_r, k_e, levels, empty, page_tokens, steady, pdl_prefetch, phases}
const gputest::SelectCase kLargeCases[] = {
    {"128K shape, 128 heads (batch 16)", 128, 8188, 148, 1900, -1, 0.01, 0, true, true, true},
    {"512K shape", 8, 32764, 590, 7602, -1, 0.01, 0, true, true, true},
    {"1M shape", 8, 65532, 1180, 15204, -1, 0.01, 0, true, true, true},
    {"1M ties", 2, 65536, 1180, 15204, 40, 0.0, 0, true, true, false},
    {"100000 band", 2, 100000, 300, 20000, -2, 0.0, 0, true, false, false},
    {"1M shape, 32 heads", 32, 65532, 1180, 15204, -1, 0.01, 0, true, true, false},
};

TEST(CudaSelectGrid, MatchesBinsAndCpuRule) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 19000;
  for (const auto& c : gputest::kSelectCases) run_grid_case(c, ++seed);
}

TEST(CudaSelectGrid, LargeShapesMatchCpuRule) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 19100;
  for (const auto& c : kLargeCases) run_grid_case(c, ++seed);
}

// The plan: no workspace or scores to form -> not applicable; Llama-3-8B at 128K batch 4 -> 8 items per thread.
TEST(CudaSelectGrid, Plan) {
  RETROINFER_REQUIRE_GPU();
  cuda::DeviceBuffer ws(cuda::detail::select_grid_ws_bytes(32));
  cuda::detail::SelectParams p;
  p.num_heads = 32;
  p.num_items = 8188;
  p.k_retrieval = 148;
  p.k_estimation = 1900;
  p.scores = reinterpret_cast<float*>(ws.data());  // any non-null pointer: the plan reads nothing
  int ipt = -1, chunks = -1;
  EXPECT_EQ(cuda::detail::select_grid_plan(p, &ipt, &chunks), cudaSuccess);
  EXPECT_EQ(ipt, 0) << "no workspace";
  p.grid_ws = ws.as<unsigned>();
  p.group = 4;
  EXPECT_EQ(cuda::detail::select_grid_plan(p, &ipt, &chunks), cudaSuccess);
  EXPECT_EQ(ipt, 0) << "scores to form (group > 0)";
  p.group = 0;
  EXPECT_EQ(cuda::detail::select_grid_plan(p, &ipt, &chunks), cudaSuccess);
  EXPECT_EQ(ipt, 8);
  EXPECT_EQ(chunks, 4);
  p.num_heads = 1 << 16;  // far more CTAs than fit at once: not applicable
  EXPECT_EQ(cuda::detail::select_grid_plan(p, &ipt, &chunks), cudaSuccess);
  EXPECT_EQ(ipt, 0);
  EXPECT_EQ(cuda::detail::select_and_expand_grid(p, 8, 4, nullptr), cudaErrorInvalidConfiguration);
  std::printf("[select grid] plan: no workspace / group > 0 / too many heads -> not applicable; 32 heads x 8188 "
              "items -> 8 items per thread, 4 CTAs per head %s\n",
              ::testing::Test::HasFailure() ? "FAILED" : "ok");
}

}  // namespace
}  // namespace retroinfer
