// linear.h: the products of the CPU forward pass.
#include "model/linear.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <vector>

#include "model/quant_dot.h"

namespace retroinfer::model {
namespace {

// Loops go parallel only above this many multiply-adds: a parallel region costs a few microseconds (much more
// on an oversubscribed host), which a smaller product does not repay.
constexpr int64_t kParallelMin = 1 << 16;

// Dot products of one weight row w[in] with R activation rows x[R, in]: out[r] = sum_i w[i] * x[r, i].
// The sum has a fixed shape whatever R: 8 lane partial sums over blocks of 8 (i % 8), added in a fixed tree,
// then the tail in order. So a row's result does not depend on how many rows share the call (batched decode
// equals single decode bit for bit), while the weight element loaded once serves R rows (register blocking:
// the batch's gain once decode stops being memory-bound). The 8 lanes vectorise (2 SSE / 1 AVX register).
constexpr int kLanes = 8;
template <int R>
inline void dot_rows(const float* w, const float* x, int64_t in, float* out) {
  float acc[R][kLanes] = {};
  const int64_t body = in / kLanes * kLanes;
  for (int64_t i = 0; i < body; i += kLanes)
    for (int r = 0; r < R; ++r)
      for (int j = 0; j < kLanes; ++j) acc[r][j] += w[i + j] * x[r * in + i + j];
  for (int r = 0; r < R; ++r) {
    const float* a = acc[r];
    float sum = ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7]));
    for (int64_t i = body; i < in; ++i) sum += w[i] * x[r * in + i];
    out[r] = sum;
  }
}

// y[t, o] (row stride ldy) = x[t] . w[o] + beta * y[t, o] for t < n, o < out: each w row read once for all n
// rows (in blocks of 4 rows: dot_rows). One OpenMP loop over output rows, so decode uses a single threading
// runtime.
void matvec_rows(const float* x, const float* w, float* y, int64_t ldy, int64_t n, int64_t in, int64_t out,
                 float beta) {
  constexpr int kBlock = 4;  // rows per dot_rows call: 4 x 8 accumulators + the weights fit 16 SSE registers
#pragma omp parallel for schedule(static) if (out * in >= kParallelMin)
  for (int64_t o = 0; o < out; ++o) {
    const float* row = w + o * in;
    float acc[kBlock];
    for (int64_t t0 = 0; t0 < n; t0 += kBlock) {
      const int64_t m = std::min<int64_t>(kBlock, n - t0);
      const float* xs = x + t0 * in;
      switch (m) {
        case 4: dot_rows<4>(row, xs, in, acc); break;
        case 3: dot_rows<3>(row, xs, in, acc); break;
        case 2: dot_rows<2>(row, xs, in, acc); break;
        default: dot_rows<1>(row, xs, in, acc); break;
      }
      for (int64_t t = 0; t < m; ++t) {
        float& yo = y[(t0 + t) * ldy + o];
        yo = beta == 0.0f ? acc[t] : acc[t] + beta * yo;
      }
    }
  }
}

void sgemm(const float* x, const float* w, float* y, int64_t ldy, int64_t n, int64_t in, int64_t out, float beta) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(out),
              static_cast<int>(in), 1.0f, x, static_cast<int>(in), w, static_cast<int>(in), beta, y,
              static_cast<int>(ldy));
}

// The kernel of each weight type (those `has` accepts) on this processor, chosen once by the caller's static.
template <typename Kernel>
std::array<Kernel, 16> kernels_by_type(bool (*has)(WeightType), Kernel (*make)(WeightType, QuantIsa)) {
  std::array<Kernel, 16> k{};
  for (int i = 0; i <= static_cast<int>(WeightType::kQ6_K) && i < 16; ++i)
    if (has(static_cast<WeightType>(i))) k[i] = make(static_cast<WeightType>(i), best_quant_isa());
  return k;
}

RowDot kernel_for(WeightType t) {
  static const std::array<RowDot, 16> table = kernels_by_type<RowDot>(has_quant_kernel, row_dot_kernel);
  return table[static_cast<size_t>(t)];
}

