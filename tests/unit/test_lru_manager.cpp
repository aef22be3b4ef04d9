// CacheManager against a CPU stand-in for the GPU side of the protocol (wave_protocol.h): the fake device
// keeps its own page table, applies mailbox updates at the start of a step (admissions only if in time),
// acks them, looks the step's clusters up and writes the selection ring as a seqlock. Checks: the device's
// cache never holds more pages than its capacity nor one page twice, admissions follow the LRU rule, late
// updates are rolled back, manager errors surface on the owner thread. Also run under TSAN (cpu-tsan).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <thread>

#include "buffer/cache_manager.h"
#include "retroinfer/error.h"

namespace retroinfer::buffer {
namespace {

template <typename T>
T load_acq(T& x) {
  return std::atomic_ref<T>(x).load(std::memory_order_acquire);
}
template <typename T>
void store_rel(T& x, T v) {
  std::atomic_ref<T>(x).store(v, std::memory_order_release);
}

struct FakeDevice {
  WaveProtocolLayout layout;
  void* region;
  int C, page_tokens;
  int64_t capacity;
  std::vector<int32_t> sizes;                   // [H, C]
  std::vector<uint8_t> resident;                // [H, C]
  std::vector<std::vector<int32_t>> pages;      // [H * C]
  std::vector<int32_t> owner;                   // [H, capacity]: cluster owning the page, -1 free
  uint64_t last_seq = 0, step = 0;
  uint64_t applied = 0, dropped = 0;

  FakeDevice(const WaveProtocolLayout& l, void* r, int c, int pt, int64_t cap, std::vector<int32_t> sz)
      : layout(l), region(r), C(c), page_tokens(pt), capacity(cap), sizes(std::move(sz)) {
    resident.assign(size_t(l.heads) * C, 0);
    pages.assign(size_t(l.heads) * C, {});
    owner.assign(size_t(l.heads) * cap, -1);
  }

  // Start of step `step`: apply a new update (the apply kernel).
  void apply() {
    MailboxHeader* mb = layout.mailbox(region);
    const uint64_t seq = load_acq(mb->seq);
    if (seq == last_seq) return;
    ASSERT_EQ(seq, last_seq + 1);
    const bool in_time = mb->src_step + 1 == step;
    for (int i = 0; i < mb->num_evictions; ++i) {
      const auto e = layout.evictions(region)[i];
      const size_t hc = size_t(e.head) * C + e.cluster;
      ASSERT_TRUE(resident[hc]) << "evicting a cluster that is not resident";
      resident[hc] = 0;
      for (int32_t p : pages[hc]) owner[size_t(e.head) * capacity + p] = -1;
      pages[hc].clear();
    }
    if (in_time) {
      for (int i = 0; i < mb->num_admissions; ++i) {
        const auto a = layout.admissions(region)[i];
        const size_t hc = size_t(a.head) * C + a.cluster;
        ASSERT_FALSE(resident[hc]);
        ASSERT_EQ(a.num_rows, sizes[hc]);
        const int np = (a.num_rows + page_tokens - 1) / page_tokens;
        for (int j = 0; j < np; ++j) {
          const int32_t p = layout.pages(region)[a.page_begin + j];
          ASSERT_GE(p, 0);
          ASSERT_LT(p, capacity);
          ASSERT_EQ(owner[size_t(a.head) * capacity + p], -1) << "page " << p << " given twice";
          owner[size_t(a.head) * capacity + p] = a.cluster;
          pages[hc].push_back(p);
        }
        resident[hc] = 1;
      }
    }
    AckRecord* ack = layout.ack(region);
    ack->step = step;
    ack->admitted = in_time ? 1 : 0;
    store_rel(ack->seq, seq);
    last_seq = seq;
    ++(in_time ? applied : dropped);
  }

