// The tensor-core GEMV (src/kernels/gemv_mma.cu: mma_gemv_bf16, mma_gemv_swiglu_bf16) against f64 CPU
// references on bf16-rounded inputs, every variant (tiles 1, 2 x warps 4, 8, 16), rows 1..8, beta 0 and 1,
// tails (out % 16 != 0, in % 32 != 0, in = 8), outputs poisoned first. One summary line per case.
//
// Tolerances and their derivations:
// * Products, per element. Every bf16 x bf16 product is exact (8 + 8 significant bits). The tensor core adds
//   16 products to the f32 accumulator per mma; its internal alignment truncates, so take an error of at most
//   2 ulp (2^-22 relative) of |accumulator| + sum |products| per mma. A thread's chain holds at most in / 16
//   mmas (all of K in one warp, conservative), then at most 15 f32 adds of the warps' partials and the beta
//   add (2^-24 each). With S = sum_k |x_k w_k| >= every |partial sum|:
//     |got - want| <= (in / 16 * 2^-22 + 17 * 2^-24) * S + 2^-24 * |want|      (kPerElement below, x 2 margin)
//   This worst case is loose: with S ~ 0.64 in sigma_x sigma_w it is ~0.3 sigma_x sigma_w at in = 4096, below
//   the ~2.8 sigma_x sigma_w by which a missing or repeated 8-element chunk moves an element; the nmse bound
//   below catches the subtler errors (and a dropped chunk at in = 14336, where this bound is ~4 sigma^2).
// * Products, nmse <= max(1e-9, (2 L 2^-23)^2), L = the mmas of one warp's chain (2 ceil(ceil(in / 32) /
//   warps)). 1e-9 is the bound of test_cuda_model_kernels.cpp for cuBLAS's tensor-core products; the second
//   term allows a systematic truncation of 2 ulp of the accumulator per mma, all in one direction, over the
//   whole chain (relative 2 L 2^-23; in = 14336 at 4 warps: L = 224, 5.3e-5, nmse 2.9e-9), which the
//   tensor core's round-toward-zero alignment could approach. A missing 8-element chunk of K gives nmse
//   ~8 / in >= 5e-4; a wrong row or column ~2.
// * f32-x launch vs bf16-x launch on the rounded x: the kernel rounds x as f32_to_bf16_array does, the rest
//   is the same deterministic arithmetic: bitwise equal (this also checks run-to-run determinism).
// * Fused SwiGLU (bf16 out) against bf16(silu(g) u) of the f64 sums: the sums' error above and silu's few
//   ulp move the f32 value by far less than a bf16 ulp but may cross a rounding boundary: 1 bf16 ulp (2^-8
//   relative) plus an absolute floor of 3e-3 x rms(want) for values near 0 (as test_cuda_model_kernels.cpp).
// * Rows >= the call's row count and (beta 0) the old y are never read or written: the poison stays.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/gemv.h"
#include "kernels/model_kernels.h"
#include "gpu_test_util.h"
#include "retroinfer/cuda_backend.h"
#include "retroinfer/dtype.h"

