// The dense decode's streaming kernels (kernels/decode_dense.h: kTensorMap, the kernel every caller gets, and
// kBulkCopy, its fallback where no tensor map can be made) through dense_decode, against the f64 CPU reference
// and against each other on the same inputs: tails around the 64-token tiles (n = 1, 63, 64, 65, 127, 128, 129,
// 191, 193, 1000, 4097), head_dim 64/128, GQA groups 1/4/8, batches 1/3/16, long contexts (32K + 17, 128K:
// many tiles per CTA, the stage ring wraps), and kernel_bench's shapes (128K x batch 1/4/16, 32 q / 8 kv heads:
// 33 / 8 / 2 splits per head) against each other only. Outputs are poisoned with NaN first; K/V rows past n
// hold NaN (a read past the end shows). One line per case and kernel: "[full <kernel>] D .. G .. B .. n ..
// splits .. nmse .. maxabs .. vs_other_nmse .. vs_other_maxabs ..".
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
using cuda::detail::DenseKernel;

// Against the f64 reference: the bounds of test_cuda_dense.cpp (same arithmetic per token: the query and
// P carried as bf16 hi + lo pairs through mma m16n8k16, f32 accumulation; its derivation there): nmse
// 1e-9, max-abs 1e-4.
constexpr double kRefNmse = 1e-9;
constexpr double kRefMaxAbs = 1e-4;
// The two kernels against each other on the same inputs: both form the same query fragments (the query's
// rounding is common to both) and differ only by how a tile's tokens are grouped over the warps (warp w: tokens
// 16w..16w+15 against 8b + 2w + {0, 1}), so each P is formed against a different running max and split into
// hi + lo differently, ~2^-18 relative per kernel (random signed), and the merges round differently (f32):
// decode_path_test_util.h's regrouping bound, max-abs 5e-5 (an output, a convex combination of value rows
// |v| <= ~4.5, moves by <= 2^-18 * 4.5 = 1.7e-5 per kernel); nmse ~(2^-19)^2 = 4e-12 against outputs of rms
// ~0.3-1: 1e-10. The bench shapes (128K random rows) average V down to an output rms of ~0.02, which raises
// the nmse of the same absolute error by ~(0.3 / 0.02)^2: 1e-9 (max-abs still bounds the error itself).
constexpr double kPairNmse = 1e-9;
constexpr double kPairMaxAbs = 5e-5;

struct Run {
  std::vector<float> out;
  int splits = 0;
};

const char* name_of(DenseKernel k) { return k == DenseKernel::kTensorMap ? "tensor_map" : "bulk_copy"; }

