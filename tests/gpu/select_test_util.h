// Helpers of the selection kernels' tests (test_cuda_select_bins.cpp, test_cuda_select_cluster.cpp,
// test_cuda_select_grid.cpp): the shared cases of ready scores with their CSR clusters or pages (one generator,
// draw for draw), one launch into poisoned outputs downloaded whole, the whole-buffer comparison of two
// launches and the CPU rule (index::select_zones) on the ids.
#pragma once

#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "decode_path_test_util.h"
#include "gpu_test_util.h"
#include "index/wave_index.h"

namespace retroinfer::gputest {

struct SelectCase {
  const char* name;
  int heads, items, k_r, k_e;
  // levels > 0: scores from that many values (exact ties); 0: uniform, partly negative (Quest bounds);
  // -1: log-normal e^{3 N(0,1)}; -2: a band [1, 1 + 2^-10) behind one exact 0 (the threshold bin overflows:
  // the radix passes); -3: {-1, -0, +0, 1} (ties of signed zeros, which the order key tells apart).
  int levels;
  double empty;      // fraction of -inf items
  int page_tokens;   // > 0: pages; 0: CSR clusters of random sizes
  bool steady;       // a steady zone of > 0 tokens (else 0)
  bool pdl_prefetch;         // PDL launch and prefetches (the layers' default)
  bool phases;       // phase stamps on
};

// The selection kernels' shared cases ({name, heads, items, k_r, k_e, levels, empty, page_tokens, steady, pdl_prefetch,
// phases}): ready scores of 1 .. 40960 items, k_r / k_e including 0 and beyond the finite items, all -inf
// items, exact ties taken partially (few levels, signed zeros, the band that sends the bins kernel's threshold
// bin to its radix passes), CSR clusters and pages, steady zones, more than 1024 retrieval items.
inline const SelectCase kSelectCases[] = {
    {"one item", 3, 1, 1, 0, 0, 0.0, 0, true, true, false},
    {"two items", 2, 2, 1, 1, 0, 0.0, 4, false, false, false},
    {"k_r+k_e > finite", 2, 3, 1, 5, 0, 0.3, 0, true, true, false},
    {"k_r 0", 2, 5, 0, 3, 0, 0.0, 0, false, true, false},
    {"one warp tail", 2, 31, 2, 10, -1, 0.1, 0, true, true, false},
    {"half step - 1", 2, 127, 3, 30, 0, 0.0, 0, true, true, false},
    {"half step", 2, 128, 3, 30, 0, 0.0, 0, false, true, false},
    {"half step + 1", 2, 129, 3, 30, 0, 0.0, 0, true, false, false},
    {"step - 1", 1, 255, 5, 60, -1, 0.0, 0, true, true, false},
    {"step + 1", 1, 257, 5, 60, -1, 0.0, 0, true, true, true},
    {"1000 all empty", 2, 1000, 10, 100, 0, 1.0, 0, true, true, false},
    {"32K shape", 3, 2044, 37, 475, -1, 0.0, 0, true, true, true},
    {"32K ties partly taken", 2, 2044, 37, 475, 50, 0.0, 0, true, true, false},
    {"signed zero ties (bins)", 2, 2044, 300, 400, -3, 0.1, 0, true, true, false},
    {"k_r 0 ties (bins)", 2, 2044, 0, 300, 50, 0.0, 0, false, true, false},
    {"k_r+k_e > finite 2044", 2, 2044, 1000, 1500, 0, 0.2, 0, true, true, false},
    {"4097 tail", 2, 4097, 74, 950, 5, 0.05, 0, true, true, false},
    {"128K shape, 32 heads", 32, 8188, 148, 1900, -1, 0.01, 0, true, true, true},
    {"8188 uniform", 2, 8188, 148, 1900, 0, 0.01, 0, false, true, false},
    {"8188 ties, radix fallback", 2, 8188, 148, 1900, 5, 0.0, 0, true, true, false},
    {"8188 signed zeros, radix", 2, 8188, 148, 1900, -3, 0.0, 0, true, true, false},
    {"8188 band, radix fallback", 2, 8188, 148, 1900, -2, 0.0, 0, true, true, false},
    // No retrieval budget through the radix fallback: radix_select2 used to stop after its first pass when
    // k_r = 0 (threshold 0: every finite item went to the estimation list, past its end).
    {"k_r 0, radix fallback", 2, 8188, 0, 1900, 5, 0.0, 0, true, true, false},
    {"k_r 0, band radix", 2, 8188, 0, 1900, -2, 0.0, 0, false, true, false},
    {"8188 60% empty", 2, 8188, 148, 1900, -1, 0.6, 0, true, true, false},
    {"8188 no estimation", 2, 8188, 148, 0, 0, 0.0, 0, true, true, false},
    {"8188 > kBinExp retrieval", 2, 8188, 1500, 2000, -1, 0.0, 0, true, true, false},
    {"8192", 2, 8192, 148, 1900, 0, 0.0, 0, false, false, false},
    {"8193", 2, 8193, 148, 1900, 1000, 0.0, 0, true, true, false},
    {"pages (Quest)", 2, 8188, 148, 1900, 0, 0.0, 16, true, true, false},
    {"pages, no estimation", 2, 2044, 37, 0, 0, 0.0, 16, true, false, false},
    {"pages > kBinExp", 1, 8201, 9000, 10, 50, 0.2, 2, true, false, false},
    {"20000", 1, 20000, 1500, 4000, -1, 0.0, 0, true, true, false},
    {"40000", 2, 40000, 720, 9280, 40, 0.0, 0, true, true, false},
    {"40000 pages", 2, 40000, 720, 0, -1, 0.05, 1, false, true, false},
    {"40000 > 4 chunks", 1, 40000, 9000, 20000, -1, 0.0, 0, true, true, false},
    {"40960 (max)", 2, 40960, 738, 9503, 0, 0.0, 0, true, true, true},
};

// The case and seed for SCOPED_TRACE.
inline std::string describe(const SelectCase& c, uint64_t seed) {
  return (testing::Message() << c.name << " heads=" << c.heads << " items=" << c.items << " k_r=" << c.k_r
                             << " k_e=" << c.k_e << " levels=" << c.levels << " empty=" << c.empty
                             << " P=" << c.page_tokens << " steady=" << c.steady << " pdl_prefetch=" << c.pdl_prefetch
                             << " seed=" << seed)
      .GetString();
}

// The inputs of one case: host scores and CSR, device copies, the parameters without outputs (p.phase
// nullptr unless the test attaches d_phase).
struct SelectInputs {
  int H = 0, N = 0;
  std::vector<float> scores;      // [H, N]
  std::vector<int> offsets;       // [H N + 1] absolute (clusters)
  std::vector<uint32_t> members;  // [offsets[H N]]
  int64_t n_idx = 0, idx_begin = 0, num_tokens = 0, list_stride = 0;
  cuda::DeviceBuffer d_scores, d_offsets, d_members;
  cuda::DeviceBuffer d_phase;  // [H, kPhaseSlots] u64 when a test attaches one to p.phase (else empty)
  cuda::detail::SelectParams p;
};

// All outputs of one launch, downloaded whole (poison included).
struct SelectOutputs {
  std::vector<int> ret;      // [H, max(k_r, 1)] retrieval ids
  std::vector<int> est;      // [H, max(k_e, 1)] estimation ids
  std::vector<int> list;     // [H, list_stride] token lists
  std::vector<int> count;    // [H] token counts
  std::vector<int> scratch;  // [H, k_r + 1] scan scratch
  std::vector<uint64_t> phase;  // [H, kPhaseSlots] with own_phase (else empty)
  int per_head = 0;             // CTAs per head the launch used, where the before hook asks (else 0)
};

// Scores (one u01 draw per item, then one n01 draw for levels -1, then one u01 draw for the -inf test),
// then for clusters the sizes (head by head) and the members, all from one mt19937_64(seed): the order of
// the draws fixes the inputs of every case and seed.
inline SelectInputs make_select_inputs(const SelectCase& c, uint64_t seed) {
  SelectInputs in;
  in.H = c.heads;
  in.N = c.items;
  const int H = in.H, N = in.N, P = c.page_tokens;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  in.scores.resize(size_t(H) * N);
  for (size_t i = 0; i < in.scores.size(); ++i) {
    float& x = in.scores[i];
    const float v = u01(rng);
    if (c.levels > 0) x = float(int(v * c.levels)) / c.levels + 1e-3f;
    else if (c.levels == -1) x = std::exp(3.0f * n01(rng));
    else if (c.levels == -2) x = i % N == 0 ? 0.0f : 1.0f + v * 0x1p-10f;
    else if (c.levels == -3) x = v < 0.25f ? -1.0f : (v < 0.5f ? -0.0f : (v < 0.75f ? 0.0f : 1.0f));
    else x = (v - 0.3f) * 1e-3f;
    if (u01(rng) < c.empty) x = -INFINITY;
  }
  int64_t max_head_tokens = 0;
  if (P > 0) {
    in.n_idx = int64_t{N} * P - P / 2;  // the last page is short
    max_head_tokens = int64_t{std::max(c.k_r, 0)} * P;
  } else {
    // Cluster sizes: mostly 0 .. 32 (some empty), one in ten 40 .. 119 (more than one 32-token prefetch).
    in.offsets.resize(size_t(H) * N + 1);
    std::uniform_int_distribution<int> small(0, 32), large(40, 119), tenth(0, 9);
    int total = 0;
    for (int h = 0; h < H; ++h) {
      int head = 0;
      for (int k = 0; k < N; ++k) {
        in.offsets[size_t(h) * N + k] = total;
        const int sz = tenth(rng) == 0 ? large(rng) : small(rng);
        total += sz;
        head += sz;
      }
      max_head_tokens = std::max<int64_t>(max_head_tokens, head);
    }
    in.offsets[size_t(H) * N] = total;
    in.n_idx = std::max<int64_t>(max_head_tokens, 1);
    std::uniform_int_distribution<uint32_t> tok(0, uint32_t(in.n_idx - 1));
    in.members.resize(std::max(total, 1));
    for (auto& m : in.members) m = tok(rng);
  }
  in.idx_begin = c.steady ? 4 : 0;
  in.num_tokens = in.idx_begin + in.n_idx + (c.steady ? 60 : 0);
  const int64_t steady = in.num_tokens - in.n_idx;
  in.list_stride = steady + max_head_tokens + 1;  // + 1: a poisoned entry after every full list
  in.d_scores = upload(in.scores);
  auto& p = in.p;
  p.scores = in.d_scores.as<float>();
  p.num_heads = H;
  p.num_items = N;
  p.k_retrieval = c.k_r;
  p.k_estimation = c.k_e;
  p.page_tokens = P;
  p.n_idx = in.n_idx;
  p.idx_begin = in.idx_begin;
  p.num_tokens = in.num_tokens;
  p.list_stride = in.list_stride;
  p.pdl = p.prefetch = c.pdl_prefetch;
  if (P == 0) {
    in.d_offsets = upload(in.offsets);
    in.d_members = upload(in.members);
    p.offsets = in.d_offsets.as<int>();
    p.members = in.d_members.as<uint32_t>();
  }
  return in;
}

// One select_and_expand_bins launch on in.p (under whatever switches are set now) on a created stream
// (programmatic launches need one), into fresh output buffers filled with 0x7f bytes, each downloaded whole.
// own_phase: a fresh phase buffer ([H, kPhaseSlots] u64, 0xff = unstamped) replaces p.phase and is downloaded
// into phase; else p.phase is in.p.phase. before (optional): called with the full parameters and the outputs
// right before the launch. what names the launch in failure messages. launch (optional): the launch itself
// (default: select_and_expand_bins).
inline SelectOutputs run_select(const SelectInputs& in, const char* what, bool own_phase,
                                const std::function<void(const cuda::detail::SelectParams&, SelectOutputs&)>& before = {},
                                const std::function<cudaError_t(const cuda::detail::SelectParams&, cudaStream_t)>& launch = {}) {
  using cuda::detail::kPhaseSlots;
  const int H = in.H, k_r = in.p.k_retrieval, k_e = in.p.k_estimation;
  cuda::DeviceBuffer ret(size_t(H) * std::max(k_r, 1) * 4), est(size_t(H) * std::max(k_e, 1) * 4),
      list(size_t(H) * in.list_stride * 4), count(size_t(H) * 4), scratch(size_t(H) * (k_r + 1) * 4), phase;
  for (auto* b : {&ret, &est, &list, &count, &scratch}) b->fill_bytes(0x7f);
  if (own_phase) {
    phase = cuda::DeviceBuffer(size_t(H) * kPhaseSlots * 8);
    phase.fill_bytes(0xff);
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the memsets (legacy stream) before the created stream
  cuda::detail::SelectParams p = in.p;
  p.retrieval_ids = ret.as<int>();
  p.estimation_ids = k_e > 0 ? est.as<int>() : nullptr;
  p.token_list = list.as<int>();
  p.token_count = count.as<int>();
  p.scan_scratch = scratch.as<int>();
  if (own_phase) p.phase = phase.as<uint64_t>();
  SelectOutputs o;
  if (before) before(p, o);
  cuda::StreamHandle stream;  // programmatic launches on created streams only
  const cudaError_t e = launch ? launch(p, static_cast<cudaStream_t>(stream.get()))
                                : cuda::detail::select_and_expand_bins(p, static_cast<cudaStream_t>(stream.get()));
  EXPECT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess) << what;
  o.ret.resize(size_t(H) * std::max(k_r, 1));
  o.est.resize(size_t(H) * std::max(k_e, 1));
  o.list.resize(size_t(H) * in.list_stride);
  o.count.resize(H);
  o.scratch.resize(size_t(H) * (k_r + 1));
  ret.download(o.ret.data(), o.ret.size() * 4);
  est.download(o.est.data(), o.est.size() * 4);
  list.download(o.list.data(), o.list.size() * 4);
  count.download(o.count.data(), o.count.size() * 4);
  scratch.download(o.scratch.data(), o.scratch.size() * 4);
  if (own_phase) {
    o.phase.resize(size_t(H) * kPhaseSlots);
    phase.download(o.phase.data(), o.phase.size() * 8);
  }
  return o;
}

// The first index where a and b differ (-1: equal); sizes must match.
inline int64_t first_difference(const std::vector<int>& a, const std::vector<int>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return int64_t(i);
  return -1;
}

// The five int output buffers of two launches compared whole (poison included, so an entry one leaves
// unwritten differs too): one failure per differing buffer, "<prefix><buffer> differs at <i>: <x_name> <x[i]>,
// <y_name> <y[i]>". Returns whether all are identical.
inline bool expect_same_outputs(const SelectOutputs& x, const SelectOutputs& y, const std::string& prefix,
                                const char* x_name, const char* y_name) {
  const struct {
    const char* what;
    const std::vector<int>&x, &y;
  } bufs[] = {{"retrieval_ids", x.ret, y.ret},
              {"estimation_ids", x.est, y.est},
              {"token_list", x.list, y.list},
              {"token_count", x.count, y.count},
              {"scan_scratch", x.scratch, y.scratch}};
  bool same = true;
  for (const auto& buf : bufs) {
    const int64_t d = first_difference(buf.x, buf.y);
    if (d >= 0) {
      same = false;
      ADD_FAILURE() << prefix << buf.what << " differs at " << d << ": " << x_name << " " << buf.x[d] << ", "
                    << y_name << " " << buf.y[d];
    }
  }
  return same;
}

// Head h's ids in o against the production rule (index::select_zones: by (score desc, id asc), cut at k_r and
// k_r + k_e) on in.scores[h]: o's retrieval row [k_r] and estimation row [k_e] equal the rule's lists padded
// with -1. Returns the rule's retrieval ids padded with -1 to k_r; *n_retrieval (optional): how many before
// the padding.
inline std::vector<int32_t> expect_cpu_rule_ids(const SelectInputs& in, const SelectOutputs& o, int h,
                                                int64_t* n_retrieval = nullptr) {
  const int N = in.N, k_r = in.p.k_retrieval, k_e = in.p.k_estimation;
  index::ZoneSelection sel;
  index::select_zones(in.scores.data() + size_t(h) * N, N, ZoneCounts{k_r, k_e}, sel);
  std::vector<int32_t> r = std::move(sel.retrieval), e = std::move(sel.estimation);
  if (n_retrieval != nullptr) *n_retrieval = int64_t(r.size());
  r.resize(k_r, -1);
  e.resize(k_e, -1);
  EXPECT_EQ(std::vector<int>(o.ret.begin() + size_t(h) * k_r, o.ret.begin() + size_t(h + 1) * k_r), r);
  EXPECT_EQ(std::vector<int>(o.est.begin() + size_t(h) * k_e, o.est.begin() + size_t(h + 1) * k_e), e);
  return r;
}

// Head h's token list and count in o: the steady zone (the first idx_begin tokens, then those past the index)
// followed by the members of the retrieval ids r (ascending, -1 padded) in order, and the entry after the
// list still poisoned.
inline void expect_token_list(const SelectInputs& in, const SelectOutputs& o, int h, const std::vector<int32_t>& r) {
  const int N = in.N, P = in.p.page_tokens;
  std::vector<int> tokens;
  for (int64_t t = 0; t < in.idx_begin; ++t) tokens.push_back(int(t));
  for (int64_t t = in.idx_begin + in.n_idx; t < in.num_tokens; ++t) tokens.push_back(int(t));
  for (int id : r) {
    if (id < 0) break;
    if (P > 0) {
      for (int64_t t = int64_t{id} * P; t < std::min<int64_t>(int64_t{id + 1} * P, in.n_idx); ++t)
        tokens.push_back(int(in.idx_begin + t));
    } else {
      for (int j = in.offsets[size_t(h) * N + id]; j < in.offsets[size_t(h) * N + id + 1]; ++j)
        tokens.push_back(int(in.idx_begin + in.members[j]));
    }
  }
  ASSERT_EQ(o.count[h], int(tokens.size()));
  const auto row = o.list.begin() + size_t(h) * in.list_stride;
  EXPECT_EQ(std::vector<int>(row, row + tokens.size()), tokens);
  EXPECT_EQ(row[tokens.size()], 0x7f7f7f7f) << "written past the list";
}


}  // namespace retroinfer::gputest
