// RetroLayer::make_cluster_contiguous (kernel_bench --layout clustered): the indexed K/V rows rewritten in
// cluster order. Attention does not depend on row order, so the decode after the rewrite equals the one before
// up to summation order, with the same selection; the rows really are each cluster's members, in CSR order;
// the refusals. One "[retro layout]" line per case.
#include <gtest/gtest.h>

#include <cstdio>
#include <vector>

#include "gpu_test_util.h"
#include "retroinfer/cuda_backend.h"
#include "retroinfer/error.h"

namespace retroinfer {
namespace {

using gputest::make_kv;
using gputest::make_q;

struct LayoutCase {
  int heads_kv, group, d;
  int64_t n;
};

void run_layout_case(const LayoutCase& c, uint64_t seed) {
  const AttentionShape shape{c.heads_kv * c.group, c.heads_kv, c.d};
  const gputest::KvData kv = make_kv(c.heads_kv, c.n, c.n, c.d, seed);
  const std::vector<float> q = make_q(kv, c.group, seed + 1);
  cuda::DeviceBuffer dk = gputest::upload(kv.k), dv = gputest::upload(kv.v), dq = gputest::upload(q);
  AttentionConfig cfg;
  cfg.tokens_per_cluster = 16;
  cuda::RetroLayer layer(shape, cfg, 1);
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), c.n, c.n);
  const size_t outs = q.size();
  cuda::DeviceBuffer o1 = gputest::poisoned(outs), o2 = gputest::poisoned(outs);
  layer.decode(dq.as<float>(), o1.as<float>());
  std::vector<cuda::RetroDebugState> before;
  for (int h = 0; h < c.heads_kv; ++h) before.push_back(layer.debug_state(h));
  layer.make_cluster_contiguous(dk.as<uint16_t>(), dv.as<uint16_t>());
  layer.decode(dq.as<float>(), o2.as<float>());
  const auto a = gputest::download_f32(o1, outs), b = gputest::download_f32(o2, outs);
  // Summation order only (the same tokens, other splits of the online softmax): run 9's bounds against run 8
  // (tests/gpu/decode_path_test_util.h derivation: ~2^-18 relative per regrouping of outputs |o| <= ~4.5).
  const gputest::Compare cmp = gputest::compare(b, a);
  EXPECT_EQ(cmp.unwritten, 0);
  EXPECT_LT(cmp.max_abs, 5e-5);
  EXPECT_LT(cmp.nmse, 1e-10);
  std::vector<uint16_t> k_after(kv.k.size());
  dk.download(k_after.data(), k_after.size() * 2);
  for (int h = 0; h < c.heads_kv; ++h) {
    const cuda::RetroDebugState& s0 = before[size_t(h)];
    const cuda::RetroDebugState s1 = layer.debug_state(h);
    EXPECT_EQ(s1.retrieval_ids, s0.retrieval_ids) << "head " << h;
    EXPECT_EQ(s1.estimation_ids, s0.estimation_ids) << "head " << h;
    EXPECT_EQ(s1.offsets, s0.offsets) << "head " << h;
    ASSERT_EQ(s1.members.size(), s0.members.size());
    for (size_t j = 0; j < s1.members.size(); ++j) ASSERT_EQ(s1.members[j], int32_t(j)) << "head " << h;
    // Row idx_begin + j now holds the rows of the j-th member before the rewrite (idx_begin = the sinks), and
    // position j's cluster is the one whose CSR range holds j.
    const int64_t idx_begin = cfg.sink_tokens;
    for (size_t j = 0; j < s0.members.size(); ++j) {
      const int64_t from = idx_begin + s0.members[j], to = idx_begin + int64_t(j);
      for (int i = 0; i < c.d; ++i)
        ASSERT_EQ(k_after[(size_t(h) * c.n + size_t(to)) * c.d + i], kv.k[(size_t(h) * c.n + size_t(from)) * c.d + i])
            << "head " << h << " row " << to;
    }
    if (!s1.assignment.empty()) {
      for (int cl = 0; cl < s0.num_clusters; ++cl)
        for (int32_t j = s0.offsets[size_t(cl)]; j < s0.offsets[size_t(cl) + 1]; ++j)
          ASSERT_EQ(s1.assignment[size_t(j)], cl) << "head " << h << " position " << j;
    }
  }
  std::printf("[retro layout] Hkv %d G %d d %d n %lld: nmse %.2e max-abs %.2e, selection unchanged, members = rows\n",
              c.heads_kv, c.group, c.d, static_cast<long long>(c.n), cmp.nmse, cmp.max_abs);
}

TEST(CudaRetroLayout, DecodeUnchangedAndRowsInClusterOrder) {
  RETROINFER_REQUIRE_GPU();
  const LayoutCase cases[] = {{2, 4, 128, 5000}, {3, 3, 64, 9000}, {1, 8, 128, 20000}};
  uint64_t seed = 900;
  for (const auto& c : cases) run_layout_case(c, seed++);
}

TEST(CudaRetroLayout, Refusals) {
  RETROINFER_REQUIRE_GPU();
  const AttentionShape shape{8, 2, 64};
  const gputest::KvData kv = make_kv(2, 3000, 3000, 64, 77);
  cuda::DeviceBuffer dk = gputest::upload(kv.k), dv = gputest::upload(kv.v), other = gputest::upload(kv.k);
  AttentionConfig cfg;
  cfg.tokens_per_cluster = 16;
  {
    cuda::RetroLayer layer(shape, cfg, 1);
    EXPECT_THROW(layer.make_cluster_contiguous(dk.as<uint16_t>(), dv.as<uint16_t>()), Error);  // before build
    layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), kv.n, kv.n);
    EXPECT_THROW(layer.make_cluster_contiguous(other.as<uint16_t>(), dv.as<uint16_t>()), Error);  // other K
  }
  {
    cuda::RetroLayer layer(shape, cfg, 1);
    layer.set_outlier_zone(true);
    layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), kv.n, kv.n);
    EXPECT_THROW(layer.make_cluster_contiguous(dk.as<uint16_t>(), dv.as<uint16_t>()), Error);
  }
}

}  // namespace
}  // namespace retroinfer