GroupDot group_kernel_for(WeightType t) {
  static const std::array<GroupDot, 16> table = kernels_by_type<GroupDot>(has_group_layout, group_dot_kernel);
  return table[static_cast<size_t>(t)];
}

// Decode rows of a block part: x quantized once (a); each thread takes one contiguous range of weight rows (whole
// groups of a part in row groups) and multiplies it by the n activation rows in turn (the range, a few hundred
// KB, stays in L2 for the next row).
void quantized_rows(const Q8Rows& a, const WeightMatrix::Part& p, float* y, int64_t ldy, int64_t n, float beta) {
  const RowDot row_dot = p.grouped ? nullptr : kernel_for(p.type);
  const GroupDot group_dot = p.grouped ? group_kernel_for(p.type) : nullptr;
  const int64_t nb = a.blocks(), unit = p.grouped ? kGroupRows : 1, units = (p.rows + unit - 1) / unit;
#pragma omp parallel if (p.rows * a.cols >= kParallelMin)
  {
    const int64_t threads = omp_get_num_threads(), id = omp_get_thread_num();
    const int64_t lo = units * id / threads, hi = units * (id + 1) / threads;
    const int64_t r0 = lo * unit, r1 = std::min(hi * unit, p.rows);  // the part's rows [r0, r1)
    thread_local std::vector<float> out;
    out.resize(static_cast<size_t>((hi - lo) * unit));
    for (int64_t t = 0; t < n && lo < hi; ++t) {
      if (p.grouped)
        group_dot(p.group(lo), hi - lo, q8_row(a, t), nb, out.data());
      else
        row_dot(p.row(p.row0 + r0), p.row_bytes, r1 - r0, q8_row(a, t), nb, out.data());
      float* yt = y + t * ldy + r0;
      for (int64_t o = 0; o < r1 - r0; ++o) yt[o] = beta == 0.0f ? out[o] : out[o] + beta * yt[o];
    }
  }
}

// Prefill through a block part: tiles of rows widened to f32 (in parallel), then cblas_sgemm per tile.
void widened_gemm(const float* x, const WeightMatrix& w, const WeightMatrix::Part& p, float* y, int64_t ldy,
                  int64_t n, float beta) {
  const int64_t in = w.cols();
  const int64_t tile_rows = std::max<int64_t>(1, kWidenTileFloats / in);
  thread_local std::vector<float> tile;
  tile.resize(static_cast<size_t>(std::min(tile_rows, p.rows) * in));
  float* t = tile.data();
  for (int64_t r0 = 0; r0 < p.rows; r0 += tile_rows) {
    const int64_t rows = std::min(tile_rows, p.rows - r0);
#pragma omp parallel for schedule(static) if (rows * in >= kParallelMin)
    for (int64_t r = 0; r < rows; ++r) w.widen_rows(p.row0 + r0 + r, 1, t + r * in);
    sgemm(x, t, y + r0, ldy, n, in, rows, beta);
  }
}

}  // namespace

void linear(const float* x, const WeightMatrix& w, float* y, int64_t n, float beta, Gemm g) {
  const int64_t in = w.cols(), out = w.rows();
  const bool blas = g == Gemm::kBlas && n > 1;
  thread_local Q8Rows a;  // x in 8 bits, made once per call when a block part is multiplied row by row
  bool quantized = false;
  for (const WeightMatrix::Part& p : w.parts()) {
    float* yp = y + p.row0;
    if (p.type == WeightType::kF32) {
      if (blas)
        sgemm(x, p.f32_row(p.row0), yp, out, n, in, p.rows, beta);
      else
        matvec_rows(x, p.f32_row(p.row0), yp, out, n, in, p.rows, beta);
    } else if (blas) {
      widened_gemm(x, w, p, yp, out, n, beta);
    } else {
      if (!quantized) quantize_q8_rows(x, n, in, a);
      quantized = true;
      quantized_rows(a, p, yp, out, n, beta);
    }
  }
}

}  // namespace retroinfer::model
