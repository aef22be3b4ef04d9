// Cluster traces (retroinfer/cluster_trace.h): the file format round trip and its validation, the block-cache
// replay (retroinfer/cache_replay.h) on traces whose hit ratios are known by construction, and the CPU retro
// method's recording.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "attention/retro.h"
#include "error_of.h"
#include "retroinfer/cache_replay.h"
#include "retroinfer/cluster_trace.h"
#include "retroinfer/model.h"
#include "retroinfer/wave_counts.h"
#include "tiny_model_util.h"

using retroinfer::CacheReplayOptions;
using retroinfer::CacheReplayResult;
using retroinfer::ClusterTrace;
using retroinfer::ClusterTraceHeader;
using retroinfer::ClusterTraceRecord;
using retroinfer::ClusterTraceWriter;
using retroinfer::read_cluster_trace;
using retroinfer::replay_cluster_trace;
using retroinfer::test::error_of;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("retroinfer_trace_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

ClusterTraceHeader header(int layers, int heads) {
  ClusterTraceHeader h;
  h.num_layers = layers;
  h.num_heads_kv = heads;
  h.head_dim = 64;
  h.source = "unit test";
  return h;
}

ClusterTraceRecord record(int step, int layer, int head, int num_clusters, int64_t context, std::vector<int32_t> ids,
                          int32_t size) {
  ClusterTraceRecord r;
  r.step = step;
  r.layer = layer;
  r.head = head;
  r.num_clusters = num_clusters;
  r.context_tokens = context;
  r.ids = std::move(ids);
  r.sizes.assign(r.ids.size(), size);
  return r;
}

std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

void write_bytes(const std::string& path, const std::string& b) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(b.data(), static_cast<std::streamsize>(b.size()));
}

}  // namespace

TEST(ClusterTrace, RoundTrip) {
  const std::string path = temp_path("roundtrip");
  std::vector<ClusterTraceRecord> recs = {record(0, 0, 0, 10, 1001, {1, 4, 7}, 8), record(0, 0, 1, 10, 1001, {}, 8),
                                          record(0, 1, 0, 12, 1001, {0, 11}, 16), record(1, 0, 0, 10, 1002, {2}, 8)};
  recs[0].sizes = {8, 9, 10};
  recs[2].seq = 3;
  {
    ClusterTraceWriter w(path, header(2, 2));
    for (const auto& r : recs) w.write(r);
    EXPECT_EQ(w.records_written(), 4);
  }
  const ClusterTrace t = read_cluster_trace(path);
  EXPECT_EQ(t.header.num_layers, 2);
  EXPECT_EQ(t.header.num_heads_kv, 2);
  EXPECT_EQ(t.header.head_dim, 64);
  EXPECT_EQ(t.header.source, "unit test");
  ASSERT_EQ(t.records.size(), recs.size());
  for (size_t i = 0; i < recs.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(t.records[i].step, recs[i].step);
    EXPECT_EQ(t.records[i].layer, recs[i].layer);
    EXPECT_EQ(t.records[i].seq, recs[i].seq);
    EXPECT_EQ(t.records[i].head, recs[i].head);
    EXPECT_EQ(t.records[i].num_clusters, recs[i].num_clusters);
    EXPECT_EQ(t.records[i].context_tokens, recs[i].context_tokens);
    EXPECT_EQ(t.records[i].ids, recs[i].ids);
    EXPECT_EQ(t.records[i].sizes, recs[i].sizes);
  }
  std::remove(path.c_str());
}

