// The model runner's row kernels and products (src/backend/cuda/model: model_kernels.h, gemv.h, gemm.h) against
// CPU references, one summary line per case.
//
// Tolerances and their derivations:
// * RMSNorm (f32 out). The kernel computes the CPU runner's formula (src/model/session.cpp): mean of squares in
//   f64 (each square exact in f64; only the summation order differs, relative ~1e-16), then f32 1 / sqrt and
//   two f32 products. The f64 sums convert to the same f32 unless they straddle a rounding boundary, which
//   moves inv by at most 1 ulp (2^-23 relative) and y by at most ~2 ulp after the products: bound
//   |got - want| <= 4 * 2^-23 * |want| (kNormRel = 4.8e-7). A wrong element, row or eps is off by >= 1e-3.
// * RMSNorm / SwiGLU bf16 out: the same f32 value rounded to nearest even, so bit-equal to f32_to_bf16 of the
//   f32 output of the same kernel (checked bitwise).
// * SwiGLU (f32 out): device expf and IEEE division vs the host's expf: expf differs by <= 2 ulp (CUDA
//   guide), the division and product add one rounding each: bound 8 ulp (kSwiGluRel = 2^-20).
// * Products (GEMV, autotuned Gemm) against an f64 CPU reference of the same bf16 inputs: every bf16 x bf16
//   product is exact in f32 (8 + 8 significant bits), so the only error is the f32 summation: with K terms
//   of random sign and magnitude the rounding errors add like a random walk of ~K steps of u |partial sum|
//   (u = 2^-24, |partial sum| ~ sqrt(K) sigma^2), error ~ K u sigma^2 against |y| ~ sqrt(K) sigma^2: relative
//   sqrt(K) u = 4e-6 for K = 4096, nmse ~ K u^2 = 1.5e-11; split-K and tree orders do better. Bound nmse
//   1e-9 (kProductNmse, > 60x margin). A missing or repeated 8-element chunk of K = 4096 gives nmse ~ 8 / 4096
//   = 2e-3; a wrong column or row ~ 2.
// * Gate/up + SwiGLU (bf16 out) against bf16(silu(g) u) of the f64 sums g, u (above kGemmTuneMaxRows rows, of
//   g and u rounded to bf16 as the product writes them, bound 2^-6 relative): the sums' f32 error (relative
//   ~4e-6, above) and silu's few ulp move the f32 value by far less than a bf16 ulp, but may move it across a
//   rounding boundary: at most 1 bf16 ulp (relative 2^-8) apart, plus an absolute floor of 1e-4 x the rms of
//   the outputs for values near 0 (where the relative error of g or u is large). The fused GEMV must equal
//   the unfused pair (gemv_bf16 into gu, then the SwiGLU kernel) bitwise: the same sums, the same silu_mul.
// * bf16-input vs f32-input Gemm on bf16-exact x: the f32 path rounds x to bf16 exactly (no change), then
//   runs the same tuned choice (the key's pointer alignments are equal: every buffer is a cudaMalloc, 256-byte
//   aligned), and cuBLAS / the GEMV are deterministic for a fixed algorithm and device: bitwise equal.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda_check.h"
#include "model/cuda/gemm.h"
#include "kernels/gemv.h"
#include "kernels/model_kernels.h"
#include "gpu_test_util.h"
#include "retroinfer/cuda_backend.h"
#include "retroinfer/dtype.h"
#include "retroinfer/error.h"

