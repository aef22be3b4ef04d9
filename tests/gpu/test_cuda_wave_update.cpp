// Index updates during decode on the host tier: a WaveBufferLayer (store on the host or the GPU, a small
// block cache, its manager running) against a GPU-tier RetroLayer on the same K/V and queries, decoded
// token by token across 3 index updates (update_tokens 64, update_clusters 4, window 32: updates at 64, 128
// and 192 generated tokens).
//
// What must agree and how closely: the wave buffer clusters each block with RetroLayer's own update code
// (wave_buffer_update.cpp) on the same bf16 rows, so the index (cluster count, updates, indexed region,
// outliers) is the GPU tier's exactly and the selection the same; the exact tokens are the same set, read
// in another order ([steady | misses | hits] of the execution buffer vs the token list) with other split
// boundaries, so the outputs differ by f32 rounding only: nmse <= 1e-10 and max-abs <= 1e-5 at every step,
// as RetroHostTierMatchesGpuTier (test_cuda_layers.cpp) before the first update. A wrong cluster (one
// token in the wrong place, a stale steady row, a missed store row) moves outputs by >= 1e-4 nmse.
// Cache invariants every step: hits + misses = the selected retrieval clusters (the GPU tier's selection,
// read back), cached rows within the cache's capacity, no out-of-range mailbox entry (last_step_counts
// throws on one), and at the end the manager saw every step (steps_seen = steps, none lost, hits + misses =
// the device's counts summed). An int4 store (store rows quantised, a bf16 scale per 32 values) goes through
// the same updates and store reallocations with the same index and selection, its outputs within an nmse
// bound of 0.1 instead (the queries here are sharper than test_wave_store_quantised.cpp's, whose int4 bound is
// 5e-2; a wrong row gives ~1).
#include <gtest/gtest.h>

#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "retroinfer/cuda_backend.h"
#include "retroinfer/error.h"
#include "retroinfer/wave_buffer.h"

