// CUDA session memory planner (buffer/session_planner.h): exact KV arithmetic, placements (GPU, host,
// split with the most GPU layers that fit, auto), and the refusal before allocation with the bytes
// needed and free on each side. Pure host arithmetic: no GPU needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "retroinfer/session_planner.h"
#include "retroinfer/error.h"
#include "retroinfer/model_shapes.h"

namespace retroinfer::buffer {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

SessionPlanRequest llama(AttentionKind kind, int64_t ctx, int seqs, KvPlacement placement, int64_t gpu_free,
                         int64_t host_free) {
  SessionPlanRequest r;
  set_model_shape(r, model_shape("llama3-8b"));
  r.attention.kind = kind;
  r.max_context = ctx;
  r.num_seqs = seqs;
  r.placement = placement;
  r.gpu_free_bytes = gpu_free;
  r.host_free_bytes = host_free;
  return r;
}

// The runner's RetroLayer of Llama-3-8B (8 KV heads, group 4, head_dim 128) at its planning bounds.
void set_retro_shape(RetroLayerBytesRequest& q, int seqs, int64_t tokens) {
  q.attention.kind = AttentionKind::kRetro;
  q.num_seqs = seqs;
  q.num_heads_kv = 8;
  q.group = 4;
  q.head_dim = 128;
  q.tokens = q.kv_stride = tokens;
  q.growth_bound = true;
}

std::string gib(int64_t bytes) {  // the planner's formatting
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(kGiB));
  return buf;
}

TEST(SessionPlanner, FullOnGpuFitsWithExactKv) {
  const SessionPlanBreakdown p =
      plan_session(llama(AttentionKind::kFull, 32768, 2, KvPlacement::kGpu, 100 * kGiB, 0));
  // One layer, 2 sequences: 2 (K, V) x 2 x 8 heads x 32768 x 128 x 2 bytes = 256 MiB.
  EXPECT_EQ(p.kv_layer_bytes, int64_t{256} << 20);
  EXPECT_EQ(p.gpu_layers, 32);
  EXPECT_EQ(p.host_layers, 0);
  EXPECT_EQ(p.host_bytes, 0);
  EXPECT_EQ(p.staging_bytes, 0);
  EXPECT_EQ(p.placement, KvPlacement::kGpu);
  // Everything else is small beside the KV (8 GiB): the f32 activations of a 2048-token chunk are
  // 2048 x (2 x 4096 + 48 x 128 + 32 x 128 + 3 x 14336) x 4 B = 0.47 GiB, split workspaces 32 x 2 MiB.
  EXPECT_GE(p.gpu_bytes, 32 * p.kv_layer_bytes);
  EXPECT_LT(p.gpu_bytes, 32 * p.kv_layer_bytes + kGiB);
  EXPECT_EQ(p.gpu_bytes, p.activation_bytes + p.logits_bytes + p.weight_bytes +
                             32 * (p.kv_layer_bytes + p.method_layer_bytes));
  EXPECT_EQ(p.logits_bytes, 2 * 128256 * 4);
}

TEST(SessionPlanner, FullKvGrowsExactlyWithContext) {
  // 32K more tokens of 4 sequences: 2 (K, V) x 32 layers x 4 x 8 heads x 32768 x 128 x 2 bytes = 16 GiB; the
  // activations depend on the chunk, the decoders' workspaces on nothing.
  const auto a = plan_session(llama(AttentionKind::kFull, 32768, 4, KvPlacement::kGpu, 100 * kGiB, 0));
  const auto b = plan_session(llama(AttentionKind::kFull, 65536, 4, KvPlacement::kGpu, 100 * kGiB, 0));
  EXPECT_EQ(b.gpu_bytes - a.gpu_bytes, 16 * kGiB);
  SessionPlanRequest r = llama(AttentionKind::kFull, 32768, 4, KvPlacement::kGpu, 100 * kGiB, 0);
  r.activation_bytes_override = 12345;  // the runner's own figure replaces activations and logits
  const auto o = plan_session(r);
  EXPECT_EQ(o.activation_bytes, 12345);
  EXPECT_EQ(o.logits_bytes, 0);
  EXPECT_EQ(o.gpu_bytes, a.gpu_bytes - a.activation_bytes - a.logits_bytes + 12345);
}