namespace retroinfer {
namespace {

using cuda::DeviceBuffer;

constexpr double kNormRel = 4.8e-7;
constexpr double kSwiGluRel = 9.6e-7;  // 2^-20
constexpr double kProductNmse = 1e-9;

std::vector<float> random_f32(size_t n, uint64_t seed, float mean = 0.0f, float sd = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(mean, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Random values rounded to bf16 (bits).
std::vector<uint16_t> random_bf16(size_t n, uint64_t seed, float sd = 1.0f) {
  std::vector<float> f = random_f32(n, seed, 0.0f, sd);
  std::vector<uint16_t> b(n);
  for (size_t i = 0; i < n; ++i) b[i] = f32_to_bf16(f[i]);
  return b;
}

template <typename T>
DeviceBuffer upload(const std::vector<T>& v, size_t extra_bytes = 0) {
  DeviceBuffer d(v.size() * sizeof(T) + extra_bytes);
  d.upload(v.data(), v.size() * sizeof(T));
  return d;
}

template <typename T>
std::vector<T> download(const DeviceBuffer& d, size_t count, size_t offset_bytes = 0) {
  std::vector<T> v(count);
  d.download(v.data(), count * sizeof(T), offset_bytes);
  return v;
}

// The CPU runner's RMSNorm (src/model/session.cpp), rows of stride `stride`.
std::vector<float> rms_norm_ref(const std::vector<float>& x, const std::vector<float>& w, int64_t rows, int64_t h,
                                int64_t stride, float eps) {
  std::vector<float> y(static_cast<size_t>(rows * h));
  for (int64_t t = 0; t < rows; ++t) {
    const float* xr = x.data() + t * stride;
    double ss = 0.0;
    for (int64_t i = 0; i < h; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float r = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(h)) + eps);
    for (int64_t i = 0; i < h; ++i) y[t * h + i] = w[i] * (xr[i] * r);
  }
  return y;
}

// Runs rms_norm on rows x hidden (row stride `stride`, x offset by `x_off` floats to test misalignment) with
// both outputs; checks f32 against the reference and bf16 bitwise against the f32 output.
void check_rms_norm(int64_t rows, int64_t h, int64_t stride, int64_t x_off, bool expect_vec) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " hidden " << h << " stride " << stride << " x_off " << x_off);
  const float eps = 1e-5f;
  const std::vector<float> x = random_f32(static_cast<size_t>(rows * stride + x_off), 11 + rows * 7 + h, 0.3f, 2.0f);
  const std::vector<float> w = random_f32(static_cast<size_t>(h), 5 + h, 1.0f, 0.1f);
  DeviceBuffer dx = upload(x), dw = upload(w), dy(static_cast<size_t>(rows * h) * 4),
               db(static_cast<size_t>(rows * h) * 2);
  dy.fill_bytes(0xff);
  db.fill_bytes(0xff);
  cuda::model::RmsNormParams p;
  p.x = dx.as<float>() + x_off;
  p.w = dw.as<float>();
  p.y = dy.as<float>();
  p.y_bf16 = db.as<uint16_t>();
  p.rows = rows;
  p.hidden = h;
  p.x_stride = stride;
  p.eps = eps;
  EXPECT_EQ(cuda::model::rms_norm_vectorised(p), expect_vec);
  cuda::detail::launch_check(cuda::model::rms_norm(p, nullptr), "rms_norm", nullptr);
  cuda::synchronize();
  const std::vector<float> xin(x.begin() + x_off, x.end());
  const std::vector<float> want = rms_norm_ref(xin, w, rows, h, stride, eps);
  const std::vector<float> got = download<float>(dy, want.size());
  const std::vector<uint16_t> gotb = download<uint16_t>(db, want.size());
  double worst = 0.0;
  int64_t bad = 0, bf16_bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double err = std::fabs(double(got[i]) - want[i]);
    const double bound = kNormRel * std::fabs(want[i]) + 1e-30;
    worst = std::max(worst, err / (std::fabs(want[i]) + 1e-30));
    if (!(err <= bound)) ++bad;
    if (gotb[i] != f32_to_bf16(got[i])) ++bf16_bad;
  }
  EXPECT_EQ(bad, 0) << "elements beyond " << kNormRel << " relative";
  EXPECT_EQ(bf16_bad, 0) << "bf16 outputs differing from the rounded f32 output";
  std::printf("[rms_norm] rows %lld hidden %lld stride %lld x_off %lld %s: max rel err %.2e (bound %.1e), bf16 "
              "mismatches %lld\n",
              (long long)rows, (long long)h, (long long)stride, (long long)x_off, expect_vec ? "vectorised" : "scalar",
              worst, kNormRel, (long long)bf16_bad);
}

TEST(CudaModelKernels, RmsNormAgainstCpu) {
  RETROINFER_REQUIRE_GPU();
  for (int64_t rows : {1, 3, 4, 7, 16, 1000})
    for (int64_t h : {64, 128, 2048, 4096, 5120, 8192}) {
      if (rows == 1000 && h > 4096) continue;  // keeps the test short; 4096 covers the many-row grid
      check_rms_norm(rows, h, h, 0, true);
    }
  // Widths without a float4 multiple, misaligned x, a row stride wider than the row, beyond the vector limit.
  check_rms_norm(4, 4098, 4098, 0, false);
  check_rms_norm(3, 67, 67, 0, false);
  check_rms_norm(4, 4096, 4096, 1, false);
  check_rms_norm(7, 4096, 4100, 0, true);
  check_rms_norm(5, 4096, 4098, 0, false);
  check_rms_norm(2, cuda::model::kRmsNormMaxVecHidden + 4, cuda::model::kRmsNormMaxVecHidden + 4, 0, false);
  check_rms_norm(2, cuda::model::kRmsNormMaxVecHidden, cuda::model::kRmsNormMaxVecHidden, 0, true);
}

