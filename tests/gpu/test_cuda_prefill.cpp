// cuda::PrefillAttention (causal GQA prefill; the portable mma.sync kernel and the Hopper wgmma one) against the CPU retroinfer::prefill_attention
// on the same bf16 K/V: query counts with tails of the 128-row and 64-key tiles, a prefix (pos0 > 0),
// head_dim 64 and 128, GQA groups 1, 3, 4, 7, 8 (3 and 7: tiles of whole tokens with padding rows), a kv_stride
// past the tokens (NaN-poisoned rows), a long prefix, short chunks over long caches (the split-key launch), q
// passed in bf16 too, and the argument checks. Outputs are poisoned (0xff) first: every element must be written.
//
// Each case compares against two CPU references:
//  * "own": q rounded to bf16 on the host (as the kernel does before its QK^T product), so that the only
//    rounding left is the kernel's bf16 P before the PV product (plus f32 order and ex2.approx);
//  * "f32": the unrounded f32 q (the end-to-end error a caller sees).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "kernels/kernel_common.h"
#include "kernels/prefill_kernels.h"
#include "retroinfer/attention.h"
#include "retroinfer/cuda_model.h"
#include "retroinfer/error.h"
#include "retroinfer/kv_cache.h"

namespace retroinfer {
namespace {

// Tolerances.
// "own": the kernel's P = exp(logit - running max) in (0, 1] is rounded to bf16 (relative error <= 2^-9,
// round to nearest) for the PV product while the row sum l uses the unrounded P, so
// |o_gpu - o| = |sum_i p_i e_i v_i| <= 2^-9 max|v| with |e_i| <= 2^-9. On top: logits from the same bf16
// operands summed in another f32 order (relative ~1e-6 of sum |q k| scale ~ 10, i.e. ~1e-5 absolute, a
// factor 1 +- 1e-5 on p) and ex2.approx (2 ulp): 1e-4 max|v| covers both with margin. The nmse of
// independent rounding errors (uniform, variance (2^-9)^2 / 3 relative) is ~1.3e-6 whether attention is
// peaked or diffuse (both |o|^2 and sum p_i^2 v_i^2 scale with the effective number of keys); 1e-5 gives
// ~8x margin while an indexing or masking error gives nmse ~ 1.
constexpr double kOwnNmse = 1e-5;
constexpr double kOwnMaxAbsPerV = 0.001953125 + 1e-4;  // times max|v|
// "f32": rounding q to bf16 perturbs each logit by delta = scale sum_d (bf16(q_d) - q_d) k_d, a sum of D
// independent terms of relative error uniform in +-2^-9: std(delta) ~ scale 2^-9 / sqrt(3) ||q * k||_2.
// For the data below (q ~ N(0, 2^2), k ~ N(0, 1), D = 128, scale = 1/sqrt(D)) that is ~2e-3, which moves
// o by about std(delta) times the spread of v under p: relative error ~2e-3, nmse ~1e-5 (observed
// figures are printed). Bounds: nmse 1e-4; max-abs 0.05, where a float64 numpy simulation of this q
// rounding on these data gave at most 0.015 over 3 x 320K outputs (largest for the first rows, which see
// few keys), plus the 2^-9 max|v| ~ 0.009 of the P rounding.
// A worst-case bound (all roundings aligned) would be e^{2 max|delta|} - 1 ~ 0.3 of max|v|: useless.
constexpr double kF32Nmse = 1e-4;
constexpr double kF32MaxAbs = 0.05;

struct Case {
  int hkv, group, d;
  int64_t pos0, n;
  int64_t stride_pad = 5;  // rows past pos0 + n (NaN-poisoned)
  float scale = 0.0f;
  bool own_stream = false;  // run on a non-default stream
  cuda::PrefillKernel kernel = cuda::PrefillKernel::kAuto;
};

void run_case(const Case& c, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "hkv=" << c.hkv << " group=" << c.group << " d=" << c.d << " pos0=" << c.pos0
                                  << " n=" << c.n << " scale=" << c.scale << " seed=" << seed
                                  << " kernel=" << cuda::prefill_kernel_name(c.kernel));
  const int hq = c.hkv * c.group, d = c.d;
  const int64_t total = c.pos0 + c.n, stride = total + c.stride_pad;
  const AttentionShape shape{hq, c.hkv, d};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);