namespace retroinfer {
namespace {

using cuda::DeviceBuffer;
using cuda::model::kGemvMaxRows;

constexpr double kNmse = 1e-9;

// The nmse bound of the header for one variant.
double nmse_bound(int64_t in, int warps) {
  const int64_t steps = (in / 8 + 3) / 4, chain = 2 * ((steps + warps - 1) / warps);
  return std::max(kNmse, std::pow(2.0 * double(chain) * std::ldexp(1.0, -23), 2.0));
}

std::vector<float> normal_f32(size_t n, uint64_t seed, float sd = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

std::vector<uint16_t> to_bf16(const std::vector<float>& f) {
  std::vector<uint16_t> b(f.size());
  for (size_t i = 0; i < f.size(); ++i) b[i] = f32_to_bf16(f[i]);
  return b;
}

template <typename T>
std::vector<T> fetch(const DeviceBuffer& d, size_t count) {
  std::vector<T> v(count);
  d.download(v.data(), count * sizeof(T));
  return v;
}

// f64 sums [rows, out] = x [rows, in] . W [out, in] and the sums of |products| (S of the bound).
struct Ref {
  std::vector<double> sum, abs_sum;
};
Ref reference(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w, int64_t rows, int64_t in, int64_t out) {
  std::vector<double> xf(static_cast<size_t>(rows * in)), wf(w.size());
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf16_to_f32(x[i]);
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = bf16_to_f32(w[i]);
  Ref r;
  r.sum.resize(static_cast<size_t>(rows * out));
  r.abs_sum.resize(r.sum.size());
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t n = 0; n < out; ++n) {
      double s = 0.0, a = 0.0;
      const double* xa = xf.data() + m * in;
      const double* wb = wf.data() + n * in;
      for (int64_t k = 0; k < in; ++k) {
        const double p = xa[k] * wb[k];
        s += p;
        a += std::fabs(p);
      }
      r.sum[m * out + n] = s;
      r.abs_sum[m * out + n] = a;
    }
  return r;
}

// The per-element bound of the header (x 2 margin).
double per_element(int64_t in, double abs_sum, double want) {
  return 2.0 * ((double(in) / 16.0 * std::ldexp(1.0, -22) + 17.0 * std::ldexp(1.0, -24)) * abs_sum +
                std::ldexp(1.0, -24) * std::fabs(want));
}

TEST(GemvMma, AgainstCpu) {
  RETROINFER_REQUIRE_GPU();
  struct Shape {
    int64_t in, out;
  };
  // Tails: out % 16 = 8, 1, 1, 8; in % 32 = 0, 8, 8 (one chunk), 8, 0 (long K: 112 steps per warp at 4 warps).
  for (const Shape sh : {Shape{4096, 1000}, Shape{1032, 257}, Shape{8, 17}, Shape{40, 33}, Shape{14336, 40}}) {
    const std::vector<float> wf = normal_f32(static_cast<size_t>(sh.out * sh.in), 61 + sh.in + sh.out, 0.05f);
    const std::vector<float> x_f32 = normal_f32(static_cast<size_t>(kGemvMaxRows * sh.in), 62 + sh.in);
    const std::vector<uint16_t> w = to_bf16(wf), x = to_bf16(x_f32);
    const std::vector<float> y0 = normal_f32(static_cast<size_t>(kGemvMaxRows * sh.out), 63 + sh.out);
    const Ref ref = reference(x, w, kGemvMaxRows, sh.in, sh.out);
    DeviceBuffer dw = gputest::upload(w), dx = gputest::upload(x), dxf = gputest::upload(x_f32),
                 dy(y0.size() * 4), dy2(y0.size() * 4);
    std::vector<float> poison(y0.size());
    std::memset(poison.data(), 0xff, poison.size() * 4);
    for (int64_t rows = 1; rows <= kGemvMaxRows; ++rows) {
      double worst_nmse = 0.0, worst_ratio = 0.0;
      for (int tiles : cuda::model::kMmaGemvTiles)
        for (int warps : cuda::model::kMmaGemvWarps)
          for (float beta : {0.0f, 1.0f}) {
            SCOPED_TRACE(testing::Message() << "in " << sh.in << " out " << sh.out << " rows " << rows << " tiles "
                                            << tiles << " warps " << warps << " beta " << beta);
            const std::vector<float>& init = beta == 0.0f ? poison : y0;  // beta 0 must not read y
            dy.upload(init.data(), init.size() * 4);
            cuda::model::GemvParams p;
            p.w = dw.as<uint16_t>();
            p.x = dx.as<uint16_t>();
            p.y = dy.as<float>();
            p.rows = rows;
            p.in = sh.in;
            p.out = sh.out;
            p.beta = beta;
            ASSERT_TRUE(cuda::model::gemv_supported(p));
            cuda::detail::launch_check(cuda::model::mma_gemv_bf16(p, tiles, warps, nullptr), "mma_gemv_bf16", nullptr);
            cuda::synchronize();
            const std::vector<float> got = fetch<float>(dy, y0.size());
            double num = 0.0, den = 0.0;
            int64_t bad = 0, untouched_bad = 0;
            for (int64_t m = 0; m < kGemvMaxRows; ++m)
              for (int64_t n = 0; n < sh.out; ++n) {
                const size_t i = static_cast<size_t>(m * sh.out + n);
                if (m >= rows) {
                  untouched_bad += std::memcmp(&got[i], &init[i], 4) != 0;
                  continue;
                }
                const double want = ref.sum[i] + (beta != 0.0f ? double(y0[i]) : 0.0);
                const double err = std::fabs(double(got[i]) - want), tol = per_element(sh.in, ref.abs_sum[i], want);
                if (!(err <= tol)) {
                  if (bad < 3)
                    ADD_FAILURE() << "element (" << m << ", " << n << "): got " << got[i] << " want " << want
                                  << " bound " << tol;
                  ++bad;
                }
                worst_ratio = std::max(worst_ratio, err / tol);
                num += (got[i] - want) * (got[i] - want);
                den += want * want;
              }
            const double e = std::isfinite(num) ? num / std::max(den, 1e-300) : INFINITY;
            EXPECT_EQ(bad, 0);
            EXPECT_EQ(untouched_bad, 0) << "rows >= " << rows << " of y were written";
            EXPECT_LE(e, nmse_bound(sh.in, warps));
            worst_nmse = std::max(worst_nmse, e);
            // f32 x: rounded as it is loaded; bitwise equal to the bf16-x launch (and so deterministic).
            dy2.upload(init.data(), init.size() * 4);
            p.x = nullptr;
            p.x_f32 = dxf.as<float>();
            p.y = dy2.as<float>();
            cuda::detail::launch_check(cuda::model::mma_gemv_bf16(p, tiles, warps, nullptr), "mma_gemv_bf16(f32 x)",
                                       nullptr);
            cuda::synchronize();
            const std::vector<float> got2 = fetch<float>(dy2, y0.size());
            EXPECT_EQ(std::memcmp(got.data(), got2.data(), got.size() * 4), 0) << "f32-x launch differs";
          }
      std::printf("[mma_gemv] in %lld out %lld rows %lld, tiles 1/2 x warps 4/8/16, beta 0/1: worst nmse %.2e "
                  "(bound %.1e at 4 warps), worst err / per-element bound %.2e; f32-x bitwise equal; rows >= %lld "
                  "untouched\n",
                  (long long)sh.in, (long long)sh.out, (long long)rows, worst_nmse, nmse_bound(sh.in, 4), worst_ratio,
                  (long long)rows);
    }
  }
}

// bf16(silu(g) * u) of the f64 sums [rows, 2 inter] (gate columns, then up), as double.
std::vector<double> swiglu_want(const std::vector<double>& sums, int64_t rows, int64_t inter) {
  std::vector<double> a(static_cast<size_t>(rows * inter));
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t n = 0; n < inter; ++n) {
      const float g = static_cast<float>(sums[m * 2 * inter + n]);
      const float u = static_cast<float>(sums[m * 2 * inter + inter + n]);
      a[m * inter + n] = bf16_to_f32(f32_to_bf16(g / (1.0f + std::exp(-g)) * u));
    }
  return a;
}

TEST(GemvMma, SwiGluAgainstCpu) {
  RETROINFER_REQUIRE_GPU();
  struct Shape {
    int64_t in, inter;
  };
  // inter % 8 = 0, 5, 5 (tails of the 8-column gate/up tiles); in % 32 = 0, 8.
  for (const Shape sh : {Shape{2048, 1024}, Shape{1000, 333}, Shape{2048, 5}}) {
    const int64_t rows_max = kGemvMaxRows;
    const std::vector<uint16_t> w =
        to_bf16(normal_f32(static_cast<size_t>(2 * sh.inter * sh.in), 71 + sh.inter, 0.05f));
    const std::vector<uint16_t> x = to_bf16(normal_f32(static_cast<size_t>(rows_max * sh.in), 72 + sh.in));
    const Ref ref = reference(x, w, rows_max, sh.in, 2 * sh.inter);
    const std::vector<double> want_all = swiglu_want(ref.sum, rows_max, sh.inter);
    double ss = 0.0;
    for (double v : want_all) ss += v * v;
    const double floor = 3e-3 * std::sqrt(ss / double(want_all.size()));
    DeviceBuffer dw = gputest::upload(w), dx = gputest::upload(x);
    DeviceBuffer dact(static_cast<size_t>(rows_max * sh.inter) * 2), dunf(static_cast<size_t>(rows_max * sh.inter) * 2),
        dgu(static_cast<size_t>(rows_max * 2 * sh.inter) * 4);
    for (int64_t rows = 1; rows <= rows_max; ++rows) {
      double worst = 0.0;
      int64_t differ_unfused = 0;
      for (int tiles : cuda::model::kMmaGemvTiles)
        for (int warps : cuda::model::kMmaGemvWarps) {
          SCOPED_TRACE(testing::Message() << "in " << sh.in << " inter " << sh.inter << " rows " << rows << " tiles "
                                          << tiles << " warps " << warps);
          dact.fill_bytes(0xff);
          cuda::model::GemvParams f;
          f.w = dw.as<uint16_t>();
          f.x = dx.as<uint16_t>();
          f.act_bf16 = dact.as<uint16_t>();
          f.rows = rows;
          f.in = sh.in;
          f.out = sh.inter;
          ASSERT_TRUE(cuda::model::gemv_swiglu_supported(f));
          cuda::detail::launch_check(cuda::model::mma_gemv_swiglu_bf16(f, tiles, warps, nullptr),
                                     "mma_gemv_swiglu_bf16", nullptr);
          // The unfused pair with the same variant: the plain tensor-core product into gu, the SwiGLU kernel.
          cuda::model::GemvParams p;
          p.w = dw.as<uint16_t>();
          p.x = dx.as<uint16_t>();
          p.y = dgu.as<float>();
          p.rows = rows;
          p.in = sh.in;
          p.out = 2 * sh.inter;
          cuda::detail::launch_check(cuda::model::mma_gemv_bf16(p, tiles, warps, nullptr), "mma_gemv_bf16", nullptr);
          cuda::model::SwiGluParams sp;
          sp.gu = dgu.as<float>();
          sp.act_bf16 = dunf.as<uint16_t>();
          sp.rows = rows;
          sp.inter = sh.inter;
          cuda::detail::launch_check(cuda::model::swiglu(sp, nullptr), "swiglu", nullptr);
          cuda::synchronize();
          const std::vector<uint16_t> got = fetch<uint16_t>(dact, static_cast<size_t>(rows_max * sh.inter));
          const std::vector<uint16_t> unf = fetch<uint16_t>(dunf, static_cast<size_t>(rows * sh.inter));
          int64_t bad = 0, untouched_bad = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            if (static_cast<int64_t>(i) >= rows * sh.inter) {
              untouched_bad += got[i] != 0xffff;
              continue;
            }
            const double g = bf16_to_f32(got[i]), err = std::fabs(g - want_all[i]);
            if (!(err <= std::ldexp(std::fabs(want_all[i]), -8) + floor)) {
              if (bad < 3)
                ADD_FAILURE() << "element " << i << ": got " << g << " want " << want_all[i] << " floor " << floor;
              ++bad;
            }
            worst = std::max(worst, err / (std::fabs(want_all[i]) + floor));
            differ_unfused += got[i] != unf[i];
          }
          EXPECT_EQ(bad, 0);
          EXPECT_EQ(untouched_bad, 0) << "rows >= " << rows << " of act were written";
        }
      std::printf("[mma_gemv_swiglu] in %lld inter %lld rows %lld, tiles 1/2 x warps 4/8/16: worst rel %.2e (bound "
                  "2^-8 + floor); %lld elements differ from the unfused mma product + swiglu (0 expected: the same "
                  "sums); rows >= %lld untouched\n",
                  (long long)sh.in, (long long)sh.inter, (long long)rows, worst, (long long)differ_unfused,
                  (long long)rows);
    }
  }
}

