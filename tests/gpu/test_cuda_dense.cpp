// DenseDecoder (exact split-K decode attention) against an f64 CPU reference, over token counts with
// tails, head_dim 64/128, GQA groups 1..8, batches of sequences and a kv_stride larger than the tokens.
#include <gtest/gtest.h>

#include <numeric>

#include "gpu_test_util.h"
#include "retroinfer/error.h"

namespace retroinfer {
namespace {

using gputest::Compare;

// Tolerances: GPU and CPU both compute in f32/f64 from the same bf16 K/V; the GPU's differences are the
// f32 accumulation order over <= 128-term dot products and __expf (relative error ~2^-21 for the small
// arguments here), both ~1e-6 relative, so nmse ~1e-12; 1e-9 leaves three orders of margin while any
// indexing error gives nmse ~1.
constexpr double kNmse = 1e-9;
constexpr double kMaxAbs = 1e-4;

void run_dense_case(int num_seqs, int hkv, int group, int d, int64_t n, int64_t stride, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "seqs=" << num_seqs << " hkv=" << hkv << " group=" << group << " d=" << d
                                  << " n=" << n << " stride=" << stride << " seed=" << seed);
  const int H = num_seqs * hkv;
  auto kv = gputest::make_kv(H, n, stride, d, seed);
  auto q = gputest::make_q(kv, group, seed + 1);
  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v), dq = gputest::upload(q);
  auto dout = gputest::poisoned(q.size());
  AttentionShape shape{hkv * group, hkv, d};
  cuda::DenseDecoder dec(shape, num_seqs, n);
  const float scale = 1.0f / std::sqrt(float(d));
  dec.run(dq.as<float>(), dk.as<uint16_t>(), dv.as<uint16_t>(), n, stride, 0.0f, dout.as<float>());
  cuda::synchronize();
  auto got = gputest::download_f32(dout, q.size());
  std::vector<float> ref(q.size());
  std::vector<int32_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  for (int h = 0; h < H; ++h)
    for (int g = 0; g < group; ++g) {
      gputest::RefState st(d);
      const float* qq = &q[(size_t(h) * group + g) * d];
      gputest::ref_exact(kv, qq, scale, h, all, st);
      st.finish(&ref[(size_t(h) * group + g) * d], d);
    }
  const Compare c = gputest::compare(got, ref);
  EXPECT_EQ(c.unwritten, 0);
  EXPECT_LT(c.nmse, kNmse);
  EXPECT_LT(c.max_abs, kMaxAbs);
}

TEST(CudaDense, TailsAcrossTileEdges) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 100;
  for (int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 127, 128, 129})
    run_dense_case(1, 2, 4, 128, n, n + 5, seed++);
}

TEST(CudaDense, GroupsAndHeadDims) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 200;
  for (int d : {64, 128})
    for (int group : {1, 3, 4, 8}) run_dense_case(2, 2, group, d, 1000 + group, 1100, seed++);
}

TEST(CudaDense, LongSplitsAndBatch) {
  RETROINFER_REQUIRE_GPU();
  run_dense_case(3, 8, 4, 128, 20011, 20011, 300);
  run_dense_case(1, 1, 2, 64, 65537, 65600, 301);
}

TEST(CudaDense, RejectsBadShapes) {
  RETROINFER_REQUIRE_GPU();
  EXPECT_THROW(cuda::DenseDecoder(AttentionShape{32, 8, 96}, 1, 100), Error);   // head_dim 96
  EXPECT_THROW(cuda::DenseDecoder(AttentionShape{32, 2, 128}, 1, 100), Error);  // group 16
  EXPECT_THROW(cuda::DenseDecoder(AttentionShape{6, 4, 128}, 1, 100), Error);   // not a multiple
  cuda::DenseDecoder dec(AttentionShape{8, 2, 64}, 1, 100);
  cuda::DeviceBuffer b(1 << 20);
  EXPECT_THROW(dec.run(b.as<float>(), b.as<uint16_t>(), b.as<uint16_t>(), 101, 200, 0.0f, b.as<float>()),
               Error);  // more tokens than max_tokens
  EXPECT_THROW(dec.run(b.as<float>(), b.as<uint16_t>(), b.as<uint16_t>(), 50, 40, 0.0f, b.as<float>()),
               Error);  // stride < tokens
  EXPECT_THROW(dec.run(b.as<float>(), nullptr, b.as<uint16_t>(), 50, 64, 0.0f, b.as<float>()), Error);
}

}  // namespace
}  // namespace retroinfer