TEST(SessionPlanner, WeightsNotYetLoadedCount) {
  SessionPlanRequest r = llama(AttentionKind::kFull, 4096, 1, KvPlacement::kGpu, 100 * kGiB, 0);
  const int64_t without = plan_session(r).gpu_bytes;
  r.weight_bytes = 15 * kGiB;
  EXPECT_EQ(plan_session(r).gpu_bytes, without + 15 * kGiB);
}

TEST(SessionPlanner, RetroGpuTierCostsMoreThanFullButLessThanTwice) {
  const auto full = plan_session(llama(AttentionKind::kFull, 131072, 1, KvPlacement::kGpu, 200 * kGiB, 0));
  const auto retro = plan_session(llama(AttentionKind::kRetro, 131072, 1, KvPlacement::kGpu, 200 * kGiB, 0));
  EXPECT_GT(retro.method_layer_bytes, full.method_layer_bytes);
  // Metadata per indexed token and head with int8 centroid scoring (the default): (3 D + 16 + 4 G) / 16 + 8 +
  // lists ~ 33 B vs 512 B of K/V.
  EXPECT_LT(retro.method_layer_bytes, retro.kv_layer_bytes / 10);
  EXPECT_GT(retro.method_layer_bytes, retro.kv_layer_bytes / 16);
  // Keeping the f32 copies of centroids and value sums (RetroLayer's default outside the runner): 8 D more
  // per cluster, (8 x 128) / 16 = 64 B more per token and head.
  SessionPlanRequest f32 = llama(AttentionKind::kRetro, 131072, 1, KvPlacement::kGpu, 200 * kGiB, 0);
  f32.retro_keeps_f32_index = true;
  const auto f = plan_session(f32);
  EXPECT_NEAR(static_cast<double>(f.method_layer_bytes - retro.method_layer_bytes),
              64.0 * 8 * (131072 - 68), 8.0 * 8 * 128 * 4 * 16);
  EXPECT_GT(retro.build_workspace_bytes, 0);  // transient, once
  SessionPlanRequest kept = llama(AttentionKind::kRetro, 131072, 1, KvPlacement::kGpu, 200 * kGiB, 0);
  kept.retro_keeps_build_buffers = true;
  const auto k = plan_session(kept);
  // Kept per layer, the build workspace moves into the method bytes; the transient is then one update's.
  RetroLayerBytesRequest q;
  set_retro_shape(q, 1, 131072);
  const RetroLayerBytes rb = retro_layer_bytes(q);
  EXPECT_EQ(retro.build_workspace_bytes, std::max(rb.build, rb.update));
  EXPECT_EQ(k.build_workspace_bytes, rb.update);
  EXPECT_EQ(k.method_layer_bytes, retro.method_layer_bytes + rb.build);
}

TEST(SessionPlanner, HostPlacementPutsEveryStoreOnTheHost) {
  const auto p = plan_session(llama(AttentionKind::kRetro, 131072, 2, KvPlacement::kHost, 100 * kGiB, 100 * kGiB));
  EXPECT_EQ(p.gpu_layers, 0);
  EXPECT_EQ(p.host_layers, 32);
  // Store: every token's K and V: 2 x 8 x 131072 x 128 x 2 bytes x 2 sequences = 1 GiB per layer.
  EXPECT_EQ(p.host_layer_host_bytes, kGiB);
  EXPECT_EQ(p.host_bytes, 32 * kGiB);
  // Staging: one layer's K/V and the index that clusters it (a GPU-tier layer's method bytes), released
  // after that layer's build.
  EXPECT_EQ(p.staging_bytes, p.kv_layer_bytes + p.method_layer_bytes);
  // GPU part per token and head against 512 B of K/V, the wave buffer's copies and buffers only: index
  // copies (D + 4 + 2 D + 29) / 16 + 4.5 = 31 B (int8 scoring), 5% cache 26 B, execution buffer
  // 4 x 1.8% x 512 = 37 B (kWaveExecRowSlack), steady zone ~1 B and RetroLayer's decode workspace ~2 B at
  // 128K: ~97 B, 19%.
  EXPECT_LT(p.host_layer_gpu_bytes, p.kv_layer_bytes * 22 / 100);
  EXPECT_GT(p.host_layer_gpu_bytes, p.kv_layer_bytes * 18 / 100);
}