TEST(GemvMma, RefusesBadArguments) {
  RETROINFER_REQUIRE_GPU();
  DeviceBuffer b(1 << 16);
  cuda::model::GemvParams p;
  p.w = b.as<uint16_t>();
  p.x = b.as<uint16_t>();
  p.y = b.as<float>();
  p.rows = 2;
  p.in = 64;
  p.out = 8;
  EXPECT_EQ(cuda::model::mma_gemv_bf16(p, 3, 8, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::model::mma_gemv_bf16(p, 1, 5, nullptr), cudaErrorInvalidValue);
  p.in = 60;  // not a multiple of 8
  EXPECT_EQ(cuda::model::mma_gemv_bf16(p, 1, 8, nullptr), cudaErrorInvalidValue);
  p.in = 64;
  p.rows = kGemvMaxRows + 1;
  EXPECT_EQ(cuda::model::mma_gemv_bf16(p, 1, 8, nullptr), cudaErrorInvalidValue);
  p.rows = 2;
  p.x = b.as<uint16_t>() + 1;  // misaligned x
  EXPECT_EQ(cuda::model::mma_gemv_bf16(p, 1, 8, nullptr), cudaErrorInvalidValue);
  p.x = b.as<uint16_t>();
  p.y = b.as<float>() + 4096;  // apart from w and x
  p.act_bf16 = nullptr;
  EXPECT_EQ(cuda::model::mma_gemv_swiglu_bf16(p, 1, 8, nullptr), cudaErrorInvalidValue);  // no act output
  EXPECT_EQ(cuda::model::mma_gemv_bf16(p, 2, 16, nullptr), cudaSuccess);
  cuda::synchronize();
  std::printf("[mma_gemv] refuses bad variants, K %% 8 != 0, rows > %d, misaligned x, a missing act\n", kGemvMaxRows);
}

}  // namespace
}  // namespace retroinfer
