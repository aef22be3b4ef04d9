// WaveBufferLayer on the GPU: a cache that holds everything gives the uncached path's output bit for bit
// (and RetroLayer's, whose splits it shares), a host-resident store gives the GPU-resident store's output
// bit for bit, a CUDA-graph replay of the whole step equals direct launches, the two-stream step equals the
// stages run in turn (and times them when asked), an apply issued ahead decodes as the in-step one, and the
// LRU under pressure keeps the device tables consistent (no out-of-range mailbox entry) while outputs stay
// exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include "buffer/cuda/pinned_host.h"
#include "gpu_test_util.h"
#include "retroinfer/error.h"
#include "retroinfer/session_planner.h"
#include "retroinfer/wave_buffer.h"

namespace retroinfer {
namespace {

// Mixed hit / miss steps reorder the exact tokens ([steady | misses | hits] instead of cluster order), so
// the f32 sums differ by rounding only: the dense-decode tolerances of test_cuda_dense.cpp.
constexpr double kNmse = 1e-9;
constexpr double kMaxAbs = 1e-4;

struct WaveRig {
  int num_seqs = 2, hkv = 2, group = 4, d = 128;
  int64_t n = 6000;
  AttentionConfig cfg;
  gputest::KvData kv;
  cuda::DeviceBuffer dk, dv;
  WaveRig(uint64_t seed, int64_t tokens = 6000) : n(tokens) {
    cfg.retrieval_fraction = 0.05;  // more selected clusters than the default: more pages to move
    kv = gputest::make_kv(num_seqs * hkv, n, n + 5, d, seed);
    dk = gputest::upload(kv.k);
    dv = gputest::upload(kv.v);
  }
  AttentionShape shape() const { return AttentionShape{hkv * group, hkv, d}; }
  size_t q_elems() const { return size_t(num_seqs) * hkv * group * d; }
};

// q drifting by a random walk: temporal locality, as in a decode.
std::vector<float> drift(const std::vector<float>& q, float step, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> out(q);
  for (auto& x : out) x += step * nd(rng);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Two layers that decoded the same step: outputs equal bit for bit and the same hit / miss counts; adds the
// second's hit and miss clusters to `hits` and `misses`.
void expect_same_step(cuda::WaveBufferLayer& a, const cuda::DeviceBuffer& out_a, cuda::WaveBufferLayer& b,
                      const cuda::DeviceBuffer& out_b, size_t elems, int64_t& hits, int64_t& misses) {
  EXPECT_TRUE(same_bits(gputest::download_f32(out_a, elems), gputest::download_f32(out_b, elems)));
  const auto ca = a.last_step_counts(), cb = b.last_step_counts();
  EXPECT_EQ(ca.hit_clusters, cb.hit_clusters);
  EXPECT_EQ(ca.miss_clusters, cb.miss_clusters);
  EXPECT_EQ(ca.hit_rows, cb.hit_rows);
  hits += cb.hit_clusters;
  misses += cb.miss_clusters;
}

TEST(WaveBuffer, FullCacheGivesTheUncachedOutputBitForBit) {
  RETROINFER_REQUIRE_GPU();
  const uint64_t seed = 101;
  WaveRig su(seed);
  WaveBufferConfig w;
  w.tier = KvTier::kHost;
  w.cache_pages = su.n;  // room for every cluster
  cuda::WaveBufferLayer layer(su.shape(), su.cfg, w, su.num_seqs);
  layer.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
  const auto q = gputest::make_q(su.kv, su.group, seed + 1);
  auto dq = gputest::upload(q);
  auto ref_out = gputest::poisoned(su.q_elems());
  layer.index().decode(dq.as<float>(), ref_out.as<float>());  // RetroLayer on GPU-resident K/V
  const auto ref = gputest::download_f32(ref_out, su.q_elems());

  auto out0 = gputest::poisoned(su.q_elems());
  layer.decode(dq.as<float>(), out0.as<float>());
  const auto c0 = layer.last_step_counts();
  EXPECT_EQ(c0.hit_clusters, 0);  // cold cache: the uncached path
  EXPECT_GT(c0.miss_clusters, 0);
  EXPECT_TRUE(same_bits(gputest::download_f32(out0, su.q_elems()), ref)) << "seed " << seed;
  layer.wait_manager();

  auto out1 = gputest::poisoned(su.q_elems());
  layer.decode(dq.as<float>(), out1.as<float>());  // same query: every cluster was admitted after step 0
  const auto c1 = layer.last_step_counts();
  EXPECT_EQ(c1.miss_clusters, 0);
  EXPECT_EQ(c1.hit_clusters, c0.miss_clusters);
  EXPECT_EQ(c1.hit_rows, c0.miss_rows);
  EXPECT_TRUE(same_bits(gputest::download_f32(out1, su.q_elems()), ref)) << "seed " << seed;
  layer.wait_manager();
  const auto st = layer.stats();
  EXPECT_EQ(st.updates, 1u);
  EXPECT_EQ(st.updates_dropped, 0u);
  EXPECT_EQ(st.admitted, uint64_t(c0.miss_clusters));
  EXPECT_EQ(st.evicted, 0u);
}

// The host store through the registered pinning path (mmap + parallel first touch + cudaHostRegister, used from
// 64 MiB up) gives the GPU store's output bit for bit, as cudaHostAlloc memory does.
TEST(WaveBuffer, RegisteredHostStoreMatchesGpuStoreBitForBit) {
  RETROINFER_REQUIRE_GPU();
  struct Threshold {
    size_t old = cuda::register_pin_threshold();
    Threshold() { cuda::set_register_pin_threshold(1); }
    ~Threshold() { cuda::set_register_pin_threshold(old); }
  } guard;
  const uint64_t seed = 212;
  WaveRig su(seed);
  WaveBufferConfig wh, wg;
  wh.tier = KvTier::kHost;
  wg.tier = KvTier::kGpu;
  wh.cache_fraction = wg.cache_fraction = 0.03;
  cuda::WaveBufferLayer host(su.shape(), su.cfg, wh, su.num_seqs), gpu(su.shape(), su.cfg, wg, su.num_seqs);
  host.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
  gpu.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
  ASSERT_TRUE(host.store_on_host());
  std::mt19937_64 rng(seed);
  auto q = gputest::make_q(su.kv, su.group, seed + 1);
  auto dq = gputest::upload(q);
  for (int step = 0; step < 4; ++step) {
    SCOPED_TRACE(testing::Message() << "seed " << seed << " step " << step);
    dq.upload(q.data(), q.size() * 4);
    auto oh = gputest::poisoned(su.q_elems()), og = gputest::poisoned(su.q_elems());
    host.decode(dq.as<float>(), oh.as<float>());
    gpu.decode(dq.as<float>(), og.as<float>());
    EXPECT_TRUE(same_bits(gputest::download_f32(oh, su.q_elems()), gputest::download_f32(og, su.q_elems())));
    host.wait_manager();
    gpu.wait_manager();
    q = drift(q, 0.05f, rng);
  }
}

// PinnedHost itself: the registered path above the threshold, DMA both ways, and how fast it pins.
TEST(WaveBuffer, PinnedHostRegisteredPathRoundTrips) {
  RETROINFER_REQUIRE_GPU();
  const size_t n = size_t{256} << 20;
  const auto t0 = std::chrono::steady_clock::now();
  cuda::PinnedHost registered(n);
  const double registered_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto t1 = std::chrono::steady_clock::now();
  cuda::PinnedHost slow(n, /*allow_register=*/false);
  const double slow_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  EXPECT_TRUE(registered.registered());
  EXPECT_FALSE(slow.registered());
  ASSERT_NE(registered.device(), nullptr);
  auto* h = static_cast<uint32_t*>(registered.host());
  for (size_t i = 0; i < n / 4; i += 1021) h[i] = static_cast<uint32_t>(i * 2654435761u);
  cuda::DeviceBuffer d(n);
  d.upload(registered.host(), n);
  std::memset(slow.host(), 0, n);
  d.download(slow.host(), n);
  const auto* back = static_cast<const uint32_t*>(slow.host());
  size_t bad = 0;
  for (size_t i = 0; i < n / 4; i += 1021) bad += back[i] != static_cast<uint32_t>(i * 2654435761u);
  EXPECT_EQ(bad, 0u);
  cuda::PinnedHost moved(std::move(registered));
  EXPECT_EQ(registered.host(), nullptr);
  EXPECT_TRUE(moved.registered());
  std::printf("[pinned host] 256 MiB: mmap + parallel touch + register %.3f s (%.1f GB/s), cudaHostAlloc %.3f s "
              "(%.1f GB/s)\n", registered_s, n / registered_s / 1e9, slow_s, n / slow_s / 1e9);
}

TEST(WaveBuffer, HostStoreMatchesGpuStoreBitForBit) {
  RETROINFER_REQUIRE_GPU();
  const uint64_t seed = 202;
  WaveRig su(seed);
  WaveBufferConfig wh, wg;
  wh.tier = KvTier::kHost;
  wg.tier = KvTier::kGpu;
  wh.cache_fraction = wg.cache_fraction = 0.03;  // smaller than the retrieval zone: misses and evictions
  cuda::WaveBufferLayer host(su.shape(), su.cfg, wh, su.num_seqs), gpu(su.shape(), su.cfg, wg, su.num_seqs);
  host.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
  gpu.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
  EXPECT_TRUE(host.store_on_host());
  EXPECT_FALSE(gpu.store_on_host());
  std::mt19937_64 rng(seed);
  auto q = gputest::make_q(su.kv, su.group, seed + 1);
  auto dq = gputest::upload(q);
  int64_t hits = 0;
  for (int step = 0; step < 12; ++step) {
    SCOPED_TRACE(testing::Message() << "seed " << seed << " step " << step);
    dq.upload(q.data(), q.size() * 4);
    auto oh = gputest::poisoned(su.q_elems()), og = gputest::poisoned(su.q_elems()), orf = gputest::poisoned(su.q_elems());
    host.decode(dq.as<float>(), oh.as<float>());
    gpu.decode(dq.as<float>(), og.as<float>());
    host.index().decode(dq.as<float>(), orf.as<float>());
    const auto ch = host.last_step_counts(), cg = gpu.last_step_counts();
    EXPECT_EQ(ch.hit_clusters, cg.hit_clusters);
    EXPECT_EQ(ch.miss_rows, cg.miss_rows);
    hits += ch.hit_clusters;
    const auto a = gputest::download_f32(oh, su.q_elems()), b = gputest::download_f32(og, su.q_elems());
    EXPECT_TRUE(same_bits(a, b));
    const auto cmp = gputest::compare(a, gputest::download_f32(orf, su.q_elems()));
    EXPECT_EQ(cmp.unwritten, 0);
    EXPECT_LT(cmp.nmse, kNmse);
    EXPECT_LT(cmp.max_abs, kMaxAbs);
    host.wait_manager();
    gpu.wait_manager();
    q = drift(q, 0.05f, rng);
  }
  EXPECT_GT(hits, 0);
  EXPECT_GT(host.stats().evicted, 0u);
}

TEST(WaveBuffer, CudaGraphReplayOfTheWholeStepMatchesDirectLaunches) {
  RETROINFER_REQUIRE_GPU();
  const uint64_t seed = 303;
  WaveRig su(seed);
  WaveBufferConfig w;
  w.cache_fraction = 0.03;
  cuda::WaveBufferLayer direct(su.shape(), su.cfg, w, su.num_seqs), graphed(su.shape(), su.cfg, w, su.num_seqs);
  direct.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
  graphed.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
  std::mt19937_64 rng(seed);
  auto q = gputest::make_q(su.kv, su.group, seed + 1);
  auto dq = gputest::upload(q), dq_graph = gputest::upload(q);
  auto out_graph = gputest::poisoned(su.q_elems());
  cuda::StreamHandle stream_handle;
  cuda::Stream s = stream_handle.get();
  // Warm-up of the direct layer first (one-time kernel attributes are set outside any capture).
  auto out = gputest::poisoned(su.q_elems());
  direct.decode(dq.as<float>(), out.as<float>());
  graphed.capture_graph(dq_graph.as<float>(), out_graph.as<float>(), s);
  EXPECT_EQ(graphed.steps_issued(), 0);  // capturing runs nothing
  graphed.replay_graph(s);
  cuda::synchronize(s);
  EXPECT_TRUE(same_bits(gputest::download_f32(out, su.q_elems()), gputest::download_f32(out_graph, su.q_elems())));
  for (int step = 1; step < 8; ++step) {
    SCOPED_TRACE(testing::Message() << "seed " << seed << " step " << step);
    direct.wait_manager();
    graphed.wait_manager();
    q = drift(q, 0.05f, rng);
    dq.upload(q.data(), q.size() * 4);
    dq_graph.upload(q.data(), q.size() * 4);
    out_graph.fill_bytes(0xff);
    cuda::synchronize();  // the memset ran on the legacy default stream; the graph runs on s
    direct.decode(dq.as<float>(), out.as<float>());
    graphed.replay_graph(s);
    cuda::synchronize(s);
    cuda::synchronize();
    EXPECT_TRUE(same_bits(gputest::download_f32(out, su.q_elems()), gputest::download_f32(out_graph, su.q_elems())));
    const auto a = direct.last_step_counts(), b = graphed.last_step_counts();
    EXPECT_EQ(a.hit_clusters, b.hit_clusters);
    EXPECT_EQ(a.miss_clusters, b.miss_clusters);
  }
  EXPECT_GT(graphed.stats().hits, 0u);
}

// decode() runs the apply and the ring on the layer's second stream; decode_stage_ms runs every stage in turn
// on one stream. Waiting for the manager between steps makes both see the same updates, so the outputs and
// the hit / miss counts agree bit for bit through misses, admissions and hits. With stage_times on, the
// layer times every decode() step (and none of the serial ones) with consistent stages.
TEST(WaveBuffer, TwoStreamStepEqualsTheSerialStagesAndTimesThem) {
  RETROINFER_REQUIRE_GPU();
  const uint64_t seed = 505;
  WaveRig su(seed);
  WaveBufferConfig w;
  w.cache_fraction = 0.03;
  WaveBufferConfig timed_cfg = w;
  timed_cfg.stage_times = true;
  cuda::WaveBufferLayer serial(su.shape(), su.cfg, w, su.num_seqs), timed(su.shape(), su.cfg, timed_cfg, su.num_seqs);
  serial.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
  timed.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
  std::mt19937_64 rng(seed);
  auto q = gputest::make_q(su.kv, su.group, seed + 1);
  auto dq = gputest::upload(q);
  auto out_serial = gputest::poisoned(su.q_elems()), out_timed = gputest::poisoned(su.q_elems());
  cuda::StreamHandle stream_handle;
  cuda::Stream s = stream_handle.get();
  const int steps = 8;
  int64_t hits = 0, misses = 0;
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE(testing::Message() << "seed " << seed << " step " << step);
    serial.wait_manager();
    timed.wait_manager();
    dq.upload(q.data(), q.size() * 4);
    const auto stages = serial.decode_stage_ms(dq.as<float>(), out_serial.as<float>());
    ASSERT_EQ(stages.size(), 5u);
    timed.decode(dq.as<float>(), out_timed.as<float>(), s);
    cuda::synchronize(s);
    expect_same_step(serial, out_serial, timed, out_timed, su.q_elems(), hits, misses);
    q = drift(q, 0.05f, rng);
  }
  EXPECT_GT(hits, 0);
  EXPECT_GT(misses, 0);
  const WaveStageTimes t = timed.stage_times();
  EXPECT_EQ(t.steps, steps);
  for (const auto& [name, ms] : t.named()) EXPECT_GE(ms, 0.0) << name;
  EXPECT_GT(t.step, 0.0);
  EXPECT_GT(t.select, 0.0);
  EXPECT_GT(t.gather, 0.0);
  EXPECT_GT(t.attention, 0.0);
  // The step spans the selection (and the wait for the apply) and the stages after it (events' resolution
  // is ~0.5 us per pair: a small allowance).
  const double slack = 0.002 * steps;
  EXPECT_GE(t.step + slack, t.select + t.apply_wait + t.lookup + t.gather + t.attention + t.ring_wait);
  EXPECT_GE(t.step + slack, t.apply);
  const WaveStageTimes none = serial.stage_times();  // stage_times off
  EXPECT_EQ(none.steps, 0);
  EXPECT_EQ(none.step, 0.0);
}

// issue_apply_ahead queues the next step's apply (and a retrieval override's ids) before the step; the step
// then waits for it instead of issuing its own. With the manager waited for between steps, a layer whose
// applies all go ahead decodes bit for bit as one whose applies run in the step, with the same hit / miss
// counts, with and without a retrieval override; a second call before the step issues nothing, and a graph
// capture is refused while an apply is ahead (the graph holds its own).
TEST(WaveBuffer, ApplyIssuedAheadDecodesAsTheInStepApply) {
  RETROINFER_REQUIRE_GPU();
  const uint64_t seed = 606;
  WaveRig su(seed);
  WaveBufferConfig w;
  w.cache_fraction = 0.03;
  for (const bool with_override : {false, true}) {
    SCOPED_TRACE(with_override ? "retrieval override" : "the selection's ids");
    cuda::WaveBufferLayer plain(su.shape(), su.cfg, w, su.num_seqs), ahead(su.shape(), su.cfg, w, su.num_seqs);
    plain.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
    ahead.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
    if (with_override) {
      // Per step a sliding window of clusters: some stay (hits), some are new (misses).
      auto fill = [](int64_t step, int num_clusters, int n_r, int32_t* ids) {
        for (int f = 0; f < 2 * 2; ++f)  // num_seqs x hkv flat heads
          for (int j = 0; j < n_r; ++j) {
            const int64_t c = (step * 2 + f * 7 + j) % num_clusters;
            ids[size_t(f) * n_r + j] = j < num_clusters ? int32_t(c) : -1;
          }
        for (int f = 0; f < 2 * 2; ++f) std::sort(ids + size_t(f) * n_r, ids + size_t(f) * n_r + std::min(n_r, num_clusters));
      };
      plain.set_retrieval_override(fill);
      ahead.set_retrieval_override(fill);
    }
    std::mt19937_64 rng(seed);
    auto q = gputest::make_q(su.kv, su.group, seed + 1);
    auto dq = gputest::upload(q);
    auto out_plain = gputest::poisoned(su.q_elems()), out_ahead = gputest::poisoned(su.q_elems());
    cuda::StreamHandle stream_handle;
    cuda::Stream s = stream_handle.get();
    int64_t hits = 0, misses = 0;
    for (int step = 0; step < 8; ++step) {
      SCOPED_TRACE(testing::Message() << "step " << step);
      plain.wait_manager();
      ahead.wait_manager();
      dq.upload(q.data(), q.size() * 4);
      ASSERT_TRUE(ahead.issue_apply_ahead(s));
      EXPECT_FALSE(ahead.issue_apply_ahead(s));  // one apply per step
      EXPECT_THROW(ahead.capture_graph(dq.as<float>(), out_ahead.as<float>(), s), Error);
      plain.decode(dq.as<float>(), out_plain.as<float>(), s);
      ahead.decode(dq.as<float>(), out_ahead.as<float>(), s);
      cuda::synchronize(s);
      expect_same_step(plain, out_plain, ahead, out_ahead, su.q_elems(), hits, misses);
      q = drift(q, 0.05f, rng);
    }
    EXPECT_GT(hits, 0);
    EXPECT_GT(misses, 0);
    plain.wait_manager();
    ahead.wait_manager();
    EXPECT_EQ(plain.stats().steps_seen, ahead.stats().steps_seen);
  }
}

TEST(WaveBuffer, SmallCacheUnderPressureStaysExactAndConsistent) {
  RETROINFER_REQUIRE_GPU();
  const uint64_t seed = 404;
  WaveRig su(seed);
  WaveBufferConfig w;
  w.cache_pages = 6;  // a few clusters per head: constant eviction
  w.ring_slots = 2;
  cuda::WaveBufferLayer layer(su.shape(), su.cfg, w, su.num_seqs);
  layer.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
  std::mt19937_64 rng(seed);
  auto q = gputest::make_q(su.kv, su.group, seed + 1);
  auto dq = gputest::upload(q);
  auto out = gputest::poisoned(su.q_elems()), ref = gputest::poisoned(su.q_elems());
  for (int step = 0; step < 20; ++step) {
    SCOPED_TRACE(testing::Message() << "seed " << seed << " step " << step);
    dq.upload(q.data(), q.size() * 4);
    layer.decode(dq.as<float>(), out.as<float>());  // no waiting: the manager runs free
    layer.index().decode(dq.as<float>(), ref.as<float>());
    const auto counts = layer.last_step_counts();  // also checks the apply kernel saw no bad entry
    EXPECT_LE(counts.hit_rows, int64_t(w.cache_pages) * w.page_tokens * su.num_seqs * su.hkv);
    const auto cmp = gputest::compare(gputest::download_f32(out, su.q_elems()), gputest::download_f32(ref, su.q_elems()));
    EXPECT_EQ(cmp.unwritten, 0);
    EXPECT_LT(cmp.nmse, kNmse);
    EXPECT_LT(cmp.max_abs, kMaxAbs);
    q = step % 5 == 4 ? gputest::make_q(su.kv, su.group, seed + step) : drift(q, 0.05f, rng);
  }
  layer.wait_manager();
  const auto st = layer.stats();
  EXPECT_EQ(st.steps_seen + st.steps_lost, 20u);
  EXPECT_GT(st.evicted, 0u);
}

// The model runner's host-tier layers release the RetroLayer that built their index (release_index):
// decode reads only the buffer's own copies, so a released layer decodes bit for bit as a kept one through
// misses, admissions and hits; the index's GPU memory is gone; and the session planner's host-tier layer
// bytes (without the index) bound what the layer holds, the staging term bounding the index it released.
TEST(WaveBuffer, ReleasedIndexDecodesBitForBitAndFitsThePlan) {
  RETROINFER_REQUIRE_GPU();
  const uint64_t seed = 606;
  WaveRig su(seed);
  su.cfg.retrieval_fraction = AttentionConfig{}.retrieval_fraction;  // the runner's budgets, as planned
  WaveBufferConfig w;
  w.tier = KvTier::kHost;
  w.store_dtype = StoreDtype::kInt8;
  cuda::WaveBufferLayer kept(su.shape(), su.cfg, w, su.num_seqs), freed(su.shape(), su.cfg, w, su.num_seqs);
  for (cuda::WaveBufferLayer* l : {&kept, &freed}) {  // as the runner's WaveLayerAttention
    l->index().set_outlier_zone(true);
    l->index().set_keep_assignment(false);
    l->index().set_build_group_seqs(1);
    l->build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
  }
  const int64_t index_bytes = freed.index().device_bytes();
  EXPECT_GT(index_bytes, 0);
  freed.release_index();
  EXPECT_EQ(freed.index().device_bytes(), 0);
  EXPECT_EQ(freed.device_bytes(), kept.device_bytes());
  std::mt19937_64 rng(seed);
  auto q = gputest::make_q(su.kv, su.group, seed + 1);
  auto dq = gputest::upload(q);
  {
    auto o = gputest::poisoned(su.q_elems());
    EXPECT_THROW(freed.index().decode(dq.as<float>(), o.as<float>()), Error);  // released: build() first
  }
  int64_t hits = 0;
  for (int step = 0; step < 8; ++step) {
    SCOPED_TRACE(testing::Message() << "seed " << seed << " step " << step);
    dq.upload(q.data(), q.size() * 4);
    auto ok = gputest::poisoned(su.q_elems()), of = gputest::poisoned(su.q_elems());
    kept.decode(dq.as<float>(), ok.as<float>());
    freed.decode(dq.as<float>(), of.as<float>());
    EXPECT_EQ(kept.last_step_counts().hit_clusters, freed.last_step_counts().hit_clusters);
    hits += freed.last_step_counts().hit_clusters;
    EXPECT_TRUE(same_bits(gputest::download_f32(ok, su.q_elems()), gputest::download_f32(of, su.q_elems())));
    kept.wait_manager();
    freed.wait_manager();
    q = drift(q, 0.05f, rng);
  }
  EXPECT_GT(hits, 0);

  buffer::SessionPlanRequest r;
  r.num_layers = 1;
  r.hidden_size = su.hkv * su.group * su.d;
  r.intermediate_size = r.hidden_size;
  r.vocab_size = 1000;
  r.num_heads_q = su.hkv * su.group;
  r.num_heads_kv = su.hkv;
  r.head_dim = su.d;
  r.attention = su.cfg;
  r.attention.kind = AttentionKind::kRetro;
  r.wave = w;
  r.max_context = su.n;
  r.num_seqs = su.num_seqs;
  r.placement = KvPlacement::kHost;
  r.gpu_free_bytes = r.host_free_bytes = int64_t{64} << 30;
  const buffer::SessionPlanBreakdown p = buffer::plan_session(r);
  std::printf("host-tier layer: %lld device bytes held (planned %lld), index %lld released (planned %lld + build %lld)\n",
              (long long)freed.device_bytes(), (long long)p.host_layer_gpu_bytes, (long long)index_bytes,
              (long long)(p.staging_bytes - p.kv_layer_bytes), (long long)p.build_workspace_bytes);
  EXPECT_LE(freed.device_bytes(), p.host_layer_gpu_bytes);
  EXPECT_GE(freed.device_bytes(), p.host_layer_gpu_bytes / 3);  // the plan is a bound, not a guess
  EXPECT_LE(index_bytes, p.staging_bytes - p.kv_layer_bytes + p.build_workspace_bytes);
}

TEST(WaveBuffer, RejectsMisuse) {
  RETROINFER_REQUIRE_GPU();
  WaveRig su(505, 60);  // 60 tokens: all steady zone (4 sink + 64 window)
  WaveBufferConfig w;
  cuda::WaveBufferLayer layer(su.shape(), su.cfg, w, su.num_seqs);
  auto q = cuda::DeviceBuffer(su.q_elems() * 4), out = cuda::DeviceBuffer(su.q_elems() * 4);
  EXPECT_THROW(layer.decode(q.as<float>(), out.as<float>()), Error);  // before build
  EXPECT_THROW(layer.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5), Error);  // nothing to index
  EXPECT_THROW(layer.replay_graph(nullptr), Error);
  w.page_tokens = 0;
  EXPECT_THROW(cuda::WaveBufferLayer(su.shape(), su.cfg, w, 1), Error);
  w.page_tokens = 8;
  w.cache_fraction = 2.0;
  EXPECT_THROW(cuda::WaveBufferLayer(su.shape(), su.cfg, w, 1), Error);
}

}  // namespace
}  // namespace retroinfer