// 1M tokens, batch 2, int8 host store, the H200's limits (124 GiB of GPU beside the weights, 100 GiB of
// pinned host memory): a split that fits both sides exists once a host-tier layer keeps only the wave
// buffer's copies of its index (with the building RetroLayer kept as well, 1.35 GiB per sequence and
// layer, the most GPU layers that fit left 28 host layers needing 115.5 GiB of host memory). The H200 ran
// this session (9 GPU / 23 host layers).
TEST(SessionPlanner, OneMillionTokensBatchTwoSplitsOnH200Limits) {
  SessionPlanRequest r = llama(AttentionKind::kRetro, 1048576 + 25, 2, KvPlacement::kSplit, 124 * kGiB, 100 * kGiB);
  r.wave.store_dtype = StoreDtype::kInt8;
  const auto p = plan_session(r);
  EXPECT_GT(p.gpu_layers, 0);
  EXPECT_GT(p.host_layers, 0);
  EXPECT_LE(p.gpu_bytes, r.gpu_free_bytes);
  EXPECT_LE(p.host_bytes, r.host_free_bytes);
  EXPECT_LT(p.host_layer_gpu_bytes, 2 * (kGiB * 8 / 10));  // ~0.76 GiB per sequence and layer
}

// An int8 store (wave.store_dtype): per token and head 2 D int8 values plus 2 f32 row scales, 264 bytes
// at D = 128 against bf16's 512: host bytes x 264 / 512; the GPU part is unchanged (the cache, the
// execution buffer and the steady zone stay bf16).
TEST(SessionPlanner, Int8HostStoreHalvesTheHostBytes) {
  SessionPlanRequest r = llama(AttentionKind::kRetro, 131072, 2, KvPlacement::kHost, 100 * kGiB, 100 * kGiB);
  const auto bf16 = plan_session(r);
  r.wave.store_dtype = StoreDtype::kInt8;
  const auto int8 = plan_session(r);
  EXPECT_EQ(int8.host_layers, 32);
  EXPECT_EQ(int8.host_layer_host_bytes, int64_t{2} * 8 * 131072 * (2 * 128 + 8));  // 2 sequences
  EXPECT_EQ(int8.host_layer_host_bytes * 512, bf16.host_layer_host_bytes * 264);
  EXPECT_EQ(int8.host_bytes, 32 * int8.host_layer_host_bytes);
  EXPECT_EQ(int8.host_layer_gpu_bytes, bf16.host_layer_gpu_bytes);
}

// The 8-bit KV cache (kv_dtype int8): per token and head 2 D int8 values and 2 f32 scales on the GPU, 264
// bytes at D = 128 against bf16's 512, plus one bf16 layer staged for the layer-major prefill; every layer
// stays on the GPU, so batch 14 of 128K fits where bf16 holds 7 (the H200's ~130 GiB).
TEST(SessionPlanner, Int8KvHalvesTheGpuKvAndStagesOneBf16Layer) {
  SessionPlanRequest r = llama(AttentionKind::kFull, 131072, 2, KvPlacement::kGpu, 200 * kGiB, 0);
  const auto bf16 = plan_session(r);
  r.kv_dtype = DType::kI8;
  const auto int8 = plan_session(r);
  // Rows of 2 D + 8 bytes per token and head, and per flat head the key calibration (mean, factor) and its
  // 2 x 32 rows of scratch, f32 [D] each.
  const int64_t calibration = int64_t{2} * 8 * 128 * 4 * 66;
  EXPECT_EQ(int8.kv_layer_bytes, int64_t{2} * 8 * 131072 * (2 * 128 + 8) + calibration);
  EXPECT_EQ((int8.kv_layer_bytes - calibration) * 512, bf16.kv_layer_bytes * 264);
  EXPECT_EQ(int8.staging_bytes, bf16.kv_layer_bytes);  // one bf16 layer of both sequences
  EXPECT_EQ(int8.gpu_bytes - bf16.gpu_bytes, 32 * (int8.kv_layer_bytes - bf16.kv_layer_bytes) + int8.staging_bytes);
  EXPECT_EQ(int8.gpu_layers, 32);
  for (AttentionKind kind : {AttentionKind::kFull, AttentionKind::kRetro}) {
    SessionPlanRequest b = llama(kind, 131072, 1, KvPlacement::kGpu, 130 * kGiB - 15 * kGiB, 0);
    b.weight_bytes = 15 * kGiB;
    const int bf16_batch = largest_batch(b, 64);
    b.kv_dtype = DType::kI8;
    const int int8_batch = largest_batch(b, 64);
    EXPECT_GE(int8_batch, 2 * bf16_batch - 1) << attention_kind_name(kind) << ": bf16 " << bf16_batch << ", int8 "
                                              << int8_batch;
    EXPECT_GE(bf16_batch, 1);
  }
}

