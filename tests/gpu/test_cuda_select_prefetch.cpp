// Issue #4's value-sum prefetch during the selection (RETROINFER_SELECT_PREFETCH, select_bins.cu
// prefetch_estimation_rows): extra CTAs of the bins selection put the likely estimation clusters' value-sum
// rows into L2 (prefetch.global.L2 only, no stores outside their shared memory), so a decode with the
// prefetch on must be bit-identical to one with it off: per flat head the logits, scores, retrieval and
// estimation ids and token list, and every output element, under on (2 CTAs per head), 1 and 16 CTAs per
// head; two graph replays captured with it on, and an eager decode after them, bit-identical too. Shapes:
// batch 1/4, head_dim 64/128, groups 1/4/8, a 128K x 8-head case (Llama-3-8B, batch 1 and 4: issue #4's),
// no estimation zone (n_e = 0: no prefetch CTA), all steady (no clusters). The switch itself: off / empty /
// unset = 0, on = 2, numbers 0..16, anything else throws retroinfer::Error (also from
// RetroLayer::decode_bytes_moved, which adds the prefetch's bound when on). One "[select prefetch]" line per
// case.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/kernels.h"
#include "decode_path_test_util.h"
#include "gpu_test_util.h"
#include "retroinfer/error.h"

namespace retroinfer {
namespace {

using gputest::decode_once;
using gputest::EnvGuard;
using gputest::PathCase;
using gputest::PathResult;

constexpr const char* kEnv = "RETROINFER_SELECT_PREFETCH";

void prefetch_case(const PathCase& rc, uint64_t seed) {
  SCOPED_TRACE(gputest::describe(rc, seed));
  gputest::PathLayer t = gputest::make_path_layer(rc, seed);
  cuda::RetroLayer& layer = *t.layer;

  EnvGuard env(kEnv, "off");
  const PathResult off = decode_once(t);
  const double req = layer.decode_bytes_required(), moved_off = layer.decode_bytes_moved();
  env.set("on");
  const PathResult on = decode_once(t);
  gputest::expect_identical(on, off, "prefetch on vs off");
  const double moved_on = layer.decode_bytes_moved();
  if (layer.n_estimation() > 0 && layer.num_clusters() > 0) {
    EXPECT_GT(moved_on, moved_off);  // the prefetch's bound is counted
  } else {
    EXPECT_EQ(moved_on, moved_off);
  }
  const auto cmp = gputest::compare(on.out, off.out);
  EXPECT_EQ(cmp.unwritten, 0);
  env.set("1");
  gputest::expect_identical(decode_once(t), off, "1 prefetch CTA per head vs off");
  env.set("16");
  gputest::expect_identical(decode_once(t), off, "16 prefetch CTAs per head vs off");
  env.set("on");
  // Graph replays captured with the prefetch on (the switch is read at capture) and an eager decode after.
  const PathResult e = gputest::expect_graph_replays(t, off.out);
  gputest::expect_identical(e, off, "eager after replays (on)");
  env.set("bogus");
  if (layer.num_clusters() > 0) {  // all steady: the dense bytes, no switch read
    EXPECT_THROW(layer.decode_bytes_moved(), Error);
  }
  std::printf("[select prefetch] H=%d G=%d d=%d n=%lld C=%d n_r=%d n_e=%d: logits, scores, ids, lists and outputs "
              "with prefetch on / 1 / 16 CTAs vs off identical%s; graph replays identical; moved/required "
              "off %.3f on %.3f\n",
              t.H, rc.group, rc.d, (long long)rc.n, layer.num_clusters(), layer.n_retrieval(), layer.n_estimation(),
              ::testing::Test::HasFailure() ? " NOT (see failures)" : "", moved_off / req, moved_on / req);
}

// ---- The kernel alone: select_and_expand_bins with and without prefetch CTAs on the same inputs ----

struct KernelCase {
  int heads, items, k_r, k_e, head_dim;
  int levels;      // 0: log-normal e^{3 N(0,1)} (continuous); > 0: that many score values (exact ties)
  double empty;    // fraction of -inf items (empty clusters)
};

// The prefetch CTAs' rule on the host (select_bins.cu prefetch_estimation_rows): bins of the top 12 bits of
// the non-negative scores, taken when above < k_r + k_e, cum > k_r and cum <= select_prefetch_max_rows.
std::vector<char> host_prefetch_set(const float* sc, int N, int k_r, int k_e) {
  std::vector<int64_t> hist(4096, 0);
  auto bin = [](float s) {
    uint32_t u;
    std::memcpy(&u, &s, 4);
    return int((u & 0x7fffffffu) >> 19);
  };
  for (int i = 0; i < N; ++i)
    if (sc[i] >= 0.0f) ++hist[size_t(bin(sc[i]))];
  std::vector<char> take_bin(4096, 0);
  const int64_t cap = cuda::detail::select_prefetch_max_rows(k_r, k_e);
  int64_t cum = 0;
  for (int b = 4095; b >= 0; --b) {
    const int64_t above = cum;
    cum += hist[size_t(b)];
    take_bin[size_t(b)] = above < k_r + k_e && cum > k_r && cum <= cap;
  }
  std::vector<char> in(size_t(N), 0);
  for (int i = 0; i < N; ++i) in[size_t(i)] = sc[i] >= 0.0f && take_bin[size_t(bin(sc[i]))];
  return in;
}

struct KernelRun {
  std::vector<int> ret, est, list, count, rows;
};

void kernel_case(const KernelCase& c, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "heads=" << c.heads << " items=" << c.items << " k_r=" << c.k_r
                                  << " k_e=" << c.k_e << " d=" << c.head_dim << " levels=" << c.levels
                                  << " empty=" << c.empty << " seed=" << seed);
  const int H = c.heads, N = c.items;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u01(0.0f, 1.0f);
  std::normal_distribution<float> n01(0.0f, 1.0f);
  std::vector<float> scores(size_t(H) * N);
  for (auto& x : scores) {
    x = c.levels > 0 ? float(int(u01(rng) * c.levels) + 1) / c.levels : std::exp(3.0f * n01(rng)) * 1e-4f;
    if (u01(rng) < c.empty) x = -INFINITY;
  }
  // CSR clusters of 0 .. 8 tokens (the expansion runs as in the layers).
  std::vector<int> offsets(size_t(H) * N + 1);
  std::uniform_int_distribution<int> size(0, 8);
  int total = 0, max_head = 1;
  for (int h = 0; h < H; ++h) {
    int head = 0;
    for (int k = 0; k < N; ++k) {
      offsets[size_t(h) * N + k] = total;
      const int sz = size(rng);
      total += sz;
      head += sz;
    }
    max_head = std::max(max_head, head);
  }
  offsets[size_t(H) * N] = total;
  std::vector<uint32_t> members(size_t(std::max(total, 1)));
  std::uniform_int_distribution<uint32_t> tok(0, uint32_t(max_head - 1));
  for (auto& m : members) m = tok(rng);
  const auto d_scores = gputest::upload(scores);
  const auto d_offsets = gputest::upload(offsets);
  const auto d_members = gputest::upload(members);
  cuda::DeviceBuffer vs(size_t(H) * N * c.head_dim * 2);  // value sums: only prefetched, never read
  vs.fill_bytes(0);
  cuda::detail::SelectParams p;
  p.scores = d_scores.as<float>();
  p.num_heads = H;
  p.num_items = N;
  p.k_retrieval = c.k_r;
  p.k_estimation = c.k_e;
  p.offsets = d_offsets.as<int>();
  p.members = d_members.as<uint32_t>();
  p.n_idx = max_head;
  p.idx_begin = 4;
  p.num_tokens = 4 + max_head + 16;
  p.list_stride = 4 + 16 + max_head + 1;
  p.pdl = p.prefetch = true;
  p.value_sums_bf16 = vs.as<uint16_t>();
  p.head_dim = c.head_dim;
  auto run = [&](int ctas) {
    const size_t ne = size_t(H) * std::max(c.k_e, 1);
    cuda::DeviceBuffer ret(size_t(H) * std::max(c.k_r, 1) * 4), est(ne * 4), list(size_t(H) * p.list_stride * 4),
        count(size_t(H) * 4), scratch(size_t(H) * (c.k_r + 1) * 4), rows(size_t(H) * 4);
    for (auto* b : {&ret, &est, &list, &count, &scratch}) b->fill_bytes(0x7f);
    rows.fill_bytes(0);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cuda::detail::SelectParams q = p;
    q.retrieval_ids = ret.as<int>();
    q.estimation_ids = c.k_e > 0 ? est.as<int>() : nullptr;
    q.token_list = list.as<int>();
    q.token_count = count.as<int>();
    q.scan_scratch = scratch.as<int>();
    q.prefetch_ctas = ctas;
    q.prefetch_rows = rows.as<int>();
    cuda::StreamHandle stream;
    const cudaError_t e = cuda::detail::select_and_expand_bins(q, static_cast<cudaStream_t>(stream.get()));
    EXPECT_EQ(e, cudaSuccess) << cudaGetErrorString(e);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    KernelRun r;
    r.ret.resize(size_t(H) * std::max(c.k_r, 1));
    r.est.resize(ne);
    r.list.resize(size_t(H) * p.list_stride);
    r.count.resize(size_t(H));
    r.rows.resize(size_t(H));
    ret.download(r.ret.data(), r.ret.size() * 4);
    est.download(r.est.data(), r.est.size() * 4);
    list.download(r.list.data(), r.list.size() * 4);
    count.download(r.count.data(), r.count.size() * 4);
    rows.download(r.rows.data(), r.rows.size() * 4);
    return r;
  };
  const KernelRun off = run(0);
  int64_t rows_sum = 0;
  double coverage_min = 1.0;
  for (int ctas : {1, 2, 3}) {
    SCOPED_TRACE(testing::Message() << ctas << " prefetch CTAs per head");
    const KernelRun on = run(ctas);
    EXPECT_EQ(on.ret, off.ret);
    EXPECT_EQ(on.est, off.est);
    EXPECT_EQ(on.list, off.list);
    EXPECT_EQ(on.count, off.count);
    for (int h = 0; h < H; ++h) {
      SCOPED_TRACE(testing::Message() << "head " << h);
      EXPECT_EQ(off.rows[size_t(h)], 0);  // no prefetch CTA without ctas
      const auto want = host_prefetch_set(scores.data() + size_t(h) * N, N, c.k_r, c.k_e);
      const int64_t n_want = std::count(want.begin(), want.end(), char(1));
      const int expect_rows = c.k_e > 0 ? int(n_want) : 0;
      EXPECT_EQ(on.rows[size_t(h)], expect_rows);
      EXPECT_LE(on.rows[size_t(h)], cuda::detail::select_prefetch_max_rows(c.k_r, c.k_e));
      if (ctas == 2) rows_sum += on.rows[size_t(h)];
      // Coverage: the estimation ids whose rows the rule prefetches.
      int est_n = 0, covered = 0;
      for (int j = 0; j < c.k_e; ++j) {
        const int id = off.est[size_t(h) * c.k_e + j];
        if (id < 0) continue;
        ++est_n;
        covered += want[size_t(id)];
      }
      if (est_n > 0) coverage_min = std::min(coverage_min, double(covered) / est_n);
    }
  }
  if (c.levels == 0 && c.k_e > 0) {
    EXPECT_GE(coverage_min, 0.9);  // continuous scores: only a capped boundary bin is left out
  }
  std::printf("[select prefetch] kernel heads=%d items=%d k_r=%d k_e=%d d=%d levels=%d empty=%.2f: outputs with "
              "1 / 2 / 3 prefetch CTAs per head vs none identical%s; rows per head %.1f (bound %lld), estimation "
              "coverage min %.3f\n",
              H, N, c.k_r, c.k_e, c.head_dim, c.levels, c.empty,
              ::testing::Test::HasFailure() ? " NOT (see failures)" : "", double(rows_sum) / H,
              (long long)cuda::detail::select_prefetch_max_rows(c.k_r, c.k_e), coverage_min);
}

TEST(CudaSelectPrefetch, KernelMatchesNone) {
  RETROINFER_REQUIRE_GPU();
  kernel_case({4, 8188, 148, 1900, 128, 0, 0.01}, 1001);  // issue #4's per-head shape, 4 heads
  kernel_case({2, 2044, 37, 475, 64, 0, 0.0}, 1002);      // 32K-like, d 64
  kernel_case({3, 1001, 10, 250, 128, 0, 0.3}, 1003);     // odd N (slices of uneven size), many empty
  kernel_case({2, 4000, 100, 1000, 128, 7, 0.0}, 1004);   // 7 score levels: huge bins, the cap
  kernel_case({2, 3000, 50, 0, 128, 0, 0.0}, 1005);       // k_e = 0: no prefetch CTA
  kernel_case({1, 40960, 300, 9000, 128, 0, 0.05}, 1006); // the bins kernel's largest N
}

TEST(CudaSelectPrefetch, Switch) {
  // The parse needs no device.
  EnvGuard env(kEnv, nullptr);
  EXPECT_EQ(cuda::detail::select_prefetch_ctas(), 0);
  env.set("");
  EXPECT_EQ(cuda::detail::select_prefetch_ctas(), 0);
  env.set("off");
  EXPECT_EQ(cuda::detail::select_prefetch_ctas(), 0);
  env.set("on");
  EXPECT_EQ(cuda::detail::select_prefetch_ctas(), 2);
  env.set("0");
  EXPECT_EQ(cuda::detail::select_prefetch_ctas(), 0);
  env.set("3");
  EXPECT_EQ(cuda::detail::select_prefetch_ctas(), 3);
  env.set("16");
  EXPECT_EQ(cuda::detail::select_prefetch_ctas(), 16);
  for (const char* bad : {"17", "-1", "+2", "2x", "ON", "yes", " 2", "100"}) {
    env.set(bad);
    EXPECT_THROW(cuda::detail::select_prefetch_ctas(), Error) << "value '" << bad << "'";
  }
  env.set("maybe");
  try {
    cuda::detail::select_prefetch_ctas();
    ADD_FAILURE() << "no throw";
  } catch (const Error& err) {
    const std::string what = err.what();
    EXPECT_NE(what.find("RETROINFER_SELECT_PREFETCH"), std::string::npos) << what;
    EXPECT_NE(what.find("off"), std::string::npos) << what;
    EXPECT_NE(what.find("on"), std::string::npos) << what;
  }
  std::printf("[select prefetch] switch: unset/empty/off/0 -> 0, on -> 2, 3 / 16 -> 3 / 16, bad values throw\n");
}

TEST(CudaSelectPrefetch, MatchesOff) {
  RETROINFER_REQUIRE_GPU();
  prefetch_case({1, 2, 4, 128, 5000, true, false, true}, 901);   // batch 1, G 4, d 128
  prefetch_case({4, 1, 1, 128, 3001, true, false, true}, 902);   // batch 4, G 1
  prefetch_case({1, 2, 8, 64, 9000, true, false, true}, 903);    // G 8, d 64
  prefetch_case({4, 2, 4, 64, 20011, true, false, false}, 904);  // batch 4, d 64, ~1250 clusters
  prefetch_case({1, 4, 1, 128, 2500, false, false, true}, 905);  // no estimation (n_e = 0): no prefetch CTA
  prefetch_case({1, 2, 4, 128, 30, true, false, true}, 906);     // all steady (no clusters)
}

// Llama-3-8B at 128K: issue #4's shape (batch 4) and batch 1.
TEST(CudaSelectPrefetch, MatchesOffBenchShapes) {
  RETROINFER_REQUIRE_GPU();
  prefetch_case({1, 8, 4, 128, 131072, true, false, false}, 911);
  prefetch_case({4, 8, 4, 128, 131072, true, false, false}, 912);
}

}  // namespace
}  // namespace retroinfer