TEST(ClusterTrace, BadFilesAreClearErrors) {
  const std::string path = temp_path("bad");
  {
    ClusterTraceWriter w(path, header(2, 2));
    w.write(record(0, 0, 0, 10, 1001, {1, 4, 7}, 8));
    w.write(record(0, 1, 1, 10, 1001, {2, 3}, 8));
  }
  const std::string good = read_bytes(path);
  const size_t header_bytes = 28 + std::string("unit test").size();
  ASSERT_EQ(good.size(), header_bytes + 32 + 3 * 8 + 32 + 2 * 8);
  EXPECT_EQ(read_cluster_trace(path).records.size(), 2u);

  EXPECT_NE(error_of([&] { read_cluster_trace(path + ".missing"); }).find("cannot open"), std::string::npos);
  std::string b = good;
  b[0] = 'X';
  write_bytes(path, b);
  EXPECT_NE(error_of([&] { read_cluster_trace(path); }).find("not a cluster trace"), std::string::npos);
  b = good;
  b[8] = 9;  // version
  write_bytes(path, b);
  EXPECT_NE(error_of([&] { read_cluster_trace(path); }).find("format version 9"), std::string::npos);
  write_bytes(path, good.substr(0, 20));
  EXPECT_NE(error_of([&] { read_cluster_trace(path); }).find("truncated header"), std::string::npos);
  write_bytes(path, good.substr(0, header_bytes - 2));
  EXPECT_NE(error_of([&] { read_cluster_trace(path); }).find("truncated header"), std::string::npos);
  // Every cut inside a record is reported as a truncated record (and names it).
  for (size_t cut : {header_bytes + 5, header_bytes + 32 + 4, good.size() - 1}) {
    SCOPED_TRACE(cut);
    write_bytes(path, good.substr(0, cut));
    const std::string e = error_of([&] { read_cluster_trace(path); });
    EXPECT_NE(e.find("truncated"), std::string::npos) << e;
    EXPECT_NE(e.find("record"), std::string::npos) << e;
  }
  // A record naming a layer the header does not have.
  b = good;
  b[header_bytes + 4] = 5;
  write_bytes(path, b);
  EXPECT_NE(error_of([&] { read_cluster_trace(path); }).find("layer 5 outside [0, 2)"), std::string::npos);
  // A cluster id past the record's cluster count (first id of record 0: 1 -> 77).
  b = good;
  b[header_bytes + 32] = 77;
  write_bytes(path, b);
  EXPECT_NE(error_of([&] { read_cluster_trace(path); }).find("cluster id 77 outside"), std::string::npos);
  // The writer refuses what the reader would refuse.
  {
    ClusterTraceWriter w(path, header(2, 2));
    EXPECT_NE(error_of([&] { w.write(record(0, 0, 0, 10, 1001, {4, 1}, 8)); }).find("not strictly ascending"),
              std::string::npos);
    EXPECT_NE(error_of([&] { w.write(record(0, 0, 2, 10, 1001, {1}, 8)); }).find("head 2 outside"), std::string::npos);
    EXPECT_NE(error_of([&] { w.write(record(0, 0, 0, 10, 4, {1}, 8)); }).find("size 8 outside"), std::string::npos);
  }
  EXPECT_NE(error_of([] { ClusterTraceWriter w("/nonexistent-dir/x.trace", header(1, 1)); }).find("cannot create"),
            std::string::npos);
  std::remove(path.c_str());
}

namespace {

// One flat head per layer; prompt of 1000 tokens (context 1001 at step 0): a 5% cache holds
// ceil(50 / 8) = 7 pages, a 10% cache ceil(100 / 8) = 13 pages.
ClusterTrace synthetic(const std::vector<std::vector<std::vector<int32_t>>>& per_layer_steps, int32_t size = 8) {
  ClusterTrace t;
  t.header = header(static_cast<int>(per_layer_steps.size()), 1);
  for (size_t l = 0; l < per_layer_steps.size(); ++l)
    for (size_t s = 0; s < per_layer_steps[l].size(); ++s)
      t.records.push_back(record(int(s), int(l), 0, 64, 1001 + int64_t(s), per_layer_steps[l][s], size));
  return t;
}

}  // namespace