  // K/V: N(0, 1) as f32, stored in bf16 by the cache; the device copy is the same bf16 bits.
  KvCache kv(c.hkv, d, DType::kBF16);
  {
    std::vector<float> k(size_t(total) * c.hkv * d), v(k.size());
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    kv.append(k.data(), v.data(), total);
  }
  std::vector<uint16_t> hk(size_t(c.hkv) * stride * d, 0x7fc0), hv(hk.size(), 0x7fc0);  // NaN past total
  double max_v = 0;
  for (int h = 0; h < c.hkv; ++h)
    for (int64_t t = 0; t < total; ++t) {
      const auto* kr = static_cast<const uint16_t*>(kv.key_row(h, t));
      const auto* vr = static_cast<const uint16_t*>(kv.value_row(h, t));
      for (int i = 0; i < d; ++i) {
        hk[(size_t(h) * stride + t) * d + i] = kr[i];
        hv[(size_t(h) * stride + t) * d + i] = vr[i];
        max_v = std::max(max_v, std::abs(double(bf16_to_f32(vr[i]))));
      }
    }
  // q: N(0, 2^2) so that attention is neither uniform nor one-hot (logit std ~2 at scale 1/sqrt(D)).
  std::vector<float> q(size_t(c.n) * hq * d), q_bf16(q.size());
  for (auto& x : q) x = 2.0f * nd(rng);
  for (size_t i = 0; i < q.size(); ++i) q_bf16[i] = bf16_to_f32(f32_to_bf16(q[i]));

  std::vector<float> ref_own(q.size()), ref_f32(q.size());
  prefill_attention(kv, shape, c.scale, c.pos0, c.n, q_bf16.data(), ref_own.data());
  prefill_attention(kv, shape, c.scale, c.pos0, c.n, q.data(), ref_f32.data());

  auto dk = gputest::upload(hk), dv = gputest::upload(hv), dq = gputest::upload(q);
  auto dout = gputest::poisoned(q.size());
  cuda::PrefillAttention pa(shape, c.kernel);
  if (c.own_stream) {
    cuda::StreamHandle stream;
    pa.run(dq.as<float>(), dk.as<uint16_t>(), dv.as<uint16_t>(), stride, c.pos0, c.n, c.scale, dout.as<float>(),
           stream.get());
    cuda::synchronize(stream.get());
  } else {
    pa.run(dq.as<float>(), dk.as<uint16_t>(), dv.as<uint16_t>(), stride, c.pos0, c.n, c.scale, dout.as<float>());
    cuda::synchronize();
  }
  const auto got = gputest::download_f32(dout, q.size());
  // The bf16 output (the runner's O-projection input): each element the f32 output rounded to nearest even.
  cuda::DeviceBuffer dout16(q.size() * 2);
  dout16.fill_bytes(0xff);
  pa.run_bf16(dq.as<float>(), dk.as<uint16_t>(), dv.as<uint16_t>(), stride, c.pos0, c.n, c.scale,
              dout16.as<uint16_t>());
  cuda::synchronize();
  std::vector<uint16_t> got16(q.size());
  dout16.download(got16.data(), got16.size() * 2);
  int64_t bf16_mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) bf16_mismatches += got16[i] != f32_to_bf16(got[i]);
  EXPECT_EQ(bf16_mismatches, 0) << "run_bf16 differs from run's output rounded to bf16";
  // q rounded on the host and passed as q_bf16, as the model runner passes it (the Hopper kernel reads it; without
  // it the launch rounds q itself): the same output bit for bit.
  {
    std::vector<uint16_t> q16(q.size());
    for (size_t i = 0; i < q.size(); ++i) q16[i] = f32_to_bf16(q[i]);
    auto dq16 = gputest::upload(q16);
    auto dout2 = gputest::poisoned(q.size());
    pa.run(dq.as<float>(), dk.as<uint16_t>(), dv.as<uint16_t>(), stride, c.pos0, c.n, c.scale, dout2.as<float>(),
           nullptr, dq16.as<uint16_t>());
    cuda::synchronize();
    const auto got2 = gputest::download_f32(dout2, q.size());
    int64_t differ = 0;
    for (size_t i = 0; i < got.size(); ++i) differ += std::memcmp(&got[i], &got2[i], 4) != 0;
    EXPECT_EQ(differ, 0) << "the output with q_bf16 passed differs from the one with q alone";
  }

  const gputest::Compare own = gputest::compare(got, ref_own), f32 = gputest::compare(got, ref_f32);
  const double own_max_bound = kOwnMaxAbsPerV * max_v;
  std::printf("[prefill %s] hkv=%d group=%d d=%d pos0=%lld n=%lld scale=%g: own nmse %.3e max_abs %.3e (bound %.3e) | "
              "f32-q nmse %.3e max_abs %.3e | unwritten %lld | bf16 out mismatches %lld\n",
              std::string(cuda::prefill_kernel_name(pa.kernel())).c_str(), c.hkv, c.group, d,
              static_cast<long long>(c.pos0), static_cast<long long>(c.n), c.scale, own.nmse,
              own.max_abs, own_max_bound, f32.nmse, f32.max_abs, static_cast<long long>(own.unwritten),
              static_cast<long long>(bf16_mismatches));
  EXPECT_EQ(own.unwritten, 0);
  EXPECT_LT(own.nmse, kOwnNmse);
  EXPECT_LT(own.max_abs, own_max_bound);
  EXPECT_LT(f32.nmse, kF32Nmse);
  EXPECT_LT(f32.max_abs, kF32MaxAbs);
}

