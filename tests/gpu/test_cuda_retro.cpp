// RetroLayer::decode against the GPU's own dense decode and against itself: with every cluster retrieved it
// is dense attention; a captured graph replays it bit for bit. Its stages against the production CPU code
// are the parity harness's (parity/parity_stages.cpp).
#include <gtest/gtest.h>

#include "gpu_test_util.h"

namespace retroinfer {
namespace {

// Same tokens, summed in another order (f32 on both sides, as test_cuda_dense.cpp).
constexpr double kNmse = 1e-9;

// Exactness invariant (docs/design.md §2): retrieval over all clusters with no estimation is dense attention.
TEST(CudaRetro, AllClustersRetrievedIsDense) {
  RETROINFER_REQUIRE_GPU();
  const int H = 2, G = 4, d = 128;
  const int64_t n = 3000;
  auto kv = gputest::make_kv(H, n, n, d, 77);
  auto q = gputest::make_q(kv, G, 78);
  AttentionConfig cfg;
  cfg.retrieval_fraction = 1.0;
  cfg.estimation = false;
  cfg.segment_tokens = 1024;
  cuda::RetroLayer layer(AttentionShape{H * G, H, d}, cfg);
  cuda::DenseDecoder dense(AttentionShape{H * G, H, d}, 1, n);
  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v), dq = gputest::upload(q);
  auto o1 = gputest::poisoned(q.size()), o2 = gputest::poisoned(q.size());
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), n, n);
  layer.decode(dq.as<float>(), o1.as<float>());
  dense.run(dq.as<float>(), dk.as<uint16_t>(), dv.as<uint16_t>(), n, n, 0.0f, o2.as<float>());
  cuda::synchronize();
  const auto c = gputest::compare(gputest::download_f32(o1, q.size()), gputest::download_f32(o2, q.size()));
  EXPECT_EQ(c.unwritten, 0);
  EXPECT_LT(c.nmse, kNmse);  // same tokens, different order of summation
  EXPECT_EQ(layer.debug_state(0).token_list.size(), size_t(n));
}

// A decode captured into a CUDA graph replays the same kernels on the same inputs: bit-identical output.
TEST(CudaRetro, GraphReplayMatchesEager) {
  RETROINFER_REQUIRE_GPU();
  const int H = 2, G = 4, d = 128;
  const int64_t n = 5000;
  auto kv = gputest::make_kv(H, n, n, d, 91);
  auto q = gputest::make_q(kv, G, 92);
  AttentionConfig cfg;
  cfg.segment_tokens = 1024;
  cuda::RetroLayer layer(AttentionShape{H * G, H, d}, cfg);
  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v), dq = gputest::upload(q);
  auto o1 = gputest::poisoned(q.size()), o2 = gputest::poisoned(q.size());
  layer.build(dk.as<uint16_t>(), dv.as<uint16_t>(), n, n);
  layer.decode(dq.as<float>(), o1.as<float>());
  cuda::synchronize();
  cuda::StreamHandle stream;
  cuda::CapturedGraph graph(stream.get(), [&] { layer.decode(dq.as<float>(), o2.as<float>(), stream.get()); });
  graph.launch(stream.get());
  cuda::synchronize(stream.get());
  const auto a = gputest::download_f32(o1, q.size()), b = gputest::download_f32(o2, q.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "element " << i;
}

}  // namespace
}  // namespace retroinfer