TEST(SessionPlanner, Int8KvRefusalsNameTheWayOut) {
  auto refused = [](SessionPlanRequest r, const std::string& words) {
    try {
      plan_session(r);
      ADD_FAILURE() << "planned: " << words;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  SessionPlanRequest r = llama(AttentionKind::kQuest, 8192, 1, KvPlacement::kGpu, 100 * kGiB, 0);
  r.kv_dtype = DType::kI8;
  refused(r, "full and retro");
  r = llama(AttentionKind::kRetro, 8192, 1, KvPlacement::kHost, 100 * kGiB, 100 * kGiB);
  r.kv_dtype = DType::kI8;
  refused(r, "host_store");
  r.placement = KvPlacement::kSplit;
  r.gpu_layers = 8;
  refused(r, "every layer on the GPU");
  r.kv_dtype = DType::kF8E4M3;
  refused(r, "bf16 or int8");
  // auto with int8 never spills to the host: a context that does not fit is refused.
  r = llama(AttentionKind::kRetro, 1048576, 2, KvPlacement::kAuto, 100 * kGiB, 500 * kGiB);
  r.kv_dtype = DType::kI8;
  refused(r, "nothing was allocated");
}

TEST(SessionPlanner, SplitTakesTheMostGpuLayersThatFit) {
  // 1M tokens x 128 KiB = 128 GiB of K/V: neither 100 GiB of GPU nor 100 GiB of host holds it alone.
  const SessionPlanRequest r =
      llama(AttentionKind::kRetro, 1 << 20, 1, KvPlacement::kSplit, 100 * kGiB, 100 * kGiB);
  const auto p = plan_session(r);
  ASSERT_GT(p.gpu_layers, 0);
  ASSERT_LT(p.gpu_layers, 32);
  EXPECT_EQ(p.placement, KvPlacement::kSplit);
  EXPECT_LE(p.gpu_bytes, r.gpu_free_bytes);
  EXPECT_LE(p.host_bytes, r.host_free_bytes);
  EXPECT_EQ(p.host_bytes, p.host_layers * p.host_layer_host_bytes);
  SessionPlanRequest more = r;
  more.gpu_layers = p.gpu_layers + 1;  // one more GPU layer does not fit
  EXPECT_THROW(plan_session(more), Error);
  SessionPlanRequest fixed = r;
  fixed.gpu_layers = p.gpu_layers - 1;
  EXPECT_EQ(plan_session(fixed).gpu_layers, p.gpu_layers - 1);
}

TEST(SessionPlanner, AutoChoosesGpuWhenItFitsElseSplit) {
  auto a = plan_session(llama(AttentionKind::kRetro, 32768, 1, KvPlacement::kAuto, 100 * kGiB, 100 * kGiB));
  EXPECT_EQ(a.placement, KvPlacement::kGpu);
  EXPECT_EQ(a.gpu_layers, 32);
  a = plan_session(llama(AttentionKind::kRetro, 1 << 20, 1, KvPlacement::kAuto, 100 * kGiB, 100 * kGiB));
  EXPECT_EQ(a.placement, KvPlacement::kSplit);
  EXPECT_GT(a.host_layers, 0);
  // A method without a host tier refuses instead of splitting.
  EXPECT_THROW(plan_session(llama(AttentionKind::kFull, 1 << 20, 1, KvPlacement::kAuto, 100 * kGiB, 100 * kGiB)),
               Error);
}

TEST(SessionPlanner, RefusalNamesNeededAndFreeOnBothSides) {
  // Full attention at 1M needs 128 GiB of K/V on the GPU; 80 GiB free.
  SessionPlanRequest r = llama(AttentionKind::kFull, 1 << 20, 1, KvPlacement::kGpu, 80 * kGiB, 64 * kGiB);
  SessionPlanRequest big = r;
  big.gpu_free_bytes = 1000 * kGiB;
  const int64_t needed = plan_session(big).gpu_bytes;
  try {
    plan_session(r);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("need " + gib(needed) + " of GPU memory"), std::string::npos) << m;
    EXPECT_NE(m.find(gib(80 * kGiB) + " free (does not fit)"), std::string::npos) << m;
    EXPECT_NE(m.find(gib(64 * kGiB) + " free"), std::string::npos) << m;
    EXPECT_NE(m.find("nothing was allocated"), std::string::npos) << m;
  }
  // The host side: every layer on the host, 64 GiB usable for 128 GiB of stores.
  SessionPlanRequest h = llama(AttentionKind::kRetro, 1 << 20, 1, KvPlacement::kHost, 80 * kGiB, 64 * kGiB);
  try {
    plan_session(h);
    FAIL() << "expected a refusal";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("and " + gib(32 * (int64_t{128} << 20) * 32) + " of pinned host memory with " + gib(64 * kGiB) +
                     " free (does not fit)"),
              std::string::npos)
        << m;
  }
}