void check_swiglu(int64_t rows, int64_t inter) {
  SCOPED_TRACE(testing::Message() << "rows " << rows << " inter " << inter);
  const std::vector<float> gu = random_f32(static_cast<size_t>(rows * 2 * inter), 3 + inter, 0.0f, 3.0f);
  DeviceBuffer dgu = upload(gu), da(static_cast<size_t>(rows * inter) * 4), db(static_cast<size_t>(rows * inter) * 2);
  da.fill_bytes(0xff);
  db.fill_bytes(0xff);
  cuda::model::SwiGluParams p;
  p.gu = dgu.as<float>();
  p.act = da.as<float>();
  p.act_bf16 = db.as<uint16_t>();
  p.rows = rows;
  p.inter = inter;
  cuda::detail::launch_check(cuda::model::swiglu(p, nullptr), "swiglu", nullptr);
  cuda::synchronize();
  const std::vector<float> got = download<float>(da, static_cast<size_t>(rows * inter));
  const std::vector<uint16_t> gotb = download<uint16_t>(db, got.size());
  int64_t bad = 0, bf16_bad = 0;
  double worst = 0.0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < inter; ++i) {
      const float g = gu[r * 2 * inter + i], u = gu[r * 2 * inter + inter + i];
      const double want = double(g / (1.0f + std::exp(-g))) * u;
      const float v = got[r * inter + i];
      const double err = std::fabs(v - want), rel = err / (std::fabs(want) + 1e-30);
      worst = std::max(worst, rel);
      if (!(err <= kSwiGluRel * std::fabs(want) + 1e-37)) ++bad;
      if (gotb[r * inter + i] != f32_to_bf16(v)) ++bf16_bad;
    }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(bf16_bad, 0);

  // gate/up in bf16 (the prefill products' output): the kernel widens each value exactly, so it must equal
  // the f32 path run on the widened values, bitwise.
  std::vector<uint16_t> gu16(gu.size());
  std::vector<float> gu_wide(gu.size());
  for (size_t i = 0; i < gu.size(); ++i) {
    gu16[i] = f32_to_bf16(gu[i]);
    gu_wide[i] = bf16_to_f32(gu16[i]);
  }
  DeviceBuffer dgu16 = upload(gu16), dwide = upload(gu_wide), dref(static_cast<size_t>(rows * inter) * 2);
  p.act = nullptr;
  p.gu = dwide.as<float>();
  p.act_bf16 = dref.as<uint16_t>();
  cuda::detail::launch_check(cuda::model::swiglu(p, nullptr), "swiglu", nullptr);
  p.gu = nullptr;
  p.gu_bf16 = dgu16.as<uint16_t>();
  p.act_bf16 = db.as<uint16_t>();
  db.fill_bytes(0xff);
  cuda::detail::launch_check(cuda::model::swiglu(p, nullptr), "swiglu(bf16 gate/up)", nullptr);
  cuda::synchronize();
  EXPECT_EQ(download<uint16_t>(db, got.size()), download<uint16_t>(dref, got.size()))
      << "SwiGLU of bf16 gate/up differs from SwiGLU of the same values in f32";
  p.gu = dwide.as<float>();  // both inputs: refused
  EXPECT_EQ(cuda::model::swiglu(p, nullptr), cudaErrorInvalidValue);
  std::printf("[swiglu] rows %lld inter %lld: max rel err %.2e (bound %.1e), bf16 mismatches %lld; bf16 gate/up "
              "equal to its widened f32\n",
              (long long)rows, (long long)inter, worst, kSwiGluRel, (long long)bf16_bad);
}

TEST(CudaModelKernels, SwiGluAgainstCpu) {
  RETROINFER_REQUIRE_GPU();
  check_swiglu(4, 14336);  // vectorised
  check_swiglu(3, 1003);   // scalar tail
  check_swiglu(300, 512);
}

// f64 reference sums s[m, n] = sum_k x[m, k] W[n, k] (bf16 inputs), rows [0, rows).
std::vector<double> sums_ref(const std::vector<uint16_t>& x, const std::vector<uint16_t>& w, int64_t rows, int64_t in,
                             int64_t out) {
  std::vector<float> xf(static_cast<size_t>(rows * in)), wf(w.size());
  for (size_t i = 0; i < xf.size(); ++i) xf[i] = bf16_to_f32(x[i]);
  for (size_t i = 0; i < w.size(); ++i) wf[i] = bf16_to_f32(w[i]);
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t n = 0; n < out; ++n) {
      double s = 0.0;
      const float* a = xf.data() + m * in;
      const float* b = wf.data() + n * in;
      for (int64_t k = 0; k < in; ++k) s += double(a[k]) * b[k];
      y[m * out + n] = s;
    }
  return y;
}

// The expected y of rows [0, rows): sums + beta * y0 (the first rows * out entries, row-major [rows, out]).
std::vector<double> expected(const std::vector<double>& sums, const std::vector<float>& y0, int64_t rows, int64_t out,
                             float beta) {
  std::vector<double> y(static_cast<size_t>(rows * out));
  for (size_t i = 0; i < y.size(); ++i) y[i] = sums[i] + (beta != 0.0f ? double(beta) * y0[i] : 0.0);
  return y;
}

double nmse(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  if (!std::isfinite(num)) return INFINITY;
  return den > 0 ? num / den : num;
}