  // Lookup + ring write for the step's selection ids [H, K] (ascending per head, -1 padded).
  void publish(const std::vector<int32_t>& ids) {
    const int K = layout.k, H = layout.heads;
    const int slot = int(step % uint64_t(layout.ring_slots));
    RingSlotHeader* hdr = layout.ring_header(region, slot);
    std::atomic_ref<uint64_t>(hdr->begin).store(step + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    int32_t* rid = layout.ring_ids(region, slot);
    int32_t* rrow = layout.ring_rows(region, slot);
    for (int h = 0; h < H; ++h) {
      int32_t row = 4;  // after a 4-row steady zone
      for (int j = 0; j < K; ++j) {
        const int32_t c = ids[size_t(h) * K + j];
        int32_t r = -1;
        if (c >= 0 && !resident[size_t(h) * C + c]) {
          r = row;
          row += sizes[size_t(h) * C + c];
        }
        std::atomic_ref<int32_t>(rid[size_t(h) * K + j]).store(c, std::memory_order_relaxed);
        std::atomic_ref<int32_t>(rrow[size_t(h) * K + j]).store(r, std::memory_order_relaxed);
      }
    }
    store_rel(hdr->end, step + 1);
    ++step;
  }

  int64_t used_pages(int h) const {
    int64_t n = 0;
    for (int64_t p = 0; p < capacity; ++p) n += owner[size_t(h) * capacity + p] >= 0;
    return n;
  }
};

// Selection trace with temporal locality: each head keeps a working set of clusters and replaces
// `churn` of its K picks per step by random others.
std::vector<int32_t> next_selection(std::vector<int32_t>& cur, int H, int K, int C, int churn, std::mt19937_64& rng) {
  for (int h = 0; h < H; ++h) {
    for (int r = 0; r < churn; ++r) {
      const int j = int(rng() % K);
      int32_t c;
      do c = int32_t(rng() % C);
      while (std::find(cur.begin() + h * K, cur.begin() + (h + 1) * K, c) != cur.begin() + (h + 1) * K);
      cur[size_t(h) * K + j] = c;
    }
  }
  std::vector<int32_t> out = cur;
  for (int h = 0; h < H; ++h) std::sort(out.begin() + h * K, out.begin() + (h + 1) * K);
  return out;
}

struct Rig {
  int H = 3, C = 50, K = 6, page_tokens = 8;
  int64_t capacity = 12;
  WaveProtocolLayout layout;
  std::vector<uint64_t> mem;  // 8-byte aligned region
  std::vector<int32_t> sizes;
  explicit Rig(uint64_t seed, int ring_slots = 4, int max_adm = 64) {
    layout = WaveProtocolLayout::make(H, K, ring_slots, 256, max_adm, 256);
    mem.assign(layout.total_bytes / 8 + 1, 0);
    std::mt19937_64 rng(seed);
    sizes.resize(size_t(H) * C);
    for (auto& s : sizes) s = 1 + int32_t(rng() % 24);
  }
  void* region() { return mem.data(); }
};

TEST(CacheManager, SingleThreadedPollAdmitsMissesAndAppliesInTime) {
  Rig rig(7);
  CacheManager m(rig.layout, rig.region(), rig.sizes, rig.C, rig.page_tokens, rig.capacity);
  FakeDevice dev(rig.layout, rig.region(), rig.C, rig.page_tokens, rig.capacity, rig.sizes);
  std::vector<int32_t> ids(size_t(rig.H) * rig.K, -1);
  for (int h = 0; h < rig.H; ++h) ids[size_t(h) * rig.K] = 2, ids[size_t(h) * rig.K + 1] = 5;
  dev.apply();
  dev.publish(ids);  // step 0: all misses
  EXPECT_TRUE(m.poll());
  const auto* mb = rig.layout.mailbox(rig.region());
  EXPECT_EQ(mb->seq, 1u);
  EXPECT_EQ(mb->src_step, 0u);
  EXPECT_EQ(mb->num_admissions, 2 * rig.H);
  EXPECT_EQ(mb->num_evictions, 0);
  dev.apply();  // step 1 applies the update in time
  EXPECT_EQ(dev.applied, 1u);
  dev.publish(ids);  // step 1: all hits
  EXPECT_TRUE(m.poll());
  const auto st = m.stats();
  EXPECT_EQ(st.steps_seen, 2u);
  EXPECT_EQ(st.misses, uint64_t(2 * rig.H));
  EXPECT_EQ(st.hits, uint64_t(2 * rig.H));
  EXPECT_EQ(st.updates, 1u);
  for (int h = 0; h < rig.H; ++h) {
    EXPECT_TRUE(m.lru(h).resident(2));
    EXPECT_TRUE(m.lru(h).resident(5));
    EXPECT_TRUE(dev.resident[size_t(h) * rig.C + 2]);
  }
}

TEST(CacheManager, LateUpdateIsRolledBack) {
  Rig rig(9);
  CacheManager m(rig.layout, rig.region(), rig.sizes, rig.C, rig.page_tokens, rig.capacity);
  FakeDevice dev(rig.layout, rig.region(), rig.C, rig.page_tokens, rig.capacity, rig.sizes);
  std::vector<int32_t> ids(size_t(rig.H) * rig.K, -1);
  ids[0] = 1;
  dev.apply();
  dev.publish(ids);  // step 0
  m.poll();          // update from step 0
  dev.publish(ids);  // step 1 runs without applying (as if the update arrived after its apply kernel)
  dev.apply();       // step 2's apply: too late, admissions dropped
  EXPECT_EQ(dev.dropped, 1u);
  EXPECT_FALSE(dev.resident[1]);
  dev.publish(ids);
  m.poll();
  EXPECT_EQ(m.stats().updates_dropped, 1u);
  EXPECT_EQ(m.stats().admitted, 1u);  // step 2's decision re-admits cluster 1 (step 1 was not the newest)
  dev.apply();  // step 3 applies step 2's update in time
  EXPECT_TRUE(dev.resident[1]);
  EXPECT_TRUE(m.lru(0).resident(1));
}

TEST(CacheManager, LappedRingStepsAreCountedLost) {
  Rig rig(11, /*ring_slots=*/2);
  CacheManager m(rig.layout, rig.region(), rig.sizes, rig.C, rig.page_tokens, rig.capacity);
  FakeDevice dev(rig.layout, rig.region(), rig.C, rig.page_tokens, rig.capacity, rig.sizes);
  std::vector<int32_t> ids(size_t(rig.H) * rig.K, -1);
  for (int s = 0; s < 5; ++s) dev.publish(ids);  // steps 0..4 into 2 slots: 0, 1, 2 are overwritten
  m.poll();
  EXPECT_EQ(m.stats().steps_lost, 3u);
  EXPECT_EQ(m.stats().steps_seen, 2u);
}

TEST(CacheManager, BadRingContentSurfacesOnTheOwnerThread) {
  Rig rig(13);
  CacheManager m(rig.layout, rig.region(), rig.sizes, rig.C, rig.page_tokens, rig.capacity);
  FakeDevice dev(rig.layout, rig.region(), rig.C, rig.page_tokens, rig.capacity, rig.sizes);
  m.start();
  std::vector<int32_t> ids(size_t(rig.H) * rig.K, -1);
  ids[0] = rig.C + 5;  // a cluster id the index does not have
  dev.publish(ids);
  EXPECT_THROW(m.wait_idle(1), Error);
  EXPECT_NO_THROW(m.stop());  // the error was delivered once
}

// Regression (seen on the GPU): the manager decides for step 0, the producer has meanwhile run its last
// step 1 (too early to apply the update) and stops. wait_idle(2) must return: no ack will come.
TEST(CacheManager, WaitIdleReturnsWhenTheLastUpdateCannotBeAckedYet) {
  Rig rig(17);
  CacheManager m(rig.layout, rig.region(), rig.sizes, rig.C, rig.page_tokens, rig.capacity);
  FakeDevice dev(rig.layout, rig.region(), rig.C, rig.page_tokens, rig.capacity, rig.sizes);
  std::vector<int32_t> ids(size_t(rig.H) * rig.K, -1);
  ids[0] = 3;
  m.start();
  dev.apply();
  dev.publish(ids);  // step 0: a miss
  for (int i = 0; i < 5000 && m.stats().updates == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(m.stats().updates, 1u);
  dev.publish(ids);  // step 1 without its apply: the update is outstanding, and no step follows
  m.wait_idle(2);    // returned: the step was consumed
  EXPECT_EQ(m.stats().steps_seen, 2u);
  m.stop();
}

TEST(CacheManager, RejectsInconsistentConstruction) {
  Rig rig(15);
  std::vector<int32_t> short_sizes(5, 8);
  EXPECT_THROW(CacheManager(rig.layout, rig.region(), short_sizes, rig.C, 8, 4), Error);
  EXPECT_THROW(CacheManager(rig.layout, nullptr, rig.sizes, rig.C, 8, 4), Error);
}

// Asynchronous run: the device steps at its own pace (a few microseconds per step, sometimes faster than
// the manager), so updates arrive in time, late, or get merged. Invariants hold at every step.
TEST(CacheManager, AsynchronousTraceKeepsDeviceAndManagerConsistent) {
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    Rig rig(seed, /*ring_slots=*/8, /*max_adm=*/4);
    CacheManager m(rig.layout, rig.region(), rig.sizes, rig.C, rig.page_tokens, rig.capacity);
    FakeDevice dev(rig.layout, rig.region(), rig.C, rig.page_tokens, rig.capacity, rig.sizes);
    std::mt19937_64 rng(seed * 77);
    std::vector<int32_t> cur(size_t(rig.H) * rig.K);
    for (int h = 0; h < rig.H; ++h)
      for (int j = 0; j < rig.K; ++j) cur[size_t(h) * rig.K + j] = j * 3 + h;  // distinct per head
    m.start();
    const int steps = 400;
    for (int s = 0; s < steps; ++s) {
      dev.apply();
      if (testing::Test::HasFatalFailure()) break;
      for (int h = 0; h < rig.H; ++h) ASSERT_LE(dev.used_pages(h), rig.capacity);
      dev.publish(next_selection(cur, rig.H, rig.K, rig.C, 1, rng));
      if (s % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (s % 50 == 49) m.wait_idle(uint64_t(s) + 1);  // deterministic points mixed in
    }
    m.wait_idle(steps);
    dev.apply();  // applies (or drops) the last update
    m.stop();
    m.poll();     // reads the final ack on this thread
    const auto st = m.stats();
    EXPECT_EQ(st.steps_seen + st.steps_lost, uint64_t(steps));
    EXPECT_GT(st.hits, 0u);
    EXPECT_EQ(st.updates, dev.applied + dev.dropped);
    // After the last ack the manager's LRU is exactly the device's page table.
    for (int h = 0; h < rig.H; ++h) {
      m.lru(h).check_invariants();
      EXPECT_LE(m.lru(h).used_pages(), rig.capacity);
      for (int c = 0; c < rig.C; ++c) {
        const size_t hc = size_t(h) * rig.C + c;
        ASSERT_EQ(m.lru(h).resident(c), dev.resident[hc] != 0) << "head " << h << " cluster " << c;
        if (dev.resident[hc]) {
          const auto p = m.lru(h).pages(c);
          EXPECT_EQ(std::vector<int32_t>(p.begin(), p.end()), dev.pages[hc]);
        }
      }
    }
  }
}

// Index update: the manager starts with the first C0 clusters of each head (the device's meta arrays have
// tail room for all C) and gains the rest between steps; steps naming the new clusters then miss, get
// admitted with their sizes, and hit.
TEST(CacheManager, AddClustersBetweenStepsSingleThreaded) {
  Rig rig(19);
  const int C0 = 30;
  std::vector<int32_t> first(size_t(rig.H) * C0);
  for (int h = 0; h < rig.H; ++h)
    std::copy_n(rig.sizes.begin() + size_t(h) * rig.C, C0, first.begin() + size_t(h) * C0);
  CacheManager m(rig.layout, rig.region(), first, C0, rig.page_tokens, rig.capacity);
  FakeDevice dev(rig.layout, rig.region(), rig.C, rig.page_tokens, rig.capacity, rig.sizes);
  std::vector<int32_t> ids(size_t(rig.H) * rig.K, -1);
  for (int h = 0; h < rig.H; ++h) ids[size_t(h) * rig.K] = 1;
  dev.apply();
  dev.publish(ids);
  m.poll();
  for (int h = 0; h < rig.H; ++h) {
    std::vector<int32_t> extra(rig.sizes.begin() + size_t(h) * rig.C + C0, rig.sizes.begin() + size_t(h + 1) * rig.C);
    m.add_clusters(h, extra);  // not running: applied at once
    EXPECT_EQ(m.lru(h).num_clusters(), rig.C);
  }
  for (int h = 0; h < rig.H; ++h) ids[size_t(h) * rig.K + 1] = rig.C - 1 - h;  // new clusters
  dev.apply();
  dev.publish(ids);  // step 1: cluster 1 hits, the new ones miss
  m.poll();
  dev.apply();       // step 2 applies the admissions of the new clusters
  dev.publish(ids);
  m.poll();
  for (int h = 0; h < rig.H; ++h) {
    const int32_t c = rig.C - 1 - h;
    EXPECT_TRUE(m.lru(h).resident(c)) << "head " << h;
    EXPECT_TRUE(dev.resident[size_t(h) * rig.C + c]) << "head " << h;
    EXPECT_EQ(m.lru(h).size(c), rig.sizes[size_t(h) * rig.C + c]);
    m.lru(h).check_invariants();
  }
  EXPECT_EQ(m.stats().hits, uint64_t(rig.H) + uint64_t(2 * rig.H));
  EXPECT_THROW(m.add_clusters(rig.H, first), Error);
  EXPECT_THROW(m.add_clusters(0, std::vector<int32_t>{-2}), Error);
}

// The same with the manager thread running and the device stepping at its own pace (run under TSAN too):
// clusters are added every 40 steps (one head at a time, like staggered layers) and selected from the next
// step on; the manager never sees an unknown id and ends equal to the device's page table.
TEST(CacheManager, AddClustersWhileRunningKeepsDeviceAndManagerConsistent) {
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    Rig rig(seed + 40, /*ring_slots=*/8, /*max_adm=*/4);
    int C0 = 20;
    std::vector<int32_t> first(size_t(rig.H) * C0);
    for (int h = 0; h < rig.H; ++h)
      std::copy_n(rig.sizes.begin() + size_t(h) * rig.C, C0, first.begin() + size_t(h) * C0);
    CacheManager m(rig.layout, rig.region(), first, C0, rig.page_tokens, rig.capacity);
    FakeDevice dev(rig.layout, rig.region(), rig.C, rig.page_tokens, rig.capacity, rig.sizes);
    std::vector<int> known(size_t(rig.H), C0);  // clusters each head's index has (device side)
    std::mt19937_64 rng(seed * 91);
    m.start();
    const int steps = 300;
    for (int s = 0; s < steps; ++s) {
      if (s % 40 == 39) {
        const int h = (s / 40) % rig.H;
        const int add = std::min(5, rig.C - known[size_t(h)]);
        std::vector<int32_t> extra(rig.sizes.begin() + size_t(h) * rig.C + known[size_t(h)],
                                   rig.sizes.begin() + size_t(h) * rig.C + known[size_t(h)] + add);
        m.add_clusters(h, extra);
        known[size_t(h)] += add;
      }
      dev.apply();
      if (testing::Test::HasFatalFailure()) break;
      std::vector<int32_t> ids(size_t(rig.H) * rig.K, -1);
      for (int h = 0; h < rig.H; ++h) {
        // K distinct picks, biased to the newest clusters (a drifting query finds the new tokens).
        std::vector<int32_t> pick;
        while (int(pick.size()) < rig.K) {
          const int n = known[size_t(h)];
          const int32_t c = (rng() % 2) ? int32_t(n - 1 - int(rng() % 8)) : int32_t(rng() % uint64_t(n));
          if (std::find(pick.begin(), pick.end(), c) == pick.end()) pick.push_back(c);
        }
        std::sort(pick.begin(), pick.end());
        std::copy(pick.begin(), pick.end(), ids.begin() + size_t(h) * rig.K);
      }
      dev.publish(ids);
      if (s % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (s % 50 == 49) m.wait_idle(uint64_t(s) + 1);
    }
    m.wait_idle(steps);
    // Queued after the last step: no ring step follows, stop() applies it.
    m.add_clusters(0, std::vector<int32_t>{rig.sizes[size_t(known[0])]});
    known[0] += 1;
    dev.apply();
    m.stop();
    m.poll();
    const auto st = m.stats();
    EXPECT_EQ(st.steps_seen + st.steps_lost, uint64_t(steps));
    for (int h = 0; h < rig.H; ++h) {
      ASSERT_EQ(m.lru(h).num_clusters(), known[size_t(h)]);
      m.lru(h).check_invariants();
      for (int c = 0; c < known[size_t(h)]; ++c) {
        const size_t hc = size_t(h) * rig.C + c;
        ASSERT_EQ(m.lru(h).resident(c), dev.resident[hc] != 0) << "head " << h << " cluster " << c;
      }
    }
    int new_resident = 0;
    for (int h = 0; h < rig.H; ++h)
      for (int c = C0; c < known[size_t(h)]; ++c) new_resident += m.lru(h).resident(c);
    EXPECT_GT(new_resident, 0) << "added clusters were admitted";
  }
}

}  // namespace
}  // namespace retroinfer::buffer