// dense_decode with kernel k over device q, K, V (its own split workspace and merge counter).
Run run_kernel(DenseKernel k, const AttentionShape& shape, int num_seqs, int64_t n, int64_t stride,
               const cuda::DeviceBuffer& dq, const cuda::DeviceBuffer& dk, const cuda::DeviceBuffer& dv,
               size_t q_elems) {
  const int H = num_seqs * shape.num_heads_kv, G = shape.num_heads_q / shape.num_heads_kv, D = shape.head_dim;
  const int splits = cuda::detail::dense_splits(k, n, H, D);
  cuda::DeviceBuffer part_ml(size_t(H) * splits * G * 8), part_o(size_t(H) * splits * G * D * 4), counter(size_t(H) * 4);
  counter.fill_bytes(0);
  auto dout = gputest::poisoned(q_elems);
  cuda::synchronize();
  cuda::detail::DenseDecodeArgs a;
  a.kernel = k;
  a.q = dq.as<float>();
  a.k = dk.as<uint16_t>();
  a.v = dv.as<uint16_t>();
  a.kv_stride = stride;
  a.num_tokens = n;
  a.num_heads = H;
  a.group = G;
  a.head_dim = D;
  a.scale = cuda::detail::effective_scale(0.0f, D);
  a.part_ml = part_ml.as<float2>();
  a.part_o = part_o.as<float>();
  a.max_splits = splits;
  a.merge_counter = counter.as<int>();
  a.out = dout.as<float>();
  Run r;
  r.splits = cuda::detail::dense_decode(a, nullptr, "dense_decode(test)");
  cuda::synchronize();
  r.out = gputest::download_f32(dout, q_elems);
  return r;
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Checks run r of kernel k against `ref` (when given) and the other kernel's run and prints its line.
void check_run(DenseKernel k, const Run& r, const Run& other, const AttentionShape& shape, int G, int num_seqs,
               int64_t n, const std::vector<float>* ref) {
  SCOPED_TRACE(name_of(k));
  const Compare cv = gputest::compare(r.out, other.out);
  Compare cr;
  if (ref != nullptr) cr = gputest::compare(r.out, *ref);
  std::printf("[full %s] D %d G %d B %d Hkv %d n %lld splits %d nmse %.3g maxabs %.3g vs_other_nmse %.3g "
              "vs_other_maxabs %.3g%s\n",
              name_of(k), shape.head_dim, G, num_seqs, shape.num_heads_kv, static_cast<long long>(n), r.splits,
              ref != nullptr ? cr.nmse : -1.0, ref != nullptr ? cr.max_abs : -1.0, cv.nmse, cv.max_abs,
              ref != nullptr ? "" : " (no CPU reference)");
  EXPECT_EQ(gputest::compare(r.out, r.out).unwritten, 0) << name_of(k) << " left outputs unwritten (NaN)";
  EXPECT_LT(cv.nmse, kPairNmse);
  EXPECT_LT(cv.max_abs, kPairMaxAbs);
  if (ref != nullptr) {
    EXPECT_EQ(cr.unwritten, 0);
    EXPECT_LT(cr.nmse, kRefNmse);
    EXPECT_LT(cr.max_abs, kRefMaxAbs);
  }
}

// Runs both kernels on the same inputs; checks each against `ref` (when given) and the other.
void check_kernels(const AttentionShape& shape, int num_seqs, int64_t n, int64_t stride, const cuda::DeviceBuffer& dq,
                   const cuda::DeviceBuffer& dk, const cuda::DeviceBuffer& dv, size_t q_elems,
                   const std::vector<float>* ref) {
  const int G = shape.num_heads_q / shape.num_heads_kv;
  const Run tm = run_kernel(DenseKernel::kTensorMap, shape, num_seqs, n, stride, dq, dk, dv, q_elems);
  const Run bc = run_kernel(DenseKernel::kBulkCopy, shape, num_seqs, n, stride, dq, dk, dv, q_elems);
  check_run(DenseKernel::kTensorMap, tm, bc, shape, G, num_seqs, n, ref);
  check_run(DenseKernel::kBulkCopy, bc, tm, shape, G, num_seqs, n, ref);
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

TEST(CudaDenseStream, TailsGroupsHeadDims) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 7000;
  for (int d : {64, 128})
    for (int group : {1, 4, 8})
      for (int64_t n : {1, 63, 64, 65, 127, 128, 129, 191, 193, 1000, 4097}) run_ref_case(1, 2, group, d, n, seed++);
}

TEST(CudaDenseStream, Batches) {
  RETROINFER_REQUIRE_GPU();
  run_ref_case(3, 8, 4, 128, 4097, 7100);
  run_ref_case(3, 1, 8, 64, 1000, 7101);
  run_ref_case(16, 8, 4, 128, 1000, 7102);
  run_ref_case(16, 2, 1, 64, 65, 7103);
}

TEST(CudaDenseStream, LongContexts) {
  RETROINFER_REQUIRE_GPU();
  run_ref_case(1, 2, 4, 128, 32768 + 17, 7200);  // 132 splits of ~248 tokens: 4 tiles, the 3-stage ring wraps
  run_ref_case(1, 1, 8, 128, 131072, 7201);      // 264 splits of 496 tokens: 8 tiles, partial last
  run_ref_case(1, 1, 2, 64, 131072, 7202);       // D = 64: 8 tiles per split through the 6-stage ring
  // One KV head: 264 splits of ~90 tokens on the H200 (a whole 64-token tile + a tail tile of 26 valid
  // tokens: every warp partly valid in the bulk-copy kernel's grouping, warps 2-3 idle in the tensor-map
  // kernel's); D = 64: ~75 (64 + 11).
  run_ref_case(1, 1, 4, 128, 132 * 180 + 7, 7203);
  run_ref_case(1, 1, 8, 64, 132 * 150 + 3, 7204);
}

// kernel_bench's "full" shapes (Llama-3-8B heads) on device-random K/V: the kernels against each other only
// (an f64 reference of 16 x 8 x 4 heads over 128K tokens would take minutes on the CPU).
TEST(CudaDenseStream, BenchShapesAgainstEachOther) {
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

// Repeated runs of DenseDecoder are bit-identical (no floating-point atomics; the fused merge's counters reset
// themselves), and a run with fewer tokens than the decoder was sized for matches a decoder sized for exactly
// those tokens (the splits follow the tokens, not max_tokens).
TEST(CudaDenseStream, DeterministicAndShorterRuns) {
  RETROINFER_REQUIRE_GPU();
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

}  // namespace
}  // namespace retroinfer