TEST(CudaPrefill, TailsWithoutPrefix) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 1000;
  // n * group around the 128-row CTA tile and the 64-key tiles.
  for (int64_t n : {1, 3, 17, 31, 33, 64, 127, 129, 200}) run_case({2, 4, 128, 0, n}, seed++);
  for (int64_t n : {1, 33, 129}) run_case({2, 4, 64, 0, n}, seed++);
}

TEST(CudaPrefill, GroupsAndHeadDimsWithPrefix) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 2000;
  for (int d : {64, 128})
    for (int group : {1, 3, 4, 8}) run_case({2, group, d, 301, 157}, seed++);
}

TEST(CudaPrefill, PrefixEdgesAndScale) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 3000;
  // pos0 on and next to tile edges, a chunk that starts mid-tile, an explicit scale, a large stride pad.
  run_case({1, 8, 128, 64, 64}, seed++);
  run_case({1, 8, 128, 63, 65}, seed++);
  run_case({3, 1, 64, 1, 255}, seed++);
  run_case({2, 3, 128, 95, 97, 200, 0.05f}, seed++);
  run_case({1, 4, 64, 500, 1, 1000}, seed++);
  run_case({2, 4, 128, 200, 300, 5, 0.0f, true}, seed++);  // on a non-default stream
}

TEST(CudaPrefill, LongPrefix) {
  RETROINFER_REQUIRE_GPU();
  run_case({1, 4, 128, 70001, 37}, 4000);
}

// Few query rows over a long cache take the split-key launch (each row tile's keys in several CTAs, merged by
// log-sum-exp): Llama-3-8B's 8 KV heads with a 64-token question, Qwen2.5's group of 7 with 5 tokens, a split
// that ends inside the diagonal tiles, head_dim 64 and 128; the same bounds as every other case.
TEST(CudaPrefill, SplitKeysForShortChunks) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 5000;
  const Case cases[] = {{8, 4, 128, 20000, 64}, {2, 7, 64, 9000, 5}, {2, 4, 128, 1000, 16}, {1, 8, 64, 4095, 33}};
  for (const Case& c : cases) {
    cuda::detail::PrefillParams p;
    p.pos0 = static_cast<int>(c.pos0);
    p.n = static_cast<int>(c.n);
    p.group = c.group;
    p.num_heads_kv = c.hkv;
    EXPECT_GT(cuda::detail::prefill_splits(p, cuda::detail::sm_count()), 1) << "pos0 " << c.pos0 << " n " << c.n;
    run_case(c, seed++);
  }
}

