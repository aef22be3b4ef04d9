// retro_layer_bytes (buffer/session_planner.h): the RetroLayer's device bytes term by term, the build
// workspace of one build group instead of the batch, and what that buys at 128K on the H200: Llama-3-8B
// batch 7 fits the H200's free memory after the weights, batch 8 is refused with the bytes needed and free. Pure host
// arithmetic (the GPU tests check the same formula against RetroLayer::device_bytes()).
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "retroinfer/session_planner.h"
#include "retroinfer/error.h"
#include "retroinfer/model_shapes.h"

namespace retroinfer::buffer {
namespace {

// The runner's RetroLayer of Llama-3-8B (8 KV heads, GQA group 4, head_dim 128), default AttentionConfig but
// for bf16 centroid scoring (the terms below; int8 scoring: IndexTermsWithInt8Scoring).
RetroLayerBytesRequest llama_layer(int seqs, int64_t tokens) {
  RetroLayerBytesRequest q;
  q.attention.kind = AttentionKind::kRetro;
  q.attention.int8_centroid_scoring = false;
  q.num_seqs = seqs;
  q.num_heads_kv = 8;
  q.group = 4;
  q.head_dim = 128;
  q.tokens = q.kv_stride = tokens;
  return q;
}

TEST(RetroLayerBytes, KeptAssignmentAndF32CopiesAreExactTerms) {
  const RetroLayerBytesRequest q = llama_layer(1, 131072);
  const RetroLayerBytes b = retro_layer_bytes(q);
  // 131072 - 4 sinks - 64 window = 131004 indexed tokens; 15 segments of 8192 (512 clusters each) and one
  // of 8124 (ceil(8124 / 16) = 508): 8188 clusters.
  EXPECT_EQ(b.n_idx, 131004);
  EXPECT_EQ(b.clusters, 15 * 512 + 508);
  RetroLayerBytesRequest a = q;
  a.keep_assignment = true;
  // The per-token cluster ids: 8 flat heads x 131004 tokens x 4 bytes = 4192128 bytes per layer and
  // sequence, 134.1 MB over 32 layers, held by nothing decode reads.
  EXPECT_EQ(retro_layer_bytes(a).index - b.index, int64_t{8} * 131004 * 4);
  EXPECT_EQ(retro_layer_bytes(a).decode, b.decode);
  RetroLayerBytesRequest f = q;
  f.keep_f32_index = true;  // f32 centroids and value sums: 8 D bytes per cluster and flat head
  EXPECT_EQ(retro_layer_bytes(f).index - b.index, int64_t{8} * 8188 * 128 * 8);
}

TEST(RetroLayerBytes, IndexTermsPerClusterAndToken) {
  const RetroLayerBytes b = retro_layer_bytes(llama_layer(1, 131072));
  const int64_t H = 8, C = 8188, N = 131004, D = 128;
  // bf16 centroids + value sums (4 D), size (4), CSR offset (4, + 1 entry), members (4 per token), the
  // mean key (4 D per head), the retrieval-capacity sum (8 per head), outlier lists: round(0.001 x
  // 131004) = 131 + (0 / 1024 + 1) x round(1.024) = 132 entries per head, and their counts.
  EXPECT_EQ(b.index, H * C * (4 * D + 8) + 4 + H * N * 4 + H * D * 4 + H * 8 + H * 132 * 4 + H * 4);
}

// Int8 centroid scoring (AttentionConfig's default): the index keeps the centroids' int8 copies and row scales
// (D + 4 bytes per cluster and flat head) instead of the bf16 centroids (2 D); the rest is the same.
TEST(RetroLayerBytes, IndexTermsWithInt8Scoring) {
  EXPECT_TRUE(AttentionConfig{}.int8_centroid_scoring);
  const RetroLayerBytesRequest bf16 = llama_layer(1, 131072);
  RetroLayerBytesRequest int8 = bf16;
  int8.attention.int8_centroid_scoring = true;
  const RetroLayerBytes a = retro_layer_bytes(bf16), b = retro_layer_bytes(int8);
  const int64_t H = 8, C = 8188, D = 128;
  EXPECT_EQ(a.index - b.index, H * C * (2 * D - (D + 4)));
  EXPECT_EQ(b.decode, a.decode);
  // One sequence's build hands its arrays to the index; with int8 scoring its bf16 centroids are not among them
  // (quantized, then dropped), so they count as the build's transient.
  EXPECT_EQ(b.build - a.build, H * C * 2 * D);
  // An update regrows the index arrays, the int8 copies among them.
  EXPECT_EQ(a.update - b.update, H * C * (2 * D - (D + 4)));
}

TEST(RetroLayerBytes, BuildWorkspaceIsOneGroupNotTheBatch) {
  RetroLayerBytesRequest q = llama_layer(7, 131072);
  const RetroLayerBytes one = retro_layer_bytes(q);  // build_group_seqs = 1 (the runner's)
  q.num_seqs = 8;
  EXPECT_EQ(retro_layer_bytes(q).build, one.build);  // independent of the batch
  // Per flat head of the group: int8 centred keys D, assignment / sort keys in and out / iota / members
  // 20, residual 4, sort temporary <= 9 per token; f32 + bf16 centroids and value sums 12 D, int8 centroid
  // copies and scales D + 4, size 4, offset 4, touched 1 per cluster; plus the mean partial sums and the
  // sort's fixed 1 MiB.
  const int64_t H = 8, C = 8188, N = 131004, D = 128;
  const int64_t per_head = N * (D + 20 + 4 + 9) + C * (13 * D + 13);
  EXPECT_GE(one.build, H * per_head);
  EXPECT_LT(one.build, H * per_head + (int64_t{3} << 20));
  q.num_seqs = 7;
  q.build_group_seqs = 0;  // the batched build: every sequence's workspace at once
  const RetroLayerBytes all = retro_layer_bytes(q);
  EXPECT_GT(all.build, 6 * one.build);
  EXPECT_EQ(all.held(), one.held());
  std::printf("[retro build workspace] 128K Llama-3-8B layer: one sequence %.3f GB, 7 at once %.3f GB, held per "
              "sequence %.3f MB\n",
              double(one.build) / 1e9, double(all.build) / 1e9, double(one.held()) / 7 / 1e6);
}

TEST(RetroLayerBytes, UpdateTransientNearTheBuildAt128K) {
  const RetroLayerBytes b = retro_layer_bytes(llama_layer(7, 131072));
  EXPECT_GT(b.update, 0);
  // The build's k-means works on int8 keys (D + 4 bytes per token, not 2 D), which puts one
  // sequence's build workspace (284.0e6 B) just under an update's transient (293.7e6 B: the update's own
  // workspace plus the regrown index arrays); the plan's transient is the larger.
  EXPECT_GT(b.update, b.build);
  EXPECT_LT(b.update, b.build + b.build / 10);
}

TEST(RetroLayerBytes, ShortContextHasNoIndex) {
  const RetroLayerBytes b = retro_layer_bytes(llama_layer(2, 70));  // 70 - 68 = 2 < 16: all steady
  EXPECT_EQ(b.n_idx, 0);
  EXPECT_EQ(b.clusters, 0);
  EXPECT_EQ(b.build, 0);
  EXPECT_EQ(b.update, 0);
  EXPECT_GT(b.decode, 0);
}

TEST(RetroLayerBytes, BadRequestsAreErrors) {
  RetroLayerBytesRequest q = llama_layer(1, 1000);
  q.kv_stride = 999;
  EXPECT_THROW(retro_layer_bytes(q), Error);
  q = llama_layer(1, 1000);
  q.build_group_seqs = -1;
  EXPECT_THROW(retro_layer_bytes(q), Error);
  q = llama_layer(0, 1000);
  EXPECT_THROW(retro_layer_bytes(q), Error);
}

// As `retroinfer bench decode --model llama3-8b --contexts 131072 --methods retro --placement gpu` plans with
// bf16 centroid scoring (int8 scoring, the default, holds less: IndexTermsWithInt8Scoring):
// max_context = 131072 + 3 warm-up + 20 timed + 2 = 131097 tokens, prefill chunk 2048, the session limit
// of the H200 (free memory after the 16.06e9 bytes of weights, less the 2 GiB reserve).
constexpr int64_t kH200GpuFree = 131326935040;
SessionPlanRequest bench_request(int seqs) {
  SessionPlanRequest r;
  set_model_shape(r, model_shape("llama3-8b"));
  r.attention.kind = AttentionKind::kRetro;
  r.attention.int8_centroid_scoring = false;
  r.max_context = 131097;
  r.prefill_chunk = 2048;
  r.num_seqs = seqs;
  r.placement = KvPlacement::kGpu;
  r.gpu_free_bytes = kH200GpuFree;
  r.host_free_bytes = int64_t{100} << 30;
  return r;
}

TEST(SessionPlannerRetro, Llama3Batch7At128KFitsH200FreeMemory) {
  const SessionPlanBreakdown p = plan_session(bench_request(7));
  const int64_t margin = p.gpu_free_bytes - p.gpu_bytes;
  std::printf("[plan 128K llama3-8b retro batch 7] gpu %lld of %lld (margin %lld B), kv/layer %lld, method/layer "
              "%lld, transient %lld, activations %lld\n",
              (long long)p.gpu_bytes, (long long)p.gpu_free_bytes, (long long)margin, (long long)p.kv_layer_bytes,
              (long long)p.method_layer_bytes, (long long)p.build_workspace_bytes,
              (long long)(p.activation_bytes + p.logits_bytes));
  EXPECT_EQ(p.gpu_layers, 32);
  // 32 x 3758813184 B of K/V (7 x 8 heads x 131097 x 128 x 2 x 2) = 120.28e9 of the 131.33e9: what remains
  // must hold the index, its decode workspace, one build group's workspace and the activations.
  EXPECT_EQ(p.kv_layer_bytes, int64_t{2} * 7 * 8 * 131097 * 128 * 2);
  EXPECT_GT(margin, int64_t{900} << 20);  // measured by this formula: 1025956476 B
  EXPECT_EQ(largest_batch(bench_request(1)), 7);
}

TEST(SessionPlannerRetro, Llama3Batch8At128KIsRefusedWithNeededAndFree) {
  try {
    plan_session(bench_request(8));
    FAIL() << "batch 8 at 128K fitted " << kH200GpuFree << " bytes";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("8 sequence(s) x 131097 tokens"), std::string::npos) << m;
    EXPECT_NE(m.find("need 138.49 GiB of GPU memory"), std::string::npos) << m;
    EXPECT_NE(m.find("122.31 GiB free (does not fit)"), std::string::npos) << m;
  }
}

TEST(SessionPlannerRetro, BatchedBuildWouldNotFitBatch7) {
  // The batched k-means workspace (7 sequences at once, ~2.6e9 bytes) breaks the plan; the kept per-token
  // cluster ids cost exactly 33 x 7 x 8 heads x 131029 indexed tokens x 4 bytes = 0.97e9 bytes: 32 layers
  // hold them, and the transient (an update's, the larger with the int8 k-means operands) regrows
  // one layer's index arrays.
  SessionPlanRequest batched = bench_request(7);
  batched.retro_build_group_seqs = 0;
  EXPECT_THROW(plan_session(batched), Error);
  SessionPlanRequest kept = bench_request(7);
  kept.retro_keeps_assignment = true;
  EXPECT_EQ(plan_session(kept).gpu_bytes - plan_session(bench_request(7)).gpu_bytes, int64_t{33} * 7 * 8 * 131029 * 4);
}

}  // namespace
}  // namespace retroinfer::buffer