// The same 4 one-page clusters every step: 4 cold misses, then every selection hits.
TEST(CacheReplay, RepeatedSelectionHitsAfterTheFirstStep) {
  const int S = 20;
  const ClusterTrace t = synthetic({std::vector<std::vector<int32_t>>(S, {3, 9, 17, 40})});
  CacheReplayOptions o;
  o.cache_fractions = {0.05};
  o.window_steps = 10;
  const auto r = replay_cluster_trace(t, o);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].capacity_pages_min, 7);
  EXPECT_EQ(r[0].total.miss_clusters, 4u);
  EXPECT_EQ(r[0].total.hit_clusters, 4u * (S - 1));
  EXPECT_EQ(r[0].total.hit_tokens, 8u * 4 * (S - 1));
  EXPECT_DOUBLE_EQ(r[0].total.hit_ratio(), double(S - 1) / S);
  ASSERT_EQ(r[0].per_window.size(), 2u);
  EXPECT_DOUBLE_EQ(r[0].per_window[0].hit_ratio(), 36.0 / 40.0);
  EXPECT_DOUBLE_EQ(r[0].per_window[1].hit_ratio(), 1.0);
}

// Three sets of 4 clusters in turn (12 pages of working set): LRU on a cycle larger than the 7-page cache
// never hits; the 13-page cache misses only the first round.
TEST(CacheReplay, CycleLargerThanTheCacheNeverHits) {
  const std::vector<std::vector<int32_t>> sets = {{0, 1, 2, 3}, {10, 11, 12, 13}, {20, 21, 22, 23}};
  std::vector<std::vector<int32_t>> steps;
  const int S = 30;
  for (int s = 0; s < S; ++s) steps.push_back(sets[size_t(s % 3)]);
  const ClusterTrace t = synthetic({steps});
  CacheReplayOptions o;
  o.cache_fractions = {0.05, 0.10};
  const auto r = replay_cluster_trace(t, o);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].total.hit_clusters, 0u);
  EXPECT_EQ(r[0].total.miss_clusters, 4u * S);
  EXPECT_EQ(r[1].capacity_pages_min, 13);
  EXPECT_EQ(r[1].total.miss_clusters, 12u);
  EXPECT_EQ(r[1].total.hit_clusters, 4u * (S - 3));
}

// Per layer: layer 0 repeats, layer 1 cycles; clusters of 20 tokens take 3 pages each (a 5% cache of 7
// pages holds 2 of them), so layer 0's pair hits after step 0 while layer 1's cycle of three clusters
// always evicts the one it needs next.
TEST(CacheReplay, PerLayerAndMultiPageClusters) {
  const int S = 12;
  std::vector<std::vector<int32_t>> repeat(S, {5, 6}), cycle;
  for (int s = 0; s < S; ++s) cycle.push_back({int32_t(s % 3)});
  const ClusterTrace t = synthetic({repeat, cycle}, 20);
  CacheReplayOptions o;
  o.cache_fractions = {0.05};
  const auto r = replay_cluster_trace(t, o);
  ASSERT_EQ(r[0].per_layer.size(), 2u);
  EXPECT_EQ(r[0].per_layer[0].miss_clusters, 2u);
  EXPECT_EQ(r[0].per_layer[0].hit_clusters, 2u * (S - 1));
  // Layer 1: 7 pages hold two 3-page clusters; a cycle of three evicts the one needed next: never a hit.
  EXPECT_EQ(r[0].per_layer[1].hit_clusters, 0u);
  EXPECT_EQ(r[0].per_layer[1].miss_tokens, 20u * S);
  EXPECT_EQ(r[0].total.hit_clusters + r[0].total.miss_clusters, 3u * S);
}