// Head_dim 128 runs the Hopper (wgmma) kernel by default on a compute capability 9.0 GPU; the portable kernel
// stays the fallback elsewhere and is held to the same bounds here: tails of both key tiles (64 and 128), GQA
// groups, a prefix, a long prefix and the split-key launch, each case through both kernels.
TEST(CudaPrefill, PortableAndHopperKernelsAtHeadDim128) {
  RETROINFER_REQUIRE_GPU();
  const bool hopper = cuda::detail::prefill_hopper_supported();
  EXPECT_EQ(cuda::PrefillAttention(AttentionShape{32, 8, 128}).kernel(),
            hopper ? cuda::PrefillKernel::kHopper : cuda::PrefillKernel::kPortable);
  EXPECT_EQ(cuda::PrefillAttention(AttentionShape{14, 2, 64}).kernel(), cuda::PrefillKernel::kPortable);
  if (!hopper) {
    EXPECT_THROW(cuda::PrefillAttention(AttentionShape{32, 8, 128}, cuda::PrefillKernel::kHopper), Error);
    GTEST_SKIP() << "no compute capability 9.0 GPU: the Hopper kernel is not built for this one";
  }
  EXPECT_THROW(cuda::PrefillAttention(AttentionShape{14, 2, 64}, cuda::PrefillKernel::kHopper), Error);
  uint64_t seed = 6000;
  const Case cases[] = {{2, 4, 128, 0, 1},     {2, 4, 128, 0, 127},   {2, 4, 128, 0, 129},  {1, 1, 128, 0, 300},
                        {2, 3, 128, 95, 97},   {1, 8, 128, 127, 129}, {2, 7, 128, 301, 157}, {1, 4, 128, 70001, 37},
                        {8, 4, 128, 20000, 64}, {2, 4, 128, 1000, 16}};
  for (Case c : cases) {
    for (cuda::PrefillKernel k : {cuda::PrefillKernel::kPortable, cuda::PrefillKernel::kHopper}) {
      c.kernel = k;
      run_case(c, seed);
    }
    ++seed;
  }
}

// The kernel names of the benchmarks' --kernels (no GPU needed).
TEST(CudaPrefill, KernelNames) {
  for (cuda::PrefillKernel k : {cuda::PrefillKernel::kAuto, cuda::PrefillKernel::kPortable, cuda::PrefillKernel::kHopper})
    EXPECT_EQ(cuda::parse_prefill_kernel(cuda::prefill_kernel_name(k)), k);
  EXPECT_THROW(cuda::parse_prefill_kernel("wgmma"), Error);
  EXPECT_THROW(cuda::parse_prefill_kernel(""), Error);
}

TEST(CudaPrefill, RejectsBadArguments) {
  RETROINFER_REQUIRE_GPU();
  EXPECT_THROW(cuda::PrefillAttention(AttentionShape{32, 8, 96}), Error);   // head_dim 96
  EXPECT_THROW(cuda::PrefillAttention(AttentionShape{32, 2, 128}), Error);  // group 16
  EXPECT_THROW(cuda::PrefillAttention(AttentionShape{6, 4, 128}), Error);   // not a multiple
  cuda::PrefillAttention pa(AttentionShape{8, 2, 64});
  cuda::DeviceBuffer b(1 << 20);
  float* f = b.as<float>();
  const uint16_t* h = b.as<uint16_t>();
  EXPECT_THROW(pa.run(f, h, h, 100, 90, 11, 0.0f, f), Error);      // stride < pos0 + n
  EXPECT_THROW(pa.run(f, nullptr, h, 100, 0, 10, 0.0f, f), Error);  // null K
  EXPECT_THROW(pa.run(f, h, h, 100, -1, 10, 0.0f, f), Error);       // negative pos0
  EXPECT_THROW(pa.run(f, h, h, 100, 0, 10, -1.0f, f), Error);       // negative scale
  EXPECT_THROW(pa.run(f + 1, h, h, 100, 0, 10, 0.0f, f), Error);    // misaligned q
  EXPECT_THROW(pa.run(f, h, h, 100, 0, 10, 0.0f, f, nullptr, h + 1), Error);  // misaligned q_bf16
  EXPECT_THROW(pa.run_bf16(f, h, h, 100, 0, 10, 0.0f, nullptr), Error);                       // null out
  EXPECT_THROW(pa.run_bf16(f, h, h, 100, 0, 10, 0.0f, b.as<uint16_t>() + 1), Error);          // misaligned out
  // Positions whose last key tile would pass 2^31 (the kernels index them in 32 bits): refused before any launch.
  const int64_t big = (int64_t{1} << 31) - 100;
  EXPECT_THROW(pa.run(f, h, h, big + 1, big - 10, 10, 0.0f, f), Error);
  // n = 0 is a no-op: the output stays poisoned.
  auto out = gputest::poisoned(16);
  EXPECT_NO_THROW(pa.run(f, h, h, 100, 5, 0, 0.0f, out.as<float>()));
  cuda::synchronize();
  for (float x : gputest::download_f32(out, 16)) EXPECT_TRUE(std::isnan(x));
}

}  // namespace
}  // namespace retroinfer
