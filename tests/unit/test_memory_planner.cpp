// Memory planner: byte accounting, GPU-first placement with spill to pinned host memory, and the clear
// refusals (bytes needed and free) before anything is allocated; /proc/meminfo parsing.
#include <gtest/gtest.h>

#include "retroinfer/memory_planner.h"
#include "retroinfer/session_planner.h"
#include "retroinfer/error.h"

namespace retroinfer::buffer {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

PlannerShape llama8b() { return PlannerShape{32, 8, 128, 2}; }

TEST(MemoryPlanner, StoreBytesFollowTheShape) {
  PlannerSettings s;
  const auto b = store_bytes(llama8b(), s, 131072);
  EXPECT_EQ(b.store, int64_t{131072} * 8 * 2 * 128 * 2);  // 512 MiB per layer: 16 GiB per sequence
  // 5% of 131072 = 6553.6 -> 6554 tokens -> 820 pages of 8.
  EXPECT_EQ(b.cache, int64_t{820} * 8 * 8 * 2 * 128 * 2);
  // Sinks, window, update tail and the outliers (0.1% of the indexed tokens and of one update).
  EXPECT_EQ(b.steady, int64_t{4 + 64 + 1024 + 131 + 1} * 8 * 2 * 128 * 2);
  // The layer's index copies: int8 centroids with their scale (the default int8 scoring), bf16 value sums
  // and 29 bytes of tables per cluster, a member id and an eighth of a page slot per indexed token, 8 bytes
  // per head (wave_buffer_layer.cpp).
  const int64_t n_idx = 131072 - 68, clusters = (n_idx + 15) / 16;
  EXPECT_EQ(b.meta, 8 * (clusters * (128 + 4 + 2 * 128 + 29) + 4 * n_idx + 4 * ((n_idx + 7) / 8) + 8));
  // No f32 copies: ~31 bytes per indexed token and head against the store's 512.
  EXPECT_LT(b.meta * 512 / b.store, 32);
  // bf16 scoring keeps bf16 centroids (2 D bytes) in place of the int8 ones.
  PlannerSettings bf16 = s;
  bf16.attention.int8_centroid_scoring = false;
  EXPECT_EQ(store_bytes(llama8b(), bf16, 131072).meta - b.meta, 8 * clusters * (2 * 128 - (128 + 4)));
  EXPECT_GT(b.exec, 0);
  EXPECT_LT(b.exec, b.store / 10);
}

// An int8 store: D int8 values and one f32 scale per K and per V row (wave_buffer.h store_token_bytes);
// everything on the GPU stays bf16.
TEST(MemoryPlanner, Int8StoreBytes) {
  PlannerSettings s;
  const auto b = store_bytes(llama8b(), s, 131072);
  s.store_dtype = StoreDtype::kInt8;
  const auto q = store_bytes(llama8b(), s, 131072);
  EXPECT_EQ(q.store, int64_t{131072} * 8 * (2 * 128 + 2 * 4));  // 264 MiB per layer against 512
  EXPECT_EQ(q.cache, b.cache);
  EXPECT_EQ(q.exec, b.exec);
  EXPECT_EQ(q.steady, b.steady);
  EXPECT_EQ(q.meta, b.meta);
  EXPECT_EQ(store_token_bytes(StoreDtype::kBf16, 64), 256);
  EXPECT_EQ(store_token_bytes(StoreDtype::kInt8, 64), 136);
  EXPECT_EQ(parse_store_dtype("int8"), StoreDtype::kInt8);
  EXPECT_EQ(parse_store_dtype("bf16"), StoreDtype::kBf16);
  EXPECT_EQ(store_dtype_name(StoreDtype::kInt8), "int8");
  // int4: D / 2 bytes of values and D / 32 bf16 scales per K and per V row; on the GPU, per cluster its K and V
  // base rows (2 D bf16), the clusters of the bf16 store's index.
  s.store_dtype = StoreDtype::kInt4;
  const auto q4 = store_bytes(llama8b(), s, 131072);
  EXPECT_EQ(q4.store, int64_t{131072} * 8 * (2 * 64 + 2 * 4 * 2));  // 144 MiB per layer against 512
  const int64_t clusters = (131072 - 68 + 15) / 16;  // as in StoreBytesFollowTheShape
  EXPECT_EQ(q4.meta - b.meta, 8 * clusters * 4 * 128);
  EXPECT_EQ(q4.cache, b.cache);
  EXPECT_EQ(store_token_bytes(StoreDtype::kInt4, 64), 72);
  EXPECT_EQ(store_token_bytes(StoreDtype::kInt4, 128), 144);
  EXPECT_EQ(parse_store_dtype("int4"), StoreDtype::kInt4);
  EXPECT_EQ(store_dtype_name(StoreDtype::kInt4), "int4");
  EXPECT_THROW(parse_store_dtype("fp8"), Error);
  EXPECT_THROW(parse_store_dtype("int2"), Error);
}

// The index's clusters come in segments: a segment of L tokens gets ceil(L / tokens_per_cluster) clusters,
// so where tokens_per_cluster does not divide segment_tokens every segment rounds up on its own. Counting
// ceil(n_idx / tokens_per_cluster) over the whole index under-planned the meta bytes.
TEST(MemoryPlanner, MetaCountsTheClustersOfEverySegment) {
  PlannerSettings s;
  s.attention.tokens_per_cluster = 24;  // 8192 / 24 = 341.3: 342 clusters per full segment
  const int64_t n = 131072, n_idx = n - 68;
  const StoreBytes b = store_bytes(llama8b(), s, n);
  const int64_t per_cluster = 8 * (128 + 4 + 2 * 128 + 29);  // int8 centroids (the default scoring)
  const auto per_index = [](int64_t tokens) -> int64_t { return 8 * (4 * tokens + 4 * ((tokens + 7) / 8) + 8); };
  const int64_t clusters = 15 * 342 + (8124 + 23) / 24;  // 15 full segments and one of 8124 tokens
  EXPECT_GT(clusters, (n_idx + 23) / 24);               // more than the whole index divided at once
  EXPECT_EQ(b.meta, clusters * per_cluster + per_index(n_idx));
  // The session planner's RetroLayer counts the same clusters.
  RetroLayerBytesRequest q;
  q.attention = s.attention;
  q.attention.kind = AttentionKind::kRetro;
  q.num_heads_kv = 8;
  q.group = 4;
  q.head_dim = 128;
  q.tokens = q.kv_stride = n;
  EXPECT_EQ(retro_layer_bytes(q).clusters, clusters);
  // Fewer indexable tokens than one cluster: the index is empty (every token steady), no meta.
  EXPECT_EQ(store_bytes(llama8b(), s, 68 + 23).meta, 0);
  EXPECT_EQ(store_bytes(llama8b(), s, 68 + 24).meta, per_cluster + per_index(24));
}

TEST(MemoryPlanner, EverythingOnTheGpuWhenItFits) {
  PlannerSettings s;
  const auto plan = plan_memory(llama8b(), s, {131072, 131072}, 139 * kGiB, 100 * kGiB);
  EXPECT_EQ(plan.gpu_stores, 64);
  EXPECT_EQ(plan.host_stores, 0);
  EXPECT_EQ(plan.gpu_store_bytes, 2 * 16 * kGiB);
  EXPECT_LE(plan.gpu_fixed_bytes + plan.gpu_store_bytes, 139 * kGiB);
  EXPECT_NE(plan.summary().find("GPU"), std::string::npos);
}

TEST(MemoryPlanner, SpillsToHostInSequenceThenLayerOrder) {
  PlannerSettings s;
  // 16 sequences of 128K: 256 GiB of stores. 100 GiB free on the GPU, 400 GiB on the host.
  const std::vector<int64_t> ctx(16, 131072);
  const auto plan = plan_memory(llama8b(), s, ctx, 100 * kGiB, 400 * kGiB);
  EXPECT_GT(plan.gpu_stores, 0);
  EXPECT_GT(plan.host_stores, 0);
  EXPECT_EQ(plan.gpu_stores + plan.host_stores, 16 * 32);
  EXPECT_LE(plan.gpu_fixed_bytes + plan.gpu_store_bytes, 100 * kGiB);
  // GPU-first: once a store went to the host, every later one (sequence-major) did too.
  bool spilled = false;
  for (const auto& seq : plan.tier)
    for (KvTier t : seq) {
      if (t == KvTier::kHost) spilled = true;
      else EXPECT_FALSE(spilled) << "a GPU store after a host store";
    }
  EXPECT_EQ(plan.host_store_bytes, plan.host_stores * 512 * (int64_t{1} << 20));
}

TEST(MemoryPlanner, ForcedTier) {
  PlannerSettings s;
  s.force_tier = KvTier::kHost;
  const auto plan = plan_memory(llama8b(), s, {32768}, 139 * kGiB, 100 * kGiB);
  EXPECT_EQ(plan.host_stores, 32);
  EXPECT_EQ(plan.gpu_stores, 0);
  s.force_tier = KvTier::kGpu;
  EXPECT_THROW(plan_memory(llama8b(), s, std::vector<int64_t>(16, 131072), 100 * kGiB, 400 * kGiB), Error);
}

TEST(MemoryPlanner, RefusesWithNeededAndFreeBytes) {
  PlannerSettings s;
  // Host too small: 16 x 16 GiB of stores, ~100 GiB of GPU, 50 GiB MemAvailable (40 usable).
  try {
    plan_memory(llama8b(), s, std::vector<int64_t>(16, 131072), 100 * kGiB, 50 * kGiB);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("pinned host memory"), std::string::npos) << w;
    EXPECT_NE(w.find("40.00 GiB"), std::string::npos) << w;  // usable = 50 * 0.8
    EXPECT_NE(w.find("GiB"), std::string::npos);
  }
  // GPU fixed parts alone do not fit: 1M-token contexts, 1 GiB of GPU memory.
  try {
    plan_memory(llama8b(), s, std::vector<int64_t>(4, 1 << 20), 1 * kGiB, 1000 * kGiB);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string w = e.what();
    EXPECT_NE(w.find("GPU-resident parts"), std::string::npos) << w;
    EXPECT_NE(w.find("1.00 GiB free"), std::string::npos) << w;
  }
  EXPECT_THROW(plan_memory(llama8b(), s, {}, kGiB, kGiB), Error);
  EXPECT_THROW(plan_memory(llama8b(), s, {0}, kGiB, kGiB), Error);
  EXPECT_THROW(plan_memory(PlannerShape{0, 8, 128, 2}, s, {10}, kGiB, kGiB), Error);
  s.cache_fraction = 1.5;
  EXPECT_THROW(plan_memory(llama8b(), s, {10}, kGiB, kGiB), Error);
  s.cache_fraction = 0.05;
  s.attention.tokens_per_cluster = 0;  // the attention parameters are validate(AttentionConfig)'s
  EXPECT_THROW(plan_memory(llama8b(), s, {10}, kGiB, kGiB), Error);
}

TEST(MemoryPlanner, GpuReserveIsHonoured) {
  PlannerSettings s;
  s.gpu_reserve_bytes = 20 * kGiB;
  const auto plan = plan_memory(llama8b(), s, std::vector<int64_t>(8, 131072), 100 * kGiB, 400 * kGiB);
  EXPECT_LE(plan.gpu_fixed_bytes + plan.gpu_store_bytes, 80 * kGiB);
  EXPECT_GT(plan.host_stores, 0);
}

TEST(MemoryPlanner, ParsesMeminfo) {
  const char* text =
      "MemTotal:       131072000 kB\nMemFree:         1000 kB\nMemAvailable:   65536000 kB\nBuffers: 1 kB\n";
  EXPECT_EQ(parse_meminfo_available(text), int64_t{65536000} * 1024);
  EXPECT_THROW(parse_meminfo_available("MemTotal: 5 kB\n"), Error);
  EXPECT_THROW(parse_meminfo_available("MemAvailable: lots\n"), Error);
  EXPECT_THROW(parse_meminfo_available("XMemAvailable: 5 kB\n"), Error);
  EXPECT_GT(host_memory_available(), 0);  // this machine's own /proc/meminfo
}

}  // namespace
}  // namespace retroinfer::buffer