TEST(CudaModelKernels, GemvAgainstCpu) {
  RETROINFER_REQUIRE_GPU();
  for (int64_t in : {4096, 1032})
    for (int64_t out : {257, 1024}) {
      const std::vector<uint16_t> w = random_bf16(static_cast<size_t>(out * in), 21 + in + out);
      const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(cuda::model::kGemvMaxRows * in), 22 + in);
      const std::vector<float> y0 = random_f32(static_cast<size_t>(cuda::model::kGemvMaxRows * out), 23 + out);
      // x_f32: the unrounded values behind x (random_bf16 rounds the same draws), for the f32-input variant.
      const std::vector<float> x_f32 = random_f32(x.size(), 22 + in);
      DeviceBuffer dw = upload(w), dx = upload(x), dxf = upload(x_f32), dy(y0.size() * 4), dy2(y0.size() * 4);
      const std::vector<double> sums = sums_ref(x, w, cuda::model::kGemvMaxRows, in, out);
      for (int64_t rows = 1; rows <= cuda::model::kGemvMaxRows; ++rows) {
        double worst = 0.0;
        for (int cols : {1, 2, 4})
          for (float beta : {0.0f, 1.0f}) {
            SCOPED_TRACE(testing::Message() << "rows " << rows << " in " << in << " out " << out << " cols " << cols
                                            << " beta " << beta);
            if (beta == 0.0f) dy.fill_bytes(0xff);  // NaN: beta 0 must not read y
            else dy.upload(y0.data(), y0.size() * 4);
            cuda::model::GemvParams p;
            p.w = dw.as<uint16_t>();
            p.x = dx.as<uint16_t>();
            p.y = dy.as<float>();
            p.rows = rows;
            p.in = in;
            p.out = out;
            p.beta = beta;
            ASSERT_TRUE(cuda::model::gemv_supported(p));
            cuda::detail::launch_check(cuda::model::gemv_bf16(p, cols, nullptr), "gemv_bf16", nullptr);
            cuda::synchronize();
            const std::vector<float> got = download<float>(dy, static_cast<size_t>(rows * out));
            const double e = nmse(got, expected(sums, y0, rows, out, beta));
            EXPECT_LE(e, kProductNmse);
            worst = std::max(worst, e);
            // The f32-input variant rounds x as it loads it: bit-identical.
            if (beta == 0.0f) dy2.fill_bytes(0xff);
            else dy2.upload(y0.data(), y0.size() * 4);
            p.x = nullptr;
            p.x_f32 = dxf.as<float>();
            p.y = dy2.as<float>();
            ASSERT_TRUE(cuda::model::gemv_supported(p));
            cuda::detail::launch_check(cuda::model::gemv_bf16(p, cols, nullptr), "gemv_bf16(f32 x)", nullptr);
            cuda::synchronize();
            const std::vector<float> got2 = download<float>(dy2, got.size());
            EXPECT_EQ(std::memcmp(got.data(), got2.data(), got.size() * 4), 0) << "f32-input GEMV differs";
          }
        std::printf("[gemv] rows %lld in %lld out %lld, cols 1/2/4, beta 0/1: worst nmse %.2e (bound %.0e); f32-x "
                    "variant checked bitwise\n",
                    (long long)rows, (long long)in, (long long)out, worst, kProductNmse);
      }
    }
  // Refused shapes: rows beyond the limit, K not a multiple of 8, misaligned x.
  DeviceBuffer b(1 << 16);
  cuda::model::GemvParams p;
  p.w = b.as<uint16_t>();
  p.x = b.as<uint16_t>();
  p.y = b.as<float>();
  p.rows = cuda::model::kGemvMaxRows + 1;
  p.in = 64;
  p.out = 8;
  EXPECT_FALSE(cuda::model::gemv_supported(p));
  EXPECT_EQ(cuda::model::gemv_bf16(p, 1, nullptr), cudaErrorInvalidValue);
  p.rows = 2;
  p.in = 60;
  EXPECT_FALSE(cuda::model::gemv_supported(p));
  p.in = 64;
  p.x = b.as<uint16_t>() + 1;
  EXPECT_FALSE(cuda::model::gemv_supported(p));
  p.x = b.as<uint16_t>();
  EXPECT_TRUE(cuda::model::gemv_supported(p));
  EXPECT_EQ(cuda::model::gemv_bf16(p, 3, nullptr), cudaErrorInvalidValue);
}

// bf16(silu(g) * u) from the f64 sums [rows, 2 inter] (gate columns, then up), as float.
// bf16(silu(g) u) of the f64 sums g, u; bf16_gate_up: g and u rounded to bf16 first (linear_swiglu's
// product output above kGemmTuneMaxRows rows).
std::vector<double> swiglu_expected(const std::vector<double>& sums, int64_t rows, int64_t inter,
                                    bool bf16_gate_up = false) {
  std::vector<double> a(static_cast<size_t>(rows * inter));
  auto round = [&](double v) {
    const float f = static_cast<float>(v);
    return bf16_gate_up ? bf16_to_f32(f32_to_bf16(f)) : f;
  };
  for (int64_t m = 0; m < rows; ++m)
    for (int64_t n = 0; n < inter; ++n) {
      const float g = round(sums[m * 2 * inter + n]), u = round(sums[m * 2 * inter + inter + n]);
      a[m * inter + n] = bf16_to_f32(f32_to_bf16(g / (1.0f + std::exp(-g)) * u));
    }
  return a;
}

// Elements of got (bf16) beyond 2^rel_exp relative + 3e-3 x rms(want) of want; the worst relative error in
// *worst.
int64_t swiglu_mismatches(const std::vector<uint16_t>& got, const std::vector<double>& want, double* worst,
                          int rel_exp = -7) {
  double ss = 0.0;
  for (double v : want) ss += v * v;
  // Relative 2^-7 (2 bf16 ulps) plus an absolute floor 3e-3 x rms: near g = 0 or u = 0 the product's
  // relative error is the f32 sums' error over a small value (cuBLAS products measured 2 bf16 ulps, 7.2e-3
  // relative, on 1-2 elements of 1536 x 16 on the H200, above the floor). A wrong column or
  // row is off by ~rms; a missing 8-element chunk of K = 2048 by ~sqrt(8 / 2048) = 6e-2 x rms.
  const double floor = 3e-3 * std::sqrt(ss / std::max<size_t>(1, want.size()));
  int64_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = bf16_to_f32(got[i]), err = std::fabs(g - want[i]);
    if (!(err <= std::ldexp(std::fabs(want[i]), rel_exp) + floor)) ++bad;
    *worst = std::max(*worst, err / (std::fabs(want[i]) + floor));
  }
  return bad;
}