// Misses split into first references (next to a recent selection or not) and capacity misses. Clusters of
// 20 tokens take 3 pages, so the 7-page cache holds two: 1, 2, 3 are first references (2 and 3 next to the
// previous step's cluster), 1 again has been evicted by 3 (capacity), 9 is a first reference with no
// neighbour selected, 2 again has been evicted (capacity); 12 is 3 ids from 9, 14 is 2 ids from 12 but 12's
// selection is kNearSteps + 1 steps old by then.
TEST(CacheReplay, MissesSplitIntoFirstReferencesAndCapacity) {
  const ClusterTrace t = synthetic({{{1}, {2}, {3}, {1}, {9}, {2}, {12}, {1}, {1}, {1}, {1}, {1}, {14}}}, 20);
  CacheReplayOptions o;
  o.cache_fractions = {0.05};
  const auto r = replay_cluster_trace(t, o);
  const auto& c = r[0].total;
  EXPECT_EQ(c.first_misses, 6u);       // 1, 2, 3, 9, 12, 14
  EXPECT_EQ(c.first_misses_near, 2u);  // 2, 3
  EXPECT_EQ(c.capacity_misses(), 3u);  // 1 (step 3), 2 (step 5), 1 (step 7: evicted by 2 and 12)
  EXPECT_EQ(c.miss_clusters, 9u);
  EXPECT_EQ(c.hit_clusters, 4u);  // 1 at steps 8 to 11
}

TEST(CacheReplay, InconsistentTracesAndOptionsAreErrors) {
  ClusterTrace t = synthetic({{{1, 2}, {1, 2}}});
  t.records[1].sizes = {8, 9};
  EXPECT_NE(error_of([&] { replay_cluster_trace(t, {}); }).find("with sizes 8 and 9"), std::string::npos);
  t = synthetic({{{1}, {2}}});
  t.records[1].step = 0;
  EXPECT_NE(error_of([&] { replay_cluster_trace(t, {}); }).find("two records of step 0"), std::string::npos);
  CacheReplayOptions o;
  o.cache_fractions = {0.0};
  EXPECT_NE(error_of([&] { replay_cluster_trace(synthetic({{{1}}}), o); }).find("outside (0, 1]"), std::string::npos);
}

// The CPU method records one record per decode step and KV head: its retrieval zone's clusters with their
// sizes from its index; the file replays.
TEST(ClusterTrace, CpuRetroRecordsItsSelections) {
  const std::string path = temp_path("cpu_retro");
  const retroinfer::AttentionShape shape{4, 2, 64};
  retroinfer::AttentionConfig cfg;
  cfg.sink_tokens = 4;
  cfg.window_tokens = 16;
  cfg.tokens_per_cluster = 8;
  cfg.segment_tokens = 128;
  retroinfer::KvCache kv(2, 64, retroinfer::DType::kF32);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  auto append = [&](int64_t n) {
    std::vector<float> k(size_t(n) * 2 * 64), v(k.size());
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    kv.append(k.data(), v.data(), n);
  };
  append(600);
  const int S = 5;
  {
    auto w = std::make_shared<ClusterTraceWriter>(path, header(3, 2));
    retroinfer::attention::RetroAttention retro(cfg, shape);
    retro.set_cluster_trace(w.get(), 2);
    retro.on_prefill(kv);
    std::vector<float> q(4 * 64), out(q.size());
    for (int s = 0; s < S; ++s) {
      append(1);
      for (auto& x : q) x = nd(rng);
      retro.decode(kv, q.data(), out.data());
    }
    const auto& idx = retro.wave_index();
    w->flush();
    const ClusterTrace t = read_cluster_trace(path);
    ASSERT_EQ(t.records.size(), size_t(S) * 2);
    for (size_t i = 0; i < t.records.size(); ++i) {
      const ClusterTraceRecord& r = t.records[i];
      SCOPED_TRACE(i);
      EXPECT_EQ(r.step, int(i / 2));
      EXPECT_EQ(r.layer, 2);
      EXPECT_EQ(r.head, int(i % 2));
      EXPECT_EQ(r.context_tokens, 601 + int64_t(i / 2));
      const auto& hi = idx.heads[size_t(r.head)];
      EXPECT_EQ(r.num_clusters, hi.num_clusters());
      EXPECT_GT(r.num_clusters, 10);
      EXPECT_EQ(int(r.ids.size()), retroinfer::zone_counts(hi.num_clusters(), cfg).n_retrieval);
      for (size_t j = 0; j < r.ids.size(); ++j) EXPECT_EQ(r.sizes[j], hi.sizes[size_t(r.ids[j])]);
    }
    CacheReplayOptions o;
    const auto rep = replay_cluster_trace(t, o);
    EXPECT_EQ(rep.size(), 3u);
    EXPECT_EQ(rep[0].per_layer[2].hit_clusters + rep[0].per_layer[2].miss_clusters,
              uint64_t(S) * 2 * t.records[0].ids.size());
  }
  std::remove(path.c_str());
}