TEST(SessionPlanner, LargestBatchIsTheEdgeOfThePlan) {
  SessionPlanRequest r = llama(AttentionKind::kFull, 131072, 1, KvPlacement::kGpu, 120 * kGiB, 0);
  const int b = largest_batch(r);
  // 16 GiB of K/V per 128K sequence (+ small extras): 7 sequences fit in 120 GiB, 8 do not.
  EXPECT_EQ(b, 7);
  r.num_seqs = b;
  EXPECT_NO_THROW(plan_session(r));
  r.num_seqs = b + 1;
  EXPECT_THROW(plan_session(r), Error);
  EXPECT_EQ(largest_batch(r, 3), 3);  // capped by the limit
  r.gpu_free_bytes = kGiB;
  EXPECT_EQ(largest_batch(r), 0);  // not even one
  SessionPlanRequest tiny = llama(AttentionKind::kFull, 16, 1, KvPlacement::kGpu, 1000 * kGiB, 0);
  EXPECT_EQ(largest_batch(tiny, 100), 100);
  EXPECT_EQ(largest_batch(tiny, 1), 1);
}

TEST(SessionPlanner, BadRequestsAreErrors) {
  EXPECT_THROW(plan_session(llama(AttentionKind::kFull, 4096, 1, KvPlacement::kHost, 100 * kGiB, 100 * kGiB)),
               Error);  // host tier needs retro
  EXPECT_THROW(plan_session(llama(AttentionKind::kQuest, 4096, 1, KvPlacement::kSplit, 100 * kGiB, 100 * kGiB)),
               Error);
  EXPECT_THROW(plan_session(llama(AttentionKind::kFull, 0, 1, KvPlacement::kGpu, kGiB, kGiB)), Error);
  EXPECT_THROW(plan_session(llama(AttentionKind::kFull, 4096, 0, KvPlacement::kGpu, kGiB, kGiB)), Error);
  SessionPlanRequest r = llama(AttentionKind::kRetro, 4096, 1, KvPlacement::kSplit, kGiB, kGiB);
  r.gpu_layers = 33;
  EXPECT_THROW(plan_session(r), Error);
  EXPECT_EQ(parse_kv_placement("split"), KvPlacement::kSplit);
  EXPECT_THROW(parse_kv_placement("disk"), Error);
}

TEST(SessionPlanner, LimitsFromInjectedQueries) {
  EXPECT_EQ(resolve_gpu_limit(5 * kGiB, nullptr), 5 * kGiB);
  EXPECT_EQ(resolve_gpu_limit(0, [] { return 10 * kGiB; }), 10 * kGiB - kGpuReserveBytes);
  EXPECT_EQ(resolve_gpu_limit(0, [] { return kGiB; }), 0);  // less than the reserve
  EXPECT_EQ(resolve_host_limit(0, [] { return 10 * kGiB; }), static_cast<int64_t>(10 * kGiB * kHostUsableFraction));
  EXPECT_EQ(resolve_host_limit(3, [] { return int64_t{-1}; }), 3);
  EXPECT_THROW(resolve_gpu_limit(-1, nullptr), Error);
}

}  // namespace
}  // namespace retroinfer::buffer