TEST(CudaModelKernels, GemvSwiGluFusedMatchesUnfused) {
  RETROINFER_REQUIRE_GPU();
  for (int64_t inter : {1024, 333}) {
    const int64_t in = 2048, rows_max = cuda::model::kGemvMaxRows;
    const std::vector<uint16_t> w = random_bf16(static_cast<size_t>(2 * inter * in), 41 + inter, 0.05f);
    const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(rows_max * in), 42);
    const std::vector<double> sums = sums_ref(x, w, rows_max, in, 2 * inter);
    DeviceBuffer dw = upload(w), dx = upload(x), dgu(static_cast<size_t>(rows_max * 2 * inter) * 4),
                 dact(static_cast<size_t>(rows_max * inter) * 2), dfused(static_cast<size_t>(rows_max * inter) * 2);
    for (int64_t rows = 1; rows <= rows_max; ++rows) {
      SCOPED_TRACE(testing::Message() << "rows " << rows << " inter " << inter);
      // Unfused: the GEMV into gu, then the SwiGLU kernel.
      cuda::model::GemvParams p;
      p.w = dw.as<uint16_t>();
      p.x = dx.as<uint16_t>();
      p.y = dgu.as<float>();
      p.rows = rows;
      p.in = in;
      p.out = 2 * inter;
      cuda::detail::launch_check(cuda::model::gemv_bf16(p, 1, nullptr), "gemv_bf16", nullptr);
      cuda::model::SwiGluParams sp;
      sp.gu = dgu.as<float>();
      sp.act_bf16 = dact.as<uint16_t>();
      sp.rows = rows;
      sp.inter = inter;
      cuda::detail::launch_check(cuda::model::swiglu(sp, nullptr), "swiglu", nullptr);
      cuda::synchronize();
      const std::vector<uint16_t> unfused = download<uint16_t>(dact, static_cast<size_t>(rows * inter));
      double worst = 0.0;
      EXPECT_EQ(swiglu_mismatches(unfused, swiglu_expected(sums, rows, inter), &worst), 0);
      for (int cols : {1, 2}) {
        dfused.fill_bytes(0xff);
        cuda::model::GemvParams f;
        f.w = dw.as<uint16_t>();
        f.x = dx.as<uint16_t>();
        f.act_bf16 = dfused.as<uint16_t>();
        f.rows = rows;
        f.in = in;
        f.out = inter;
        ASSERT_TRUE(cuda::model::gemv_swiglu_supported(f));
        cuda::detail::launch_check(cuda::model::gemv_swiglu_bf16(f, cols, nullptr), "gemv_swiglu_bf16", nullptr);
        cuda::synchronize();
        const std::vector<uint16_t> fused = download<uint16_t>(dfused, unfused.size());
        EXPECT_EQ(fused, unfused) << "fused gate/up + SwiGLU GEMV (cols " << cols << ") differs from the unfused pair";
      }
      std::printf("[gemv_swiglu] rows %lld in %lld inter %lld: unfused vs f64 worst rel %.2e (bound 2^-7 + floor); "
                  "fused cols 1/2 bitwise equal to unfused\n",
                  (long long)rows, (long long)in, (long long)inter, worst);
    }
  }
}

TEST(CudaModelKernels, GemmSwiGluTunedAgainstCpu) {
  RETROINFER_REQUIRE_GPU();
  const int64_t in = 2048, inter = 1536, max_rows = 33;
  const std::vector<uint16_t> w = random_bf16(static_cast<size_t>(2 * inter * in), 51, 0.05f);
  const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(max_rows * in), 52);
  const std::vector<double> sums = sums_ref(x, w, max_rows, in, 2 * inter);
  DeviceBuffer dw = upload(w), dx = upload(x), dgu(static_cast<size_t>(max_rows * 2 * inter) * 4),
               dact(static_cast<size_t>(max_rows * inter) * 2);
  cuda::model::Gemm gemm(true, 0);
  for (int64_t rows : {1, 2, 4, 5, 8, 9, 16, 17, 33}) {
    SCOPED_TRACE(testing::Message() << "rows " << rows);
    const cuda::model::GemmChoice ch = gemm.choice_swiglu(dx.as<uint16_t>(), rows, in, dw.data(), inter,
                                                          dgu.as<float>(), dact.as<uint16_t>(), nullptr);
    dact.fill_bytes(0xff);
    gemm.linear_swiglu(dx.as<uint16_t>(), rows, in, dw.data(), inter, dgu.as<float>(), dact.as<uint16_t>(), nullptr);
    cuda::synchronize();
    const std::vector<uint16_t> got = download<uint16_t>(dact, static_cast<size_t>(rows * inter));
    double worst = 0.0;
    // Above kGemmTuneMaxRows the product writes bf16 gate/up: the f32 sums may straddle a bf16 rounding
    // boundary of g or u (1 ulp, 2^-8, times silu's relative slope <= 1.28) before the output's own
    // boundary (2^-8): bound 2^-6.
    const bool bf16_gate_up = rows > cuda::model::kGemmTuneMaxRows;
    const int rel_exp = bf16_gate_up ? -6 : -7;
    EXPECT_EQ(swiglu_mismatches(got, swiglu_expected(sums, rows, inter, bf16_gate_up), &worst, rel_exp), 0);
    std::printf("[gemm_swiglu] rows %lld in %lld inter %lld: %s (%.2f us tuned); worst rel %.2e (bound 2^%d + "
                "floor)\n",
                (long long)rows, (long long)in, (long long)inter, ch.name.c_str(), ch.us, worst, rel_exp);
  }
}