// The benchmark mapping of docs/wave-buffer.md#cluster-traces: layers and heads wrap with step offsets,
// clusters scale by the ratio of cluster counts, the budget caps the count, and steps wrap.
TEST(ClusterTraceSchedule, MapsLayersHeadsStepsAndClusters) {
  ClusterTrace t;
  t.header = header(2, 2);
  const int S = 40;
  for (int s = 0; s < S; ++s)
    for (int l = 0; l < 2; ++l)
      for (int h = 0; h < 2; ++h)  // ids encode (layer, head, step) so the mapping can be read back
        t.records.push_back(record(s, l, h, 100, 1001 + s, {l * 10 + h, 50 + s}, 8));
  const retroinfer::ClusterTraceSchedule sched(t);
  std::vector<int32_t> ids(8);
  // Same shape and cluster count: the trace's ids, padded.
  sched.retrieval_ids(1, 1, 3, 100, 4, ids.data());
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 4), (std::vector<int32_t>{11, 53, -1, -1}));
  // Target layer 3, flat head 2 -> trace layer 1, head 0; step 5 + 16 * (2 / 2) + 8 * (3 / 2) = 29.
  sched.retrieval_ids(3, 2, 5, 100, 4, ids.data());
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 4), (std::vector<int32_t>{10, 79, -1, -1}));
  // Steps wrap modulo the 40 recorded steps.
  sched.retrieval_ids(0, 0, 41, 100, 2, ids.data());
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 2), (std::vector<int32_t>{0, 51}));
  // Twice the clusters: each trace cluster c becomes {2c, 2c + 1}.
  sched.retrieval_ids(0, 1, 0, 200, 8, ids.data());
  EXPECT_EQ(ids, (std::vector<int32_t>{2, 3, 100, 101, -1, -1, -1, -1}));
  // A budget below the mapped count keeps evenly spaced ids (4 of {2, 3, 100, 101} -> 2 of them).
  sched.retrieval_ids(0, 1, 0, 200, 2, ids.data());
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 2), (std::vector<int32_t>{2, 100}));
  // Half the clusters: ids halve and merge when equal.
  t.records[0].ids = {4, 5};
  const retroinfer::ClusterTraceSchedule merged(t);
  merged.retrieval_ids(0, 0, 0, 50, 4, ids.data());
  EXPECT_EQ(std::vector<int32_t>(ids.begin(), ids.begin() + 4), (std::vector<int32_t>{2, -1, -1, -1}));
  EXPECT_NE(sched.rule().find("trace layer l % 2"), std::string::npos);
  t.records.erase(t.records.begin() + 1);  // layer 0 head 1 loses step 0: still fine
  EXPECT_NO_THROW(retroinfer::ClusterTraceSchedule{t});
  ClusterTrace missing = t;
  std::erase_if(missing.records, [](const ClusterTraceRecord& r) { return r.layer == 1 && r.head == 1; });
  EXPECT_NE(error_of([&] { retroinfer::ClusterTraceSchedule{missing}; }).find("layer 1 head 1"), std::string::npos);
}

