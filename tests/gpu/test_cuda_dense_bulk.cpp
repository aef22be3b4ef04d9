// The streaming dense decode kernels (decode_dense.cu: "tma2d", the default, and "bulk", its fallback)
// against the f64 CPU reference and the earlier kernel ("v1", RETROINFER_FULL_DECODE=v1) on the same
// inputs, through DenseDecoder: tails around the 64-token tiles (n = 1, 63, 64, 65, 127, 128, 129, 191,
// 193, 1000, 4097), head_dim 64/128, GQA groups 1/4/8, batches 1/3/16, long contexts (32K + 17, 128K: many
// tiles per CTA, the stage ring wraps), and kernel_bench's shapes (128K x batch 1/4/16, 32 q / 8 kv heads:
// 33 / 8 / 2 splits per head) against v1 only. Outputs are poisoned with NaN first; K/V rows past n hold
// NaN (a read past the end shows). One line per case and kernel: "[full <kernel>] D .. G .. B .. n ..
// splits .. nmse .. maxabs .. v1_nmse .. v1_maxabs ..".
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

#include "kernels/decode_dense.h"
#include "gpu_test_util.h"
#include "retroinfer/error.h"

namespace retroinfer {
namespace {

using gputest::Compare;
using gputest::EnvGuard;

// Against the f64 reference: the bounds of test_cuda_dense.cpp (same arithmetic per token: the query and
// P carried as bf16 hi + lo pairs through mma m16n8k16, f32 accumulation; its derivation there): nmse
// 1e-9, max-abs 1e-4.
constexpr double kRefNmse = 1e-9;
constexpr double kRefMaxAbs = 1e-4;
// Against v1 on the same inputs: both kernels form the same query fragments (the query's rounding is
// common to both), so they differ only by how the tokens are grouped (splits, warps): each P is formed
// against a different running max and split into hi + lo differently, ~2^-18 relative per path (random
// signed), and the merges round differently (f32). The bound of test_cuda_decode_paths.cpp for the same
// regrouping: an output, a convex combination of value rows |v| <= ~4.5, moves by <= 2^-18 * 4.5 =
// 1.7e-5 per path, 3.4e-5 between two: max-abs 5e-5; nmse ~(2^-19)^2 = 4e-12 against outputs of rms
// ~0.3-1: 1e-10. The bench shapes (128K random rows) average V down to an output rms of ~0.02, which
// raises the nmse of the same absolute error by ~(0.3 / 0.02)^2: the H200 measured 1.49e-10 at batch 16
// (max-abs 2.5e-7), so 1e-9 (max-abs still bounds the error itself).
constexpr double kV1Nmse = 1e-9;
constexpr double kV1MaxAbs = 5e-5;
// tma2d and bulk group a tile's tokens over the warps differently (warp w: tokens 16w..16w+15 against
// 8b + 2w + {0, 1}), so they are held to the v1 bounds, not to each other bit for bit.

struct Run {
  std::vector<float> out;
  int splits = 0;
};

// DenseDecoder with RETROINFER_FULL_DECODE=kernel (nullptr: unset, the default) over device q, K, V.
Run run_kernel(const char* kernel, const AttentionShape& shape, int num_seqs, int64_t n, int64_t stride,
               const cuda::DeviceBuffer& dq, const cuda::DeviceBuffer& dk, const cuda::DeviceBuffer& dv,
               size_t q_elems) {
  EnvGuard env("RETROINFER_FULL_DECODE", kernel);
  cuda::DenseDecoder dec(shape, num_seqs, n);
  EXPECT_STREQ(dec.kernel(), kernel == nullptr ? cuda::detail::dense_kernel_name(cuda::detail::kDefaultDenseKernel) : kernel);
  auto dout = gputest::poisoned(q_elems);
  dec.run(dq.as<float>(), dk.as<uint16_t>(), dv.as<uint16_t>(), n, stride, 0.0f, dout.as<float>());
  cuda::synchronize();
  Run r;
  r.out = gputest::download_f32(dout, q_elems);
  r.splits = dec.num_splits(n);
  return r;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Checks run r of `name` against `ref` (when given) and v1 and prints its line.
void check_run(const char* name, const Run& r, const Run& v1, const AttentionShape& shape, int G, int num_seqs,
               int64_t n, const std::vector<float>* ref) {
  SCOPED_TRACE(name);
  const Compare cv = gputest::compare(r.out, v1.out);
  Compare cr;
  if (ref != nullptr) cr = gputest::compare(r.out, *ref);
  std::printf("[full %s] D %d G %d B %d Hkv %d n %lld splits %d nmse %.3g maxabs %.3g v1_nmse %.3g v1_maxabs %.3g%s\n",
              name, shape.head_dim, G, num_seqs, shape.num_heads_kv, static_cast<long long>(n), r.splits,
              ref != nullptr ? cr.nmse : -1.0, ref != nullptr ? cr.max_abs : -1.0, cv.nmse, cv.max_abs,
              ref != nullptr ? "" : " (no CPU reference)");
  EXPECT_EQ(gputest::compare(r.out, r.out).unwritten, 0) << name << " left outputs unwritten (NaN)";
  EXPECT_LT(cv.nmse, kV1Nmse);
  EXPECT_LT(cv.max_abs, kV1MaxAbs);
  if (ref != nullptr) {
    EXPECT_EQ(cr.unwritten, 0);
    EXPECT_LT(cr.nmse, kRefNmse);
    EXPECT_LT(cr.max_abs, kRefMaxAbs);
  }
}

// Runs tma2d (the default), bulk and v1 on the same inputs; checks each against `ref` (when given) and v1.
void check_kernels(const AttentionShape& shape, int num_seqs, int64_t n, int64_t stride, const cuda::DeviceBuffer& dq,
                   const cuda::DeviceBuffer& dk, const cuda::DeviceBuffer& dv, size_t q_elems,
                   const std::vector<float>* ref) {
  const int G = shape.num_heads_q / shape.num_heads_kv;
  const Run v1 = run_kernel("v1", shape, num_seqs, n, stride, dq, dk, dv, q_elems);
  EXPECT_EQ(gputest::compare(v1.out, v1.out).unwritten, 0) << "v1 left outputs unwritten (NaN)";
  if (ref != nullptr) {
    const Compare cv1 = gputest::compare(v1.out, *ref);  // the reference check of v1 itself
    EXPECT_LT(cv1.nmse, kRefNmse);
    EXPECT_LT(cv1.max_abs, kRefMaxAbs);
  }
  for (const char* kernel : {"tma2d", "bulk"}) {
    const Run r = run_kernel(kernel, shape, num_seqs, n, stride, dq, dk, dv, q_elems);
    check_run(kernel, r, v1, shape, G, num_seqs, n, ref);
  }
}

// Clustered K/V and peaked queries from gpu_test_util.h, stride n + 5 (NaN rows past n), CPU reference.
void run_ref_case(int num_seqs, int hkv, int group, int d, int64_t n, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "seqs=" << num_seqs << " hkv=" << hkv << " group=" << group << " d=" << d
                                  << " n=" << n << " seed=" << seed);
  const int H = num_seqs * hkv;
  const int64_t stride = n + 5;
  auto kv = gputest::make_kv(H, n, stride, d, seed);
  auto q = gputest::make_q(kv, group, seed + 1);
  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v), dq = gputest::upload(q);
  std::vector<float> ref(q.size());
  std::vector<int32_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  const float scale = 1.0f / std::sqrt(float(d));
  for (int h = 0; h < H; ++h)
    for (int g = 0; g < group; ++g) {
      gputest::RefState st(d);
      gputest::ref_exact(kv, &q[(size_t(h) * group + g) * d], scale, h, all, st);
      st.finish(&ref[(size_t(h) * group + g) * d], d);
    }
  check_kernels(AttentionShape{hkv * group, hkv, d}, num_seqs, n, stride, dq, dk, dv, q.size(), &ref);
}

TEST(CudaDenseBulk, TailsGroupsHeadDims) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 7000;
  for (int d : {64, 128})
    for (int group : {1, 4, 8})
      for (int64_t n : {1, 63, 64, 65, 127, 128, 129, 191, 193, 1000, 4097}) run_ref_case(1, 2, group, d, n, seed++);
}

