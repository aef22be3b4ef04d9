// The three zone-selection kernels on their own: the one-CTA-per-head radix kernel (3 passes of 11-bit
// digits for both thresholds), the one-CTA few-barrier kernel (one histogram over a key adapted to the score
// range, exact select among the threshold bins' candidates; the default up to 40K items) and the 8-CTA
// thread-block-cluster kernel (used past 40K items). From given scores with many exact ties, log-normal
// (softmax-like) scores, a narrow band behind one zero outlier, -inf items, tails around the 8-way split
// and the shared-memory limits, against the CPU
// rule "sort by (score desc, id asc), cut at k_r and k_r + k_e" and the page expansion of the retrieval
// ids. Outputs are poisoned first.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kernels/kernels.h"
#include "decode_path_test_util.h"
#include "gpu_test_util.h"
#include "index/wave_index.h"

namespace retroinfer {
namespace {

constexpr int kPoison = 0x7f7f7f7f;  // fill_bytes(0x7f): distinguishable from the -1 padding

struct SelectCase {
  // levels > 0: scores drawn from that many values (ties); 0: uniform, partly negative (Quest bounds);
  // -1: log-normal e^{3 N(0,1)} (softmax-like, many octaves); -2: a band [1, 1 + 2^-10) behind one exact 0
  // (the adapted key then puts the band into few bins: candidate overflow, the radix fallback).
  int heads, items, k_r, k_e, levels;
  double empty_fraction;               // items set to -inf
  int page_tokens;
};

// The production rule (index::select_zones) on scores sc[0 .. n), both id lists padded with -1 to k1 / k2
// entries as the kernels write them.
void cpu_select(const float* sc, int n, int k1, int k2, std::vector<int32_t>& r, std::vector<int32_t>& e) {
  index::ZoneSelection sel;
  index::select_zones(sc, n, ZoneCounts{k1, k2}, sel);
  r = std::move(sel.retrieval);
  e = std::move(sel.estimation);
  r.resize(k1, -1);
  e.resize(k2, -1);
}

// kBinsCsr: run 8's bins kernel on the clusters' path the layers take (CSR offsets and members, not pages),
// the pages given as clusters: offsets[h N + c] = h n_idx + min(c P, n_idx), members[h n_idx + j] = j, so the
// expansion must produce the same token list as the pages'.
enum class Kernel { kRadix, kBins, kCluster, kBinsRun8, kBinsCsr };

void run_select_case(const SelectCase& sc, uint64_t seed, Kernel kernel) {
  SCOPED_TRACE(testing::Message() << "heads=" << sc.heads << " items=" << sc.items << " k_r=" << sc.k_r
                                  << " k_e=" << sc.k_e << " levels=" << sc.levels << " empty="
                                  << sc.empty_fraction << " kernel=" << int(kernel) << " seed=" << seed);
  const int H = sc.heads, N = sc.items, P = sc.page_tokens;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> scores(size_t(H) * N);
  for (size_t i = 0; i < scores.size(); ++i) {
    float& x = scores[i];
    const float v = u01(rng);
    if (sc.levels > 0) x = float(int(v * sc.levels)) / sc.levels + 1e-3f;
    else if (sc.levels == -1) x = std::exp(3.0f * n01(rng));
    else if (sc.levels == -2) x = i % N == 0 ? 0.0f : 1.0f + v * 0x1p-10f;
    else x = (v - 0.3f) * 1e-3f;  // Quest bounds can be < 0
    if (u01(rng) < sc.empty_fraction) x = -INFINITY;
  }
  // Pages: item j covers index tokens [j P, min((j + 1) P, n_idx)); the last page is short.
  const int64_t n_idx = int64_t{N} * P - P / 2, idx_begin = 4, num_tokens = idx_begin + n_idx + 16;
  const int steady = int(num_tokens - n_idx);
  const int64_t list_stride = steady + int64_t{sc.k_r} * P;
  auto d_scores = gputest::upload(scores);
  cuda::DeviceBuffer ret(size_t(H) * sc.k_r * 4), est(size_t(H) * std::max(sc.k_e, 1) * 4),
      list(size_t(H) * list_stride * 4), count(size_t(H) * 4), scratch(size_t(H) * (sc.k_r + 1) * 4);
  for (auto* b : {&ret, &est, &list, &count}) b->fill_bytes(0x7f);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the memsets (legacy stream) before the non-blocking stream's kernel
  cuda::detail::SelectParams p;
  p.scores = d_scores.as<float>();
  p.num_heads = H;
  p.num_items = N;
  p.k_retrieval = sc.k_r;
  p.k_estimation = sc.k_e;
  p.retrieval_ids = ret.as<int>();
  p.estimation_ids = sc.k_e > 0 ? est.as<int>() : nullptr;
  p.page_tokens = P;
  p.n_idx = n_idx;
  p.idx_begin = idx_begin;
  p.num_tokens = num_tokens;
  p.token_list = list.as<int>();
  p.token_count = count.as<int>();
  p.scan_scratch = scratch.as<int>();
  p.list_stride = list_stride;
  // Run 8's bins kernel: launched with the programmatic-dependent attribute (no kernel before it here: the
  // wait returns at once), half-warp expansion, prefetches.
  p.pdl = p.prefetch = kernel == Kernel::kBinsRun8 || kernel == Kernel::kBinsCsr;
  cuda::DeviceBuffer d_offsets, d_members;
  if (kernel == Kernel::kBinsCsr) {
    std::vector<int> offsets(size_t(H) * N + 1);
    std::vector<uint32_t> members(size_t(H) * n_idx);
    for (int h = 0; h < H; ++h) {
      for (int c = 0; c < N; ++c)
        offsets[size_t(h) * N + c] = int(h * n_idx + std::min<int64_t>(int64_t{c} * P, n_idx));
      for (int64_t j = 0; j < n_idx; ++j) members[size_t(h) * n_idx + j] = uint32_t(j);
    }
    offsets[size_t(H) * N] = int(H * n_idx);
    d_offsets = gputest::upload(offsets);
    d_members = gputest::upload(members);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    p.page_tokens = 0;
    p.offsets = d_offsets.as<int>();
    p.members = d_members.as<uint32_t>();
  }
  cuda::StreamHandle stream;  // programmatic launches are used on created streams only
  const auto st = static_cast<cudaStream_t>(stream.get());
  const cudaError_t e = kernel == Kernel::kRadix  ? cuda::detail::select_and_expand_single_cta(p, st)
                       : kernel == Kernel::kBins || kernel == Kernel::kBinsRun8 || kernel == Kernel::kBinsCsr
                           ? cuda::detail::select_and_expand_bins(p, st)
                           : cuda::detail::select_and_expand_cluster(p, st);
  ASSERT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<int> g_ret(size_t(H) * sc.k_r), g_est(size_t(H) * sc.k_e), g_list(size_t(H) * list_stride), g_count(H);
  ret.download(g_ret.data(), g_ret.size() * 4);
  if (sc.k_e > 0) est.download(g_est.data(), g_est.size() * 4);
  list.download(g_list.data(), g_list.size() * 4);
  count.download(g_count.data(), g_count.size() * 4);
  for (int h = 0; h < H; ++h) {
    SCOPED_TRACE(testing::Message() << "head " << h);
    std::vector<int> r, es;
    cpu_select(&scores[size_t(h) * N], N, sc.k_r, sc.k_e, r, es);
    const std::vector<int> gr(g_ret.begin() + size_t(h) * sc.k_r, g_ret.begin() + size_t(h + 1) * sc.k_r);
    const std::vector<int> ge(g_est.begin() + size_t(h) * sc.k_e, g_est.begin() + size_t(h + 1) * sc.k_e);
    ASSERT_EQ(gr, r);
    ASSERT_EQ(ge, es);
    std::vector<int> tokens;
    for (int t = 0; t < idx_begin; ++t) tokens.push_back(t);
    for (int64_t t = idx_begin + n_idx; t < num_tokens; ++t) tokens.push_back(int(t));
    for (int c : r) {
      if (c < 0) break;
      for (int64_t t = int64_t{c} * P; t < std::min<int64_t>(int64_t{c + 1} * P, n_idx); ++t)
        tokens.push_back(int(idx_begin + t));
    }
    ASSERT_EQ(g_count[h], int(tokens.size()));
    const std::vector<int> gl(g_list.begin() + size_t(h) * list_stride, g_list.begin() + size_t(h) * list_stride + tokens.size());
    ASSERT_EQ(gl, tokens);
    if (tokens.size() < size_t(list_stride)) {
      EXPECT_EQ(g_list[size_t(h) * list_stride + tokens.size()], kPoison);
    }
  }
}

const SelectCase kCases[] = {
    {3, 1, 1, 0, 0, 0.0, 4},          {2, 7, 2, 3, 2, 0.0, 4},        {2, 9, 1, 7, 0, 0.3, 3},
    {5, 100, 2, 24, 3, 0.1, 16},      {1, 100, 5, 10, 0, 1.0, 16},    {3, 4097, 74, 950, 5, 0.05, 16},
    {4, 8188, 148, 1900, 0, 0.01, 16}, {2, 8188, 148, 1900, 7, 0.0, 16}, {2, 8188, 148, 0, 1, 0.0, 16},
    {1, 8201, 9000, 10, 50, 0.2, 2},  {2, 40000, 720, 9280, 40, 0.0, 1}, {1, 300001, 5400, 69600, 1000, 0.02, 1},
    {4, 8188, 148, 1900, -1, 0.01, 16}, {3, 2044, 37, 475, -1, 0.0, 16}, {2, 40000, 720, 9280, -1, 0.05, 16},
    {2, 8188, 148, 1900, -2, 0.0, 16},  {2, 8188, 148, 1900, 1000, 0.0, 16}, {1, 20000, 1500, 4000, -1, 0.0, 4},
};
constexpr int kBinsMaxItems = 40960;  // select_and_expand_bins: scores in 160 KiB of shared memory

TEST(CudaSelect, ClusterKernelMatchesCpuRule) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 1000;
  for (const auto& c : kCases) run_select_case(c, ++seed, Kernel::kCluster);
}

TEST(CudaSelect, BinsKernelMatchesCpuRule) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 3000;
  for (const auto& c : kCases)
    if (c.items <= kBinsMaxItems) run_select_case(c, ++seed, Kernel::kBins);
}

TEST(CudaSelect, BinsKernelRun8MatchesCpuRule) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 4000;
  for (const auto& c : kCases)
    if (c.items <= kBinsMaxItems) run_select_case(c, ++seed, Kernel::kBinsRun8);
}

// The clusters' CSR path (run 10's shared-memory offsets over it were removed after run 15).
TEST(CudaSelect, BinsKernelCsrMatchesCpuRule) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 5000;
  for (const auto& c : kCases)
    if (c.items <= kBinsMaxItems) run_select_case(c, ++seed, Kernel::kBinsCsr);
}

TEST(CudaSelect, SingleCtaKernelMatchesCpuRule) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 2000;
  for (const auto& c : kCases) run_select_case(c, ++seed, Kernel::kRadix);
}

}  // namespace
}  // namespace retroinfer