// Remembered mappings: asking again, from another target head on the same record, or with another cluster
// count or budget in between, gives what a fresh schedule gives on its first call.
TEST(ClusterTraceSchedule, RememberedRecordsMapAsFreshOnes) {
  ClusterTrace t;
  t.header = header(2, 2);
  const int S = 40;
  for (int s = 0; s < S; ++s)
    for (int l = 0; l < 2; ++l)
      for (int h = 0; h < 2; ++h)
        t.records.push_back(record(s, l, h, 100, 1001 + s, {l * 10 + h, 30 + s, 60 + s}, 8));
  const retroinfer::ClusterTraceSchedule warm(t);
  std::vector<int32_t> a(8), b(8);
  struct Ask { int layer, head; int64_t step; int clusters, n_r; };
  const Ask asks[] = {{0, 0, 3, 100, 4}, {0, 2, 3 - 16 + S, 100, 4},  // flat head 2 replays head 0's record
                      {0, 0, 3, 250, 4}, {0, 0, 3, 100, 2}, {0, 0, 3, 100, 4}, {1, 3, 7, 37, 3},
                      {1, 1, 7 + 16, 37, 3}, {3, 1, 7 + 16 - 8, 37, 3}};
  for (const Ask& q : asks) {
    SCOPED_TRACE(testing::Message() << "layer " << q.layer << " head " << q.head << " step " << q.step << " C "
                                    << q.clusters << " n_r " << q.n_r);
    const retroinfer::ClusterTraceSchedule fresh(t);
    std::fill(a.begin(), a.end(), 7777);
    std::fill(b.begin(), b.end(), 7777);
    warm.retrieval_ids(q.layer, q.head, q.step, q.clusters, q.n_r, a.data());
    fresh.retrieval_ids(q.layer, q.head, q.step, q.clusters, q.n_r, b.data());
    EXPECT_EQ(a, b);  // the n_r written and the untouched rest
  }
}

// The CPU runner: SessionOptions::cluster_trace reaches every layer's method; a fork does not record.
TEST(ClusterTrace, CpuSessionRecordsEveryLayer) {
  const retroinfer::Model* m = retroinfer::test::tiny_llama3();
  if (m == nullptr) GTEST_SKIP() << "tests/data/models/tiny-llama3 missing";
  const std::string path = temp_path("session");
  const auto& c = m->config();
  retroinfer::SessionOptions so;
  so.attention.kind = retroinfer::AttentionKind::kRetro;
  so.attention.sink_tokens = 4;
  so.attention.window_tokens = 16;
  so.attention.tokens_per_cluster = 4;
  so.cluster_trace = std::make_shared<ClusterTraceWriter>(path, header(c.num_layers, c.num_heads_kv));
  const int S = 4;
  {
    retroinfer::Session s(*m, so);
    std::vector<float> logits(size_t(c.vocab_size));
    s.prefill(retroinfer::test::token_stream(300, 5));
    for (int i = 0; i < S; ++i) s.decode(7 + i, logits);
    auto f = s.fork(so.attention);
    f->decode(3, logits);
  }
  so.cluster_trace->flush();
  const ClusterTrace t = read_cluster_trace(path);
  ASSERT_EQ(t.records.size(), size_t(S) * c.num_layers * c.num_heads_kv);
  for (size_t i = 0; i < t.records.size(); ++i) {
    const ClusterTraceRecord& r = t.records[i];
    SCOPED_TRACE(i);
    EXPECT_EQ(r.step, int(i) / (c.num_layers * c.num_heads_kv));
    EXPECT_EQ(r.layer, int(i / c.num_heads_kv) % c.num_layers);
    EXPECT_EQ(r.context_tokens, 301 + r.step);
    EXPECT_GT(r.ids.size(), 0u);
  }
  std::remove(path.c_str());
}