TEST(CudaDenseBulk, Batches) {
  RETROINFER_REQUIRE_GPU();
  run_ref_case(3, 8, 4, 128, 4097, 7100);
  run_ref_case(3, 1, 8, 64, 1000, 7101);
  run_ref_case(16, 8, 4, 128, 1000, 7102);
  run_ref_case(16, 2, 1, 64, 65, 7103);
}

TEST(CudaDenseBulk, LongContexts) {
  RETROINFER_REQUIRE_GPU();
  run_ref_case(1, 2, 4, 128, 32768 + 17, 7200);  // 132 splits of ~248 tokens: 4 tiles, the 3-stage ring wraps
  run_ref_case(1, 1, 8, 128, 131072, 7201);      // 264 splits of 496 tokens: 8 tiles, partial last
  run_ref_case(1, 1, 2, 64, 131072, 7202);       // D = 64: 8 tiles per split through the 6-stage ring
  // One KV head: 264 splits of ~90 tokens on the H200 (a whole 64-token tile + a tail tile of 26 valid
  // tokens: every warp partly valid in bulk's grouping, warps 2-3 idle in tma2d's); D = 64: ~75 (64 + 11).
  run_ref_case(1, 1, 4, 128, 132 * 180 + 7, 7203);
  run_ref_case(1, 1, 8, 64, 132 * 150 + 3, 7204);
}

