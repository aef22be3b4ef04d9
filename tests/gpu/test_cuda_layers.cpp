// The runner's seam (cuda::make_layer_attention): what the factory refuses. Every method's decode against the
// CPU method of the same name is the parity harness's (parity/parity_decode.cpp).
#include <gtest/gtest.h>

#include <cstdio>

#include "gpu_test_util.h"
#include "retroinfer/cuda_backend.h"
#include "retroinfer/error.h"

namespace retroinfer {
namespace {

AttentionConfig config_of(AttentionKind kind) {
  AttentionConfig cfg;
  cfg.kind = kind;
  return cfg;
}

TEST(CudaLayers, FactoryRejectsWhatItDoesNotProvide) {
  RETROINFER_REQUIRE_GPU();
  const AttentionShape shape{8, 2, 128};
  for (AttentionKind k : {AttentionKind::kQuest, AttentionKind::kStreaming, AttentionKind::kOracle, AttentionKind::kFull})
    EXPECT_THROW(cuda::make_layer_attention(shape, config_of(k), 1, 4096, KvTier::kHost), Error);
  AttentionShape bad{8, 3, 128};
  EXPECT_THROW(cuda::make_layer_attention(bad, config_of(AttentionKind::kRetro), 1, 4096, KvTier::kGpu), Error);
  auto layer = cuda::make_layer_attention(shape, config_of(AttentionKind::kStreaming), 1, 256, KvTier::kGpu);
  cuda::DeviceBuffer k(size_t(2) * 256 * 128 * 2), v(k.bytes());
  EXPECT_THROW(layer->prefill_done(k.as<uint16_t>(), v.as<uint16_t>(), 100, 128, nullptr), Error);  // stride < max
  std::printf("[layers] factory: host tier only for retro, bad shapes and strides rejected\n");
}

}  // namespace
}  // namespace retroinfer