// The autotuned Gemm (bf16 input) against the f64 reference, and the f32-input path against the bf16-input
// path, for decode row counts (tuned) and a prefill one (cublasGemmEx); K = 1001 leaves the GEMV out (K % 8)
// and misaligns the rows of x and W for cuBLASLt.
TEST(CudaModelKernels, GemmTunedAgainstCpu) {
  RETROINFER_REQUIRE_GPU();
  struct Shape {
    int64_t in, out;
  };
  for (const Shape sh : {Shape{4096, 1536}, Shape{1024, 4096}, Shape{1000, 333}, Shape{1001, 77}}) {
    const int64_t max_rows = 33;
    const std::vector<uint16_t> w = random_bf16(static_cast<size_t>(sh.out * sh.in), 31 + sh.in);
    const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(max_rows * sh.in), 32 + sh.out);
    std::vector<float> xf(x.size());
    for (size_t i = 0; i < x.size(); ++i) xf[i] = bf16_to_f32(x[i]);
    const std::vector<float> y0 = random_f32(static_cast<size_t>(max_rows * sh.out), 33);
    DeviceBuffer dw = upload(w), dx = upload(x), dxf = upload(xf), dy(y0.size() * 4), dy2(y0.size() * 4);
    const std::vector<double> sums = sums_ref(x, w, max_rows, sh.in, sh.out);
    cuda::model::Gemm gemm(true, max_rows * sh.in);
    for (int64_t rows : {1, 2, 3, 4, 7, 8, 9, 16, 33})
      for (float beta : {0.0f, 1.0f}) {
        SCOPED_TRACE(testing::Message() << "rows " << rows << " in " << sh.in << " out " << sh.out << " beta " << beta);
        dy.upload(y0.data(), y0.size() * 4);
        dy2.upload(y0.data(), y0.size() * 4);
        const cuda::model::GemmChoice ch =
            gemm.choice(dx.as<uint16_t>(), rows, sh.in, dw.data(), sh.out, dy.as<float>(), beta, nullptr);
        gemm.linear(dx.as<uint16_t>(), rows, sh.in, dw.data(), sh.out, dy.as<float>(), beta, nullptr);
        gemm.linear(dxf.as<float>(), rows, sh.in, dw.data(), sh.out, dy2.as<float>(), beta, nullptr);
        cuda::synchronize();
        const std::vector<float> got = download<float>(dy, static_cast<size_t>(rows * sh.out));
        const std::vector<float> got2 = download<float>(dy2, got.size());
        const std::vector<double> want = expected(sums, y0, rows, sh.out, beta);
        const double e = nmse(got, want), e2 = nmse(got2, want);
        std::vector<double> gd(got.begin(), got.end());
        const double between = nmse(got2, gd);
        EXPECT_LE(e, kProductNmse);
        EXPECT_LE(e2, kProductNmse);
        EXPECT_EQ(between, 0.0) << "the f32-input and bf16-input paths must run the same product";
        std::printf("[gemm] rows %lld in %lld out %lld beta %.0f: %s (%.2f us tuned); nmse bf16-in %.2e, f32-in "
                    "%.2e, between %.2e (bound %.0e)\n",
                    (long long)rows, (long long)sh.in, (long long)sh.out, beta, ch.name.c_str(), ch.us, e, e2, between,
                    kProductNmse);
      }
  }
}

// Prefill row counts (> kGemmTuneMaxRows): gemm_ex until tune() / tune_swiglu() times the shape, then the
// timed choice (a cuBLASLt algorithm or gemm_ex); the products stay within the same bounds either way.
TEST(CudaModelKernels, GemmPrefillRowsTunedAgainstCpu) {
  RETROINFER_REQUIRE_GPU();
  const int64_t rows = 64, in = 2048, out = 1536, inter = 768;
  const std::vector<uint16_t> w = random_bf16(static_cast<size_t>(out * in), 61, 0.05f);
  const std::vector<uint16_t> x = random_bf16(static_cast<size_t>(rows * in), 62);
  const std::vector<float> y0 = random_f32(static_cast<size_t>(rows * out), 63);
  const std::vector<double> sums = sums_ref(x, w, rows, in, out);
  DeviceBuffer dw = upload(w), dx = upload(x), dy(y0.size() * 4), dact(static_cast<size_t>(rows * inter) * 2);
  cuda::model::Gemm gemm(true, 0);
  const void* ws[1] = {dw.data()};
  for (float beta : {0.0f, 1.0f}) {
    SCOPED_TRACE(testing::Message() << "beta " << beta);
    const cuda::model::GemmChoice before =
        gemm.choice(dx.as<uint16_t>(), rows, in, dw.data(), out, dy.as<float>(), beta, nullptr);
    EXPECT_EQ(before.name, "gemm_ex");
    EXPECT_EQ(before.us, 0.0f);
    gemm.tune(dx.as<uint16_t>(), rows, in, ws, out, dy.as<float>(), beta, nullptr);
    const cuda::model::GemmChoice after =
        gemm.choice(dx.as<uint16_t>(), rows, in, dw.data(), out, dy.as<float>(), beta, nullptr);
    EXPECT_GT(after.us, 0.0f) << "tune() must time a prefill shape";
    dy.upload(y0.data(), y0.size() * 4);
    gemm.linear(dx.as<uint16_t>(), rows, in, dw.data(), out, dy.as<float>(), beta, nullptr);
    cuda::synchronize();
    const double e = nmse(download<float>(dy, y0.size()), expected(sums, y0, rows, out, beta));
    EXPECT_LE(e, kProductNmse);
    std::printf("[gemm prefill] rows %lld in %lld out %lld beta %.0f: %s untuned, %s tuned (%.2f us); nmse %.2e "
                "(bound %.0e)\n",
                (long long)rows, (long long)in, (long long)out, beta, before.name.c_str(), after.name.c_str(),
                after.us, e, kProductNmse);
  }
  // Gate/up (2 inter = out rows of w) + SwiGLU: the bf16-output product, tuned.
  gemm.tune_swiglu(dx.as<uint16_t>(), rows, in, ws, inter, dy.as<float>(), dact.as<uint16_t>(), nullptr);
  const cuda::model::GemmChoice ch =
      gemm.choice_swiglu(dx.as<uint16_t>(), rows, in, dw.data(), inter, dy.as<float>(), dact.as<uint16_t>(), nullptr);
  EXPECT_GT(ch.us, 0.0f);
  EXPECT_NE(ch.name.find("(bf16 out) + swiglu"), std::string::npos) << ch.name;
  dact.fill_bytes(0xff);
  gemm.linear_swiglu(dx.as<uint16_t>(), rows, in, dw.data(), inter, dy.as<float>(), dact.as<uint16_t>(), nullptr);
  cuda::synchronize();
  double worst = 0.0;
  EXPECT_EQ(swiglu_mismatches(download<uint16_t>(dact, static_cast<size_t>(rows * inter)),
                              swiglu_expected(sums, rows, inter, true), &worst, -6),
            0);
  std::printf("[gemm prefill] gate/up + swiglu rows %lld: %s (%.2f us); worst rel %.2e (bound 2^-6 + floor)\n",
              (long long)rows, ch.name.c_str(), ch.us, worst);
}