// kernel_bench's "full" shapes (Llama-3-8B heads) on device-random K/V: against v1 only (an f64 reference
// of 16 x 8 x 4 heads over 128K tokens would take minutes on the CPU).
TEST(CudaDenseBulk, BenchShapesAgainstV1) {
  RETROINFER_REQUIRE_GPU();
  const AttentionShape shape{32, 8, 128};
  for (int batch : {1, 4, 16}) {
    SCOPED_TRACE(testing::Message() << "batch=" << batch);
    const int64_t n = 131072;
    const size_t H = size_t(batch) * 8, kv_elems = H * n * 128, q_elems = H * 4 * 128;
    cuda::DeviceBuffer dk(kv_elems * 2), dv(kv_elems * 2), dq(q_elems * 4);
    cuda::fill_random_bf16(dk.as<uint16_t>(), kv_elems, 7300 + batch, 1.0f);
    cuda::fill_random_bf16(dv.as<uint16_t>(), kv_elems, 7400 + batch, 1.0f);
    cuda::fill_random_f32(dq.as<float>(), q_elems, 7500 + batch, 1.0f);
    check_kernels(shape, batch, n, n, dq, dk, dv, q_elems, nullptr);
  }
}

// Repeated runs of the default kernel are bit-identical (no floating-point atomics; the fused merge's
// counters reset themselves), and a run with fewer tokens than the decoder was sized for matches a
// decoder sized for exactly those tokens (the splits follow the tokens, not max_tokens).
TEST(CudaDenseBulk, DeterministicAndShorterRuns) {
  RETROINFER_REQUIRE_GPU();
  EnvGuard env("RETROINFER_FULL_DECODE", nullptr);
  const int d = 128, group = 4, hkv = 2;
  const int64_t n_max = 5000, n = 3001;
  auto kv = gputest::make_kv(hkv, n_max, n_max, d, 7600);
  auto q = gputest::make_q(kv, group, 7601);
  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v), dq = gputest::upload(q);
  const AttentionShape shape{hkv * group, hkv, d};
  cuda::DenseDecoder big(shape, 1, n_max), exact(shape, 1, n);
  std::vector<std::vector<float>> outs;
  for (auto* dec : {&big, &big, &exact}) {
    auto dout = gputest::poisoned(q.size());
    dec->run(dq.as<float>(), dk.as<uint16_t>(), dv.as<uint16_t>(), n, n_max, 0.0f, dout.as<float>());
    cuda::synchronize();
    outs.push_back(gputest::download_f32(dout, q.size()));
  }
  EXPECT_EQ(gputest::compare(outs[0], outs[0]).unwritten, 0);
  EXPECT_TRUE(bit_equal(outs[0], outs[1])) << "two runs of the same decoder differ";
  EXPECT_TRUE(bit_equal(outs[0], outs[2])) << "decoders sized for different max_tokens differ";
}

TEST(CudaDenseBulk, EnvironmentSwitch) {
  RETROINFER_REQUIRE_GPU();
  const AttentionShape shape{8, 2, 64};
  {
    EnvGuard env("RETROINFER_FULL_DECODE", nullptr);
    EXPECT_STREQ(cuda::DenseDecoder(shape, 1, 100).kernel(),
                 cuda::detail::dense_kernel_name(cuda::detail::kDefaultDenseKernel));
  }
  for (const char* k : {"bulk", "v1", "tma2d"}) {
    EnvGuard env("RETROINFER_FULL_DECODE", k);
    EXPECT_STREQ(cuda::DenseDecoder(shape, 1, 100).kernel(), k);
  }
  for (const char* bad : {"fast", "async", "bulk8"}) {  // unknown, and removed after run 15
    EnvGuard env("RETROINFER_FULL_DECODE", bad);
    EXPECT_THROW(cuda::DenseDecoder(shape, 1, 100), Error) << bad;
  }
}

}  // namespace
}  // namespace retroinfer
