// CudaSession::plan's arithmetic and refusals, on the CPU: with gpu_memory_limit set the plan asks nothing of
// the device, so these run in CI builds with the CUDA backend and no GPU.
#if defined(RETROINFER_WITH_CUDA)
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "retroinfer/cuda_model.h"
#include "retroinfer/model_shapes.h"
#include "retroinfer/error.h"

namespace retroinfer {
namespace {

using cuda::CudaSession;
using cuda::CudaSessionOptions;

ModelConfig llama3_8b() { return model_shape("llama3-8b"); }

CudaSessionOptions options(int64_t max_context, int64_t limit) {
  CudaSessionOptions o;
  o.attention.kind = AttentionKind::kFull;
  o.max_context = max_context;
  o.prefill_chunk = 512;
  o.gpu_memory_limit = limit;
  return o;
}

constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kWeights = 16 * kGiB;  // Llama-3-8B in bf16, about

TEST(CudaSessionPlan, KvBytesScaleWithContextAndSequences) {
  const ModelConfig c = llama3_8b();
  const auto a = CudaSession::plan(c, options(32768, 100 * kGiB), 4, kWeights);
  const auto b = CudaSession::plan(c, options(65536, 100 * kGiB), 4, kWeights);
  // The activations depend on the chunk (512 rows either way), so the difference is KV only:
  // 2 (K, V) x 32 layers x 4 sequences x 8 KV heads x 32768 tokens x 128 dims x 2 bytes = 16 GiB.
  EXPECT_EQ(b.gpu_bytes - a.gpu_bytes, 16 * kGiB);
  EXPECT_EQ(a.num_seqs, 4);
  EXPECT_EQ(a.max_context, 32768);
  EXPECT_EQ(a.gpu_layers, 32);
  EXPECT_EQ(a.host_layers, 0);
  EXPECT_EQ(a.host_bytes, 0);
  // Weights + 16 GiB of KV + activations and attention workspace (a [512, 128256] f32 logits block alone is
  // 256 MiB at most; everything else of 512 rows is < 200 MiB; 32 x 4 MiB for the decoders).
  EXPECT_GT(a.gpu_bytes, kWeights + 16 * kGiB);
  EXPECT_LT(a.gpu_bytes, kWeights + 17 * kGiB);
  EXPECT_EQ(a.gpu_free_bytes, kWeights + 100 * kGiB);
}

TEST(CudaSessionPlan, RefusesWithBytesNeededAndAvailable) {
  const ModelConfig c = llama3_8b();
  try {
    CudaSession::plan(c, options(131072, 40 * kGiB), 4, kWeights);  // 64 GiB of KV
    FAIL() << "a plan over the limit was accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("need"), std::string::npos) << m;
    EXPECT_NE(m.find("GiB of GPU memory"), std::string::npos) << m;  // bytes needed, on which side
    EXPECT_NE(m.find("free"), std::string::npos) << m;              // and what is free
  }
  EXPECT_THROW(CudaSession::plan(c, options(1024, kGiB), 0, kWeights), Error);          // no sequences
  EXPECT_THROW(CudaSession::plan(c, options(131073, 100 * kGiB), 1, kWeights), Error);  // beyond the model
  CudaSessionOptions zero_chunk = options(1024, kGiB);
  zero_chunk.prefill_chunk = 0;
  EXPECT_THROW(CudaSession::plan(c, zero_chunk, 1, kWeights), Error);
  ModelConfig unbounded = c;
  unbounded.max_position_embeddings = 0;  // no known maximum: max_context must be given
  EXPECT_THROW(CudaSession::plan(unbounded, options(0, kGiB), 1, kWeights), Error);
  EXPECT_NO_THROW(CudaSession::plan(unbounded, options(1024, kGiB), 1, kWeights));
}

TEST(CudaSessionPlan, PlacementsOfThisBuild) {
  const ModelConfig c = llama3_8b();
  CudaSessionOptions o = options(8192, 100 * kGiB);
  o.placement = KvPlacement::kAuto;  // fits on the GPU: the GPU plan
  EXPECT_EQ(CudaSession::plan(c, o, 1, kWeights).gpu_layers, 32);
  o.gpu_memory_limit = kGiB;  // does not fit, and there is no split placement to fall back to
  EXPECT_THROW(CudaSession::plan(c, o, 1, kWeights), Error);
  for (KvPlacement p : {KvPlacement::kHost, KvPlacement::kSplit}) {
    o.placement = p;
    o.gpu_memory_limit = 100 * kGiB;
    EXPECT_THROW(CudaSession::plan(c, o, 1, kWeights), Error);
  }
}

// The runner's own check (its activation, logits and GEMM workspace figure) for a 128K Llama-3-8B
// retro session on the H200: `bench decode` extends the positions to 131072 + 25 decoded tokens; the
// session limit is the free memory after the weights less the 2 GiB reserve (131326935040 bytes).
TEST(CudaSessionPlan, RetroBatch7At128KFitsH200FreeMemory) {
  const ModelConfig c = with_max_context(llama3_8b(), 131097);
  CudaSessionOptions o = options(131097, 131326935040);
  o.attention.kind = AttentionKind::kRetro;
  o.prefill_chunk = 2048;
  o.host_memory_limit = 100 * kGiB;
  const auto p = CudaSession::plan(c, o, 7, kWeights);
  std::printf("[runner plan 128K retro batch 7] session %lld of %lld bytes (margin %lld)\n",
              (long long)(p.gpu_bytes - kWeights), 131326935040LL, (long long)(p.gpu_free_bytes - p.gpu_bytes));
  EXPECT_EQ(p.gpu_layers, 32);
  EXPECT_GT(p.gpu_free_bytes - p.gpu_bytes, int64_t{512} << 20);
  EXPECT_THROW(CudaSession::plan(c, o, 8, kWeights), Error);
}

}  // namespace
}  // namespace retroinfer
#endif  // RETROINFER_WITH_CUDA