TEST(CudaModelKernels, GemmBf16InputNeedsBf16Weights) {
  RETROINFER_REQUIRE_GPU();
  cuda::model::Gemm gemm(false, 0);
  DeviceBuffer b(4096);
  EXPECT_THROW(gemm.linear(b.as<uint16_t>(), 1, 8, b.data(), 8, b.as<float>(), 0.0f, nullptr), Error);
  std::printf("[gemm] f32-weight Gemm refuses a bf16 input\n");
}

}  // namespace
}  // namespace retroinfer

namespace retroinfer {
namespace {

// argmax_rows: the greedy pick on the GPU, against a CPU scan with the same rule (larger value, ties to the
// lower index, NaN never wins, -1 for a row without a number); vectorised rows (vocab % 4 == 0: Llama-3's
// 128256, SmolLM2's 49152) and the scalar path (an odd vocabulary).
TEST(CudaModelKernels, ArgmaxRowsAgainstCpu) {
  RETROINFER_REQUIRE_GPU();
  for (const int64_t vocab : {int64_t{128256}, int64_t{49152}, int64_t{1003}}) {
    const int64_t rows = 6;
    std::vector<float> lg = random_f32(static_cast<size_t>(rows * vocab), 77 + vocab);
    // row 1: a tie between two far-apart maxima (the lower index must win); row 2: NaNs before the max;
    // row 3: all NaN; row 4: the max in the last element; row 5: all equal (index 0 wins).
    lg[1 * vocab + vocab - 7] = lg[1 * vocab + 5] = 100.0f;
    for (int64_t i = 0; i < vocab; i += 3) lg[2 * vocab + i] = NAN;
    lg[2 * vocab + 4] = 50.0f;
    for (int64_t i = 0; i < vocab; ++i) lg[3 * vocab + i] = NAN;
    lg[4 * vocab + vocab - 1] = 1e30f;
    for (int64_t i = 0; i < vocab; ++i) lg[5 * vocab + i] = -2.5f;
    std::vector<int32_t> want(rows, -1);
    for (int64_t r = 0; r < rows; ++r) {
      float bv = 0.0f;
      for (int64_t i = 0; i < vocab; ++i) {
        const float v = lg[r * vocab + i];
        if (!std::isnan(v) && (want[r] < 0 || v > bv)) {
          bv = v;
          want[r] = static_cast<int32_t>(i);
        }
      }
    }
    DeviceBuffer dl(lg.size() * 4), dn(rows * 4);
    dl.upload(lg.data(), lg.size() * 4);
    dn.fill_bytes(0xff);
    cuda::model::ArgmaxParams p;
    p.logits = dl.as<float>();
    p.next = dn.as<int32_t>();
    p.rows = rows;
    p.vocab = vocab;
    cuda::detail::launch_check(cuda::model::argmax_rows(p, nullptr), "argmax_rows", nullptr);
    std::vector<int32_t> got(rows);
    dn.download(got.data(), rows * 4);
    EXPECT_EQ(got, want) << "vocab " << vocab;
    EXPECT_EQ(got[1], 5);
    EXPECT_EQ(got[3], -1);
    EXPECT_EQ(got[5], 0);
    std::printf("[argmax rows] vocab %lld x %lld rows: %s\n", static_cast<long long>(vocab),
                static_cast<long long>(rows), got == want ? "equal to the CPU scan" : "DIFFERENT");
  }
}


// kv_append_rows (CudaJoinedDecoder): row r's K/V into its own cache at its position, bit for bit; a row with a
// null destination (its session keeps that layer on the host tier) writes nothing. Caches poisoned first.
TEST(CudaModelKernels, KvAppendRowsSkipsNullRows) {
  RETROINFER_REQUIRE_GPU();
  const int hkv = 2, d = 128, rows = 4;
  const int64_t stride = 37;
  const std::vector<int64_t> pos = {0, 36, 5, 17};
  const std::vector<bool> skip = {false, true, false, false};
  const std::vector<uint16_t> kn = random_bf16(size_t(rows) * hkv * d, 91), vn = random_bf16(size_t(rows) * hkv * d, 92);
  DeviceBuffer dk = upload(kn), dv = upload(vn);
  const size_t cache_elems = size_t(hkv) * stride * d;
  std::vector<DeviceBuffer> kc, vc;
  std::vector<cuda::model::KvAppendRow> dst(rows);
  for (int r = 0; r < rows; ++r) {
    kc.emplace_back(cache_elems * 2);
    vc.emplace_back(cache_elems * 2);
    kc.back().fill_bytes(0xff);
    vc.back().fill_bytes(0xff);
    if (!skip[r]) dst[r] = cuda::model::KvAppendRow{kc.back().as<uint16_t>(), vc.back().as<uint16_t>(), stride, pos[r]};
    else dst[r] = cuda::model::KvAppendRow{nullptr, nullptr, 0, pos[r]};
  }
  DeviceBuffer ddst = upload(dst);
  cuda::model::KvAppendParams p;
  p.k_new = dk.as<uint16_t>();
  p.v_new = dv.as<uint16_t>();
  p.dst = ddst.as<cuda::model::KvAppendRow>();
  p.rows = rows;
  p.num_heads_kv = hkv;
  p.head_dim = d;
  cuda::detail::launch_check(cuda::model::kv_append_rows(p, nullptr), "kv_append_rows", nullptr);
  cuda::synchronize();
  int64_t wrong = 0;
  for (int r = 0; r < rows; ++r) {
    const std::vector<uint16_t> gk = download<uint16_t>(kc[r], cache_elems), gv = download<uint16_t>(vc[r], cache_elems);
    for (int h = 0; h < hkv; ++h)
      for (int64_t t = 0; t < stride; ++t)
        for (int i = 0; i < d; ++i) {
          const size_t at = (size_t(h) * stride + t) * d + i, src = (size_t(r) * hkv + h) * d + i;
          const bool written = !skip[r] && t == pos[r];
          wrong += gk[at] != (written ? kn[src] : uint16_t{0xffff});
          wrong += gv[at] != (written ? vn[src] : uint16_t{0xffff});
        }
  }
  EXPECT_EQ(wrong, 0) << "elements other than the appended rows' bits (or the poison where nothing is appended)";
  std::printf("[kv_append_rows] %d rows (one skipped), Hkv %d, d %d: %s\n", rows, hkv, d,
              wrong == 0 ? "every row at its position, the skipped row's cache untouched" : "WRONG");
}
// qkv_post's bf16 q (the Hopper prefill kernel's input): each element its f32 q rounded to nearest even, bit for
// bit, with and without a bias; the f32 q equal with and without the bf16 copy.
TEST(CudaModelKernels, QkvPostBf16QIsTheRoundedQ) {
  RETROINFER_REQUIRE_GPU();
  const int hq = 6, hkv = 2, d = 128, rows = 37;
  const int64_t stride = 64;
  const int width = (hq + 2 * hkv) * d;
  const std::vector<float> qkv = random_f32(size_t(rows) * width, 71, 0.0f, 3.0f);
  const std::vector<float> bias = random_f32(size_t(width), 72, 0.0f, 0.5f);
  std::vector<float> cs(size_t(rows) * d / 2), sn(cs.size());
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < d / 2; ++i) {
      const double a = r * std::pow(10000.0, -2.0 * i / d);
      cs[size_t(r) * d / 2 + i] = float(std::cos(a));
      sn[size_t(r) * d / 2 + i] = float(std::sin(a));
    }
  std::vector<int32_t> seq(rows, 0), pos(rows);
  for (int r = 0; r < rows; ++r) pos[r] = r;
  DeviceBuffer dqkv = upload(qkv), dbias = upload(bias), dcos = upload(cs), dsin = upload(sn), dseq = upload(seq),
               dpos = upload(pos);
  DeviceBuffer kc(size_t(hkv) * stride * d * 2), vc(kc.bytes());
  for (const bool with_bias : {false, true}) {
    DeviceBuffer q32(size_t(rows) * hq * d * 4), q32_alone(q32.bytes()), q16(size_t(rows) * hq * d * 2);
    cuda::model::QkvPostParams p;
    p.qkv = dqkv.as<float>();
    p.bias = with_bias ? dbias.as<float>() : nullptr;
    p.cos = dcos.as<float>();
    p.sin = dsin.as<float>();
    p.row_seq = dseq.as<int32_t>();
    p.row_pos = dpos.as<int32_t>();
    p.k_cache = kc.as<uint16_t>();
    p.v_cache = vc.as<uint16_t>();
    p.rows = rows;
    p.kv_stride = stride;
    p.num_heads_q = hq;
    p.num_heads_kv = hkv;
    p.head_dim = d;
    p.q = q32_alone.as<float>();
    cuda::detail::launch_check(cuda::model::qkv_post(p, nullptr), "qkv_post", nullptr);
    p.q = q32.as<float>();
    p.q_bf16 = q16.as<uint16_t>();
    cuda::detail::launch_check(cuda::model::qkv_post(p, nullptr), "qkv_post", nullptr);
    cuda::synchronize();
    const std::vector<float> a = download<float>(q32, size_t(rows) * hq * d),
                             b = download<float>(q32_alone, size_t(rows) * hq * d);
    const std::vector<uint16_t> h = download<uint16_t>(q16, size_t(rows) * hq * d);
    int64_t wrong = 0, differ = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      wrong += h[i] != f32_to_bf16(a[i]);
      differ += std::memcmp(&a[i], &b[i], 4) != 0;
    }
    EXPECT_EQ(wrong, 0) << "bias " << with_bias;
    EXPECT_EQ(differ, 0) << "bias " << with_bias;
  }
}
}  // namespace
}  // namespace retroinfer