namespace retroinfer {
namespace {

struct UpdateCase {
  const char* name;
  KvTier tier = KvTier::kHost;
  bool tail_room = false;     // WaveBufferConfig::max_tokens set (no store reallocation, ring sized ahead)
  int64_t cache_pages = 12;   // per flat head: small, so clusters are evicted
  double outlier_fraction = 0.01;
  double retrieval_fraction = 0.05;
  int num_seqs = 2;
  StoreDtype store = StoreDtype::kBf16;
  double nmse_bound = 1e-10, abs_bound = 1e-5;  // per step, against the GPU tier
};

void run_case(const UpdateCase& uc) {
  const int hkv = 2, group = 4, d = 128, H = uc.num_seqs * hkv;
  const int64_t n0 = 1000;
  const int steps = 200;  // updates at 64, 128, 192 generated tokens
  const int64_t max_tokens = n0 + steps;
  AttentionConfig cfg;
  cfg.kind = AttentionKind::kRetro;
  cfg.sink_tokens = 4;
  cfg.window_tokens = 32;
  cfg.segment_tokens = 1024;
  cfg.retrieval_fraction = uc.retrieval_fraction;
  cfg.estimation_fraction = 0.25;
  cfg.update_tokens = 64;
  cfg.update_clusters = 4;
  cfg.outlier_fraction = uc.outlier_fraction;
  const AttentionShape shape{hkv * group, hkv, d};
  const uint64_t seed = 7;
  const gputest::KvData kv = gputest::make_kv(H, max_tokens, max_tokens, d, seed, 16, 0.8f);
  // The GPU tier's K/V: rows past the current count are NaN until written (a read past them poisons it).
  std::vector<uint16_t> k0 = kv.k, v0 = kv.v;
  for (int h = 0; h < H; ++h)
    for (int64_t t = n0; t < max_tokens; ++t)
      for (int i = 0; i < d; ++i) k0[(h * kv.stride + t) * d + i] = v0[(h * kv.stride + t) * d + i] = 0x7fc0;
  cuda::DeviceBuffer dk = gputest::upload(k0), dv = gputest::upload(v0);

  cuda::RetroLayer gpu(shape, cfg, uc.num_seqs);
  gpu.set_outlier_zone(true);
  gpu.set_keep_f32_index(false);
  gpu.build(dk.as<uint16_t>(), dv.as<uint16_t>(), n0, max_tokens);

  WaveBufferConfig w;
  w.tier = uc.tier;
  w.cache_pages = uc.cache_pages;
  w.max_tokens = uc.tail_room ? max_tokens : 0;
  w.store_dtype = uc.store;
  cuda::WaveBufferLayer wb(shape, cfg, w, uc.num_seqs);
  wb.index().set_outlier_zone(true);  // as the runner's host tier
  wb.index().set_keep_assignment(false);
  wb.build(dk.as<uint16_t>(), dv.as<uint16_t>(), n0, max_tokens);
  const int n_r0 = wb.n_retrieval();

  const size_t row = size_t(d) * 2, qn = size_t(H) * group * d;
  cuda::DeviceBuffer dkn(size_t(H) * row), dvn(size_t(H) * row);
  double nmse_max = 0, abs_max = 0;
  int64_t unwritten = 0, device_hits = 0, device_misses = 0, selected_total = 0;
  int64_t max_hit_rows = 0;
  for (int i = 0; i < steps; ++i) {
    SCOPED_TRACE(testing::Message() << uc.name << " step " << i << " seed " << seed);
    const int64_t t = n0 + i;
    std::vector<uint16_t> kn(size_t(H) * d), vn(size_t(H) * d);
    for (int h = 0; h < H; ++h) {
      const size_t at = (size_t(h) * kv.stride + t) * d;
      dk.upload(kv.k.data() + at, row, at * 2);  // the GPU tier's K/V row (the runner's write)
      dv.upload(kv.v.data() + at, row, at * 2);
      std::copy(kv.k.begin() + int64_t(at), kv.k.begin() + int64_t(at + d), kn.begin() + int64_t(h) * d);
      std::copy(kv.v.begin() + int64_t(at), kv.v.begin() + int64_t(at + d), vn.begin() + int64_t(h) * d);
    }
    dkn.upload(kn.data(), kn.size() * 2);
    dvn.upload(vn.data(), vn.size() * 2);
    gpu.append(t + 1);
    wb.append(dkn.as<uint16_t>(), dvn.as<uint16_t>());
    const auto q = gputest::make_q(kv, group, seed * 1000 + uint64_t(i), 1.0f);
    auto dq = gputest::upload(q);
    auto og = gputest::poisoned(qn), ow = gputest::poisoned(qn);
    gpu.decode(dq.as<float>(), og.as<float>());
    wb.decode(dq.as<float>(), ow.as<float>());
    wb.wait_manager();  // deterministic: the manager's decision lands before the next step
    cuda::synchronize();
    const auto c = gputest::compare(gputest::download_f32(ow, qn), gputest::download_f32(og, qn));
    nmse_max = std::max(nmse_max, c.nmse);
    abs_max = std::max(abs_max, c.max_abs);
    unwritten += c.unwritten;
    ASSERT_LE(c.nmse, uc.nmse_bound);
    ASSERT_EQ(c.unwritten, 0);
    // The index's shape, exactly the GPU tier's.
    ASSERT_EQ(wb.num_tokens(), gpu.num_tokens());
    ASSERT_EQ(wb.num_updates(), gpu.num_updates());
    ASSERT_EQ(wb.indexed_begin(), gpu.indexed_begin());
    ASSERT_EQ(wb.indexed_tokens(), gpu.indexed_tokens());
    ASSERT_EQ(wb.num_clusters(), gpu.num_clusters());
    ASSERT_EQ(wb.n_retrieval(), gpu.n_retrieval());
    ASSERT_EQ(wb.n_estimation(), gpu.n_estimation());
    ASSERT_EQ(wb.outlier_rows(), gpu.max_outliers());
    ASSERT_EQ(wb.steady_rows(), wb.num_tokens() - wb.indexed_tokens() + wb.outlier_rows());
    // Cache invariants of the step.
    const WaveStepCounts sc = wb.last_step_counts();  // throws on an out-of-range mailbox entry
    int64_t selected = 0, ret_rows = 0;
    for (int h = 0; h < H; ++h) {
      const cuda::RetroDebugState st = gpu.debug_state(h);
      selected += int64_t(st.retrieval_ids.size());
      for (int32_t cl : st.retrieval_ids) ret_rows += st.sizes[size_t(cl)];
    }
    ASSERT_EQ(sc.hit_clusters + sc.miss_clusters, selected);
    ASSERT_EQ(sc.hit_rows + sc.miss_rows, ret_rows);
    ASSERT_LE(sc.hit_rows, int64_t(H) * uc.cache_pages * w.page_tokens);
    ASSERT_EQ(sc.steady_rows, int64_t(H) * wb.steady_rows());
    device_hits += sc.hit_clusters;
    device_misses += sc.miss_clusters;
    selected_total += selected;
    max_hit_rows = std::max(max_hit_rows, sc.hit_rows);
  }
  EXPECT_EQ(gpu.num_updates(), 3);
  const WaveBufferStats s = wb.stats();
  EXPECT_EQ(s.steps_seen, uint64_t(steps));
  EXPECT_EQ(s.steps_lost, 0u);
  EXPECT_EQ(int64_t(s.hits), device_hits);
  EXPECT_EQ(int64_t(s.misses), device_misses);
  EXPECT_GT(s.admitted, 0u);
  EXPECT_LE(abs_max, uc.abs_bound);
  std::printf("[wave update] %s store=%s tier=%s tail_room=%d seqs=%d H=%d n0=%lld steps=%d cache=%lld pages/head: %lld updates, "
              "%d clusters/head, n_r %d -> %d, %lld outliers/head, nmse max %.3e max-abs %.3e, hits %lld misses %lld (selected %lld), "
              "admitted %llu evicted %llu, max hit rows %lld\n",
              uc.name, std::string(store_dtype_name(uc.store)).c_str(), uc.tier == KvTier::kHost ? "host" : "gpu", int(uc.tail_room), uc.num_seqs, H, (long long)n0,
              steps, (long long)uc.cache_pages, (long long)wb.num_updates(), wb.num_clusters(), n_r0,
              wb.n_retrieval(), (long long)wb.outlier_rows(), nmse_max, abs_max, (long long)device_hits, (long long)device_misses,
              (long long)selected_total, (unsigned long long)s.admitted, (unsigned long long)s.evicted,
              (long long)max_hit_rows);
}

TEST(WaveBufferUpdate, HostStoreMatchesGpuTierThroughThreeUpdates) {
  RETROINFER_REQUIRE_GPU();
  UpdateCase uc;
  uc.name = "host-store grow";  // no tail room: each update reallocates the store
  // n_r = ceil(0.06 C): 4 at the prompt's 61 clusters, 5 from the second update (69): the ring, sized for
  // n_r at build, is rebuilt there with an empty cache.
  uc.retrieval_fraction = 0.06;
  run_case(uc);
}

TEST(WaveBufferUpdate, Int4HostStoreGrowsThroughThreeUpdates) {
  RETROINFER_REQUIRE_GPU();
  UpdateCase uc;
  uc.name = "int4 host-store grow";  // each update reallocates the store: values and scales both move
  uc.retrieval_fraction = 0.06;
  uc.store = StoreDtype::kInt4;
  // Measured 1.4e-2 on the H200 (rows stored relative to their cluster's mean; 4.8e-2 when int4 stored the raw
  // rows): this test's sharper queries weigh the K rounding more than the layer test's.
  uc.nmse_bound = 0.04;
  uc.abs_bound = std::numeric_limits<double>::infinity();  // int4 errors are bounded in nmse, not per element
  run_case(uc);
}

TEST(WaveBufferUpdate, HostStoreWithTailRoomMatchesGpuTier) {
  RETROINFER_REQUIRE_GPU();
  UpdateCase uc;
  uc.name = "host-store room";
  uc.tail_room = true;
  uc.cache_pages = 40;
  run_case(uc);
}

TEST(WaveBufferUpdate, GpuStoreWithoutOutliersMatchesGpuTier) {
  RETROINFER_REQUIRE_GPU();
  UpdateCase uc;
  uc.name = "gpu-store no-outliers";
  uc.tier = KvTier::kGpu;
  uc.outlier_fraction = 0.0;
  uc.num_seqs = 1;
  run_case(uc);
}

// Index updates off: the behaviour before them (every appended token stays in the steady zone).
TEST(WaveBufferUpdate, UpdatesOffKeepsEveryTokenSteady) {
  RETROINFER_REQUIRE_GPU();
  const int hkv = 2, group = 4, d = 128, H = hkv;
  const int64_t n0 = 1000;
  AttentionConfig cfg;
  cfg.sink_tokens = 4;
  cfg.window_tokens = 32;
  cfg.update_tokens = 64;
  cfg.update_clusters = 4;
  const gputest::KvData kv = gputest::make_kv(H, n0 + 100, n0 + 100, d, 11);
  cuda::DeviceBuffer dk = gputest::upload(kv.k), dv = gputest::upload(kv.v);
  WaveBufferConfig w;
  w.index_updates = false;
  cuda::WaveBufferLayer wb(AttentionShape{hkv * group, hkv, d}, cfg, w, 1);
  wb.build(dk.as<uint16_t>(), dv.as<uint16_t>(), n0, n0 + 100);
  const int64_t rows0 = wb.steady_rows(), c0 = wb.num_clusters();
  for (int i = 0; i < 100; ++i) {
    const size_t at = size_t(n0 + i) * d;  // head 0's row; head 1 reads the next kv.stride rows
    cuda::DeviceBuffer kn(size_t(H) * d * 2);
    for (int h = 0; h < H; ++h) kn.upload(kv.k.data() + size_t(h) * kv.stride * d + at, size_t(d) * 2, size_t(h) * d * 2);
    wb.append(kn.as<uint16_t>(), kn.as<uint16_t>());
  }
  cuda::synchronize();
  EXPECT_EQ(wb.num_updates(), 0);
  EXPECT_EQ(wb.num_clusters(), c0);
  EXPECT_EQ(wb.steady_rows(), rows0 + 100);
  std::printf("[wave update] updates off: 100 appends, %lld steady rows (build %lld), %d clusters\n",
              (long long)wb.steady_rows(), (long long)rows0, wb.num_clusters());
}

}  // namespace
}  // namespace retroinfer
