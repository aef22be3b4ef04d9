// The quantized products of the CPU runner (model/quant_dot.h, model/linear.h): the 8-bit activation
// quantization, every kernel (scalar reference, AVX2, AVX-512 VNNI where the processor has them) against an
// exact double-precision sum, the SIMD kernels against the scalar ones, over block counts with tails; the
// products of mixed-type matrices (decode rows: one row equals the same row in a batch; prefill: the widened
// tiles equal an f32 sgemm).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "model/linear.h"
#include "model/quant_dot.h"
#include "model/weight_matrix.h"
#include "retroinfer/dtype.h"
#include "retroinfer/error.h"
#include "retroinfer/model_file.h"

namespace retroinfer::model {
namespace {

constexpr double kU = 1.0 / (1 << 24);  // unit roundoff of f32

const WeightType kBlockTypes[] = {WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_1, WeightType::kQ5_0,
                                  WeightType::kQ5_1, WeightType::kQ4_K, WeightType::kQ5_K, WeightType::kQ6_K};

void put_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

// Byte offsets of a block's f16 scale (d) and min (m, -1 when the type has none).
struct Fields {
  int d, m;
};
Fields fields(WeightType t) {
  switch (t) {
    case WeightType::kQ4_1: case WeightType::kQ5_1: case WeightType::kQ4_K: case WeightType::kQ5_K: return {0, 2};
    case WeightType::kQ6_K: return {208, -1};
    default: return {0, -1};
  }
}

// Random blocks whose f16 scales are finite: every other bit pattern is a valid block.
std::vector<uint8_t> random_blocks(WeightType t, int64_t elems, std::mt19937& rng) {
  const int eb = weight_type_block_elems(t), bb = weight_type_block_bytes(t);
  std::vector<uint8_t> w(static_cast<size_t>(elems / eb * bb));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : w) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(-0.02f, 0.02f);
  const Fields f = fields(t);
  for (size_t o = 0; o < w.size(); o += bb) {
    put_f16(w.data() + o + f.d, scale(rng));
    if (f.m >= 0) put_f16(w.data() + o + f.m, scale(rng));
  }
  return w;
}

// |scale part| + |offset part| of every element: the magnitude that the kernels' f32 rounding is relative to
// (the two parts may cancel in the element, not in the kernel's per-block sums).
std::vector<double> magnitudes(WeightType t, const std::vector<uint8_t>& w, int64_t elems) {
  const Fields f = fields(t);
  std::vector<float> a(elems), b(elems, 0.0f);
  if (f.m < 0) {
    dequantize(t, w.data(), elems, a.data());
  } else {
    std::vector<uint8_t> scale_only = w, offset_only = w;
    const int bb = weight_type_block_bytes(t);
    for (size_t o = 0; o < w.size(); o += bb) {
      put_f16(scale_only.data() + o + f.m, 0.0f);
      put_f16(offset_only.data() + o + f.d, 0.0f);
    }
    dequantize(t, scale_only.data(), elems, a.data());
    dequantize(t, offset_only.data(), elems, b.data());
  }
  std::vector<double> m(elems);
  for (int64_t i = 0; i < elems; ++i) m[i] = std::fabs(a[i]) + std::fabs(b[i]);
  return m;
}

std::vector<float> random_activations(int64_t n, std::mt19937& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(n);
  for (auto& v : x) v = nd(rng);
  for (int64_t i = 0; i < n; i += 41) x[i] *= 30.0f;  // outlier channels, as in real activations
  return x;
}

std::vector<int64_t> block_counts(WeightType t) {
  if (weight_type_block_elems(t) == 256) return {8, 16, 24, 40};  // 1, 2, 3, 5 K-blocks
  return {1, 3, 7, 8, 9, 15, 16, 17, 31, 33};
}

// quantize_q8_rows: |x - d q| <= d (1/2 + 2^-16) (the rounding of x * (1/d) moves the rounded value by at most
// a few ulps of |q| <= 127), |q| <= 127, the block max maps to +-127, sums are the sums of q, rows independent.
TEST(QuantDot, ActivationQuantizationBound) {
  std::mt19937 rng(7);
  for (int64_t cols : {32, 96, 576}) {
    const std::vector<float> x = random_activations(3 * cols, rng);
    Q8Rows a, one;
    quantize_q8_rows(x.data(), 3, cols, a);
    for (int64_t r = 0; r < 3; ++r) {
      quantize_q8_rows(x.data() + r * cols, 1, cols, one);
      for (int64_t b = 0; b < a.blocks(); ++b) {
        const float d = a.d[r * a.blocks() + b];
        EXPECT_EQ(d, one.d[b]) << "row " << r << " block " << b;
        int32_t s = 0, qmax = 0;
        for (int j = 0; j < 32; ++j) {
          const int64_t i = r * cols + b * 32 + j;
          const int q = a.q[i];
          EXPECT_EQ(q, one.q[b * 32 + j]);
          EXPECT_LE(std::abs(q), 127);
          EXPECT_LE(std::fabs(x[i] - d * q), d * (0.5 + 1.0 / 65536)) << "cols " << cols << " i " << i;
          s += q;
          qmax = std::max(qmax, std::abs(q));
        }
        EXPECT_EQ(s, a.sum[r * a.blocks() + b]);
        EXPECT_EQ(qmax, 127);
      }
    }
  }
  Q8Rows z;
  const std::vector<float> zeros(64, 0.0f);
  quantize_q8_rows(zeros.data(), 1, 64, z);
  for (int8_t q : z.q) EXPECT_EQ(q, 0);
  EXPECT_EQ(z.d[0], 0.0f);
}

// One kernel against the exact sum of the dequantized weights times the dequantized activations (double):
// each block's f32 terms round at most 3 times (the scale products and the int-to-float of an exact integer
// dot), the dequantized reference weights at most twice, and the sum over nb blocks at most nb - 1 times, so
// |kernel - exact| <= (nb + 8) u sum_i mag_i |d q|_i, mag the element's scale and offset parts (magnitudes()).
void check_kernel(RowDot k, WeightType t, const char* isa) {
  std::mt19937 rng(static_cast<uint32_t>(t) * 131 + 5);
  for (int64_t nb : block_counts(t)) {
    const int64_t n = nb * 32;
    const std::vector<uint8_t> w = random_blocks(t, n, rng);
    const std::vector<float> x = random_activations(n, rng);
    std::vector<float> wf(n);
    dequantize(t, w.data(), n, wf.data());
    const std::vector<double> mag = magnitudes(t, w, n);
    Q8Rows a;
    quantize_q8_rows(x.data(), 1, n, a);
    double exact = 0.0, scale = 0.0, exact_f32x = 0.0, act_err = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      const double xi = static_cast<double>(a.d[i / 32]) * a.q[i];
      exact += static_cast<double>(wf[i]) * xi;
      scale += mag[i] * std::fabs(xi);
      exact_f32x += static_cast<double>(wf[i]) * x[i];
      act_err += std::fabs(wf[i]) * a.d[i / 32] * (0.5 + 1.0 / 65536);
    }
    float got = std::numeric_limits<float>::quiet_NaN();
    k(w.data(), w.size(), 1, q8_row(a, 0), nb, &got);
    const std::string where =
        std::string(isa) + " " + std::string(weight_type_name(t)) + " blocks " + std::to_string(nb);
    const double bound = (nb + 8) * kU * scale;
    EXPECT_LE(std::fabs(got - exact), bound) << where;
    // Against the unquantized activations: the activation rounding (<= d / 2 per element) on top.
    EXPECT_LE(std::fabs(got - exact_f32x), act_err + bound) << where;
    EXPECT_TRUE(std::isfinite(got)) << where;
  }
}

TEST(QuantDot, ScalarKernelsMatchExactSums) {
  for (WeightType t : kBlockTypes) check_kernel(scalar_row_dot(t), t, "scalar");
}

TEST(QuantDot, SimdKernelsMatchExactSumsAndScalar) {
  for (QuantIsa isa : {QuantIsa::kAvx2, QuantIsa::kAvx512Vnni}) {
    if (static_cast<int>(best_quant_isa()) < static_cast<int>(isa)) {
      std::printf("[ skipped %s: not on this processor ]\n", quant_isa_name(isa));
      continue;
    }
    for (WeightType t : kBlockTypes) {
      const RowDot k = row_dot_kernel(t, isa);
      check_kernel(k, t, quant_isa_name(isa));
      // The same as the scalar kernel up to the order of the f32 sum over blocks: <= (nb + 8) u scale as above.
      std::mt19937 rng(99);
      for (int64_t nb : block_counts(t)) {
        const std::vector<uint8_t> w = random_blocks(t, nb * 32, rng);
        const std::vector<float> x = random_activations(nb * 32, rng);
        Q8Rows a;
        quantize_q8_rows(x.data(), 1, nb * 32, a);
        const std::vector<double> mag = magnitudes(t, w, nb * 32);
        double scale = 0.0;
        for (int64_t i = 0; i < nb * 32; ++i) scale += mag[i] * std::fabs(a.d[i / 32] * a.q[i]);
        float s = 0.0f, v = 0.0f;
        scalar_row_dot(t)(w.data(), w.size(), 1, q8_row(a, 0), nb, &s);
        k(w.data(), w.size(), 1, q8_row(a, 0), nb, &v);
        EXPECT_LE(std::fabs(s - v), 2 * (nb + 8) * kU * scale) << quant_isa_name(isa) << " " << weight_type_name(t)
                                                               << " blocks " << nb;
      }
    }
  }
}

// Several rows per call: each row's result equals the row alone bit for bit, and every output is written.
TEST(QuantDot, RowsPerCallDoNotChangeARow) {
  std::mt19937 rng(21);
  for (QuantIsa isa : {QuantIsa::kScalar, QuantIsa::kAvx2, QuantIsa::kAvx512Vnni}) {
    if (static_cast<int>(best_quant_isa()) < static_cast<int>(isa)) continue;
    for (WeightType t : kBlockTypes) {
      const RowDot k = row_dot_kernel(t, isa);
      const int64_t nb = block_counts(t)[1], rows = 5;
      const size_t row_bytes = weight_type_row_bytes(t, nb * 32);
      const std::vector<uint8_t> w = random_blocks(t, rows * nb * 32, rng);
      const std::vector<float> x = random_activations(nb * 32, rng);
      Q8Rows a;
      quantize_q8_rows(x.data(), 1, nb * 32, a);
      std::vector<float> all(rows, std::numeric_limits<float>::quiet_NaN());
      k(w.data(), row_bytes, rows, q8_row(a, 0), nb, all.data());
      for (int64_t r = 0; r < rows; ++r) {
        float one = std::numeric_limits<float>::quiet_NaN();
        k(w.data() + r * row_bytes, row_bytes, 1, q8_row(a, 0), nb, &one);
        EXPECT_EQ(all[r], one) << quant_isa_name(isa) << " " << weight_type_name(t) << " row " << r;
      }
    }
  }
}

const WeightType kGroupTypes[] = {WeightType::kQ8_0, WeightType::kQ4_0, WeightType::kQ4_1, WeightType::kQ5_0,
                                  WeightType::kQ5_1};

// Row groups hold the file's blocks: every row unpacks to its bytes, whatever the row count (a partial last group
// is padded with zero blocks); the types without a layout say so.
TEST(QuantDot, RowGroupsUnpackToTheFileRows) {
  std::mt19937 rng(17);
  for (WeightType t : kGroupTypes) {
    ASSERT_TRUE(has_group_layout(t)) << weight_type_name(t);
    for (int64_t rows : {1, 16, 19, 33}) {
      const int64_t nb = 3, cols = nb * 32;
      const size_t row_bytes = weight_type_row_bytes(t, cols);
      const std::vector<uint8_t> w = random_blocks(t, rows * cols, rng);
      const size_t bytes = row_groups_bytes(t, rows, cols);
      EXPECT_EQ(bytes, static_cast<size_t>((rows + 15) / 16 * 16) * row_bytes);
      std::vector<uint8_t> g(bytes, 0xab);
      pack_row_groups(t, w.data(), rows, cols, g.data());
      std::vector<uint8_t> row(row_bytes);
      for (int64_t r = 0; r < (rows + 15) / 16 * 16; ++r) {
        unpack_group_row(t, g.data(), r, cols, row.data());
        if (r < rows)
          EXPECT_EQ(std::memcmp(row.data(), w.data() + r * row_bytes, row_bytes), 0)
              << weight_type_name(t) << " rows " << rows << " row " << r;
        else
          EXPECT_EQ(std::count(row.begin(), row.end(), 0), static_cast<long>(row_bytes)) << "padding row " << r;
      }
    }
  }
  for (WeightType t : {WeightType::kQ4_K, WeightType::kQ6_K, WeightType::kF32}) {
    EXPECT_FALSE(has_group_layout(t));
    EXPECT_THROW(group_dot_kernel(t, QuantIsa::kScalar), Error);
  }
}

// Every group kernel against the exact sums (the bound of check_kernel, per row) and against the row kernels: the
// scalar group kernel equals the scalar row kernel bit for bit, the SIMD ones within twice the bound (another
// order of the f32 sum); a row's result does not depend on the groups of the call; padding rows give 0.
TEST(QuantDot, GroupKernelsMatchTheRowKernels) {
  for (QuantIsa isa : {QuantIsa::kScalar, QuantIsa::kAvx2, QuantIsa::kAvx512Vnni}) {
    if (static_cast<int>(best_quant_isa()) < static_cast<int>(isa)) {
      std::printf("[ skipped %s: not on this processor ]\n", quant_isa_name(isa));
      continue;
    }
    for (WeightType t : kGroupTypes) {
      const GroupDot k = group_dot_kernel(t, isa);
      std::mt19937 rng(static_cast<uint32_t>(t) * 7 + 1);
      for (int64_t nb : block_counts(t)) {
        const int64_t cols = nb * 32, rows = 37, groups = 3;  // 3 groups, the last with 5 rows
        const size_t row_bytes = weight_type_row_bytes(t, cols);
        const std::vector<uint8_t> w = random_blocks(t, rows * cols, rng);
        std::vector<uint8_t> g(row_groups_bytes(t, rows, cols));
        pack_row_groups(t, w.data(), rows, cols, g.data());
        const std::vector<float> x = random_activations(cols, rng);
        Q8Rows a;
        quantize_q8_rows(x.data(), 1, cols, a);
        std::vector<float> all(groups * 16, std::numeric_limits<float>::quiet_NaN());
        k(g.data(), groups, q8_row(a, 0), nb, all.data());
        std::vector<float> last(16, std::numeric_limits<float>::quiet_NaN());
        k(g.data() + 2 * 16 * row_bytes, 1, q8_row(a, 0), nb, last.data());
        const std::string where =
            std::string(quant_isa_name(isa)) + " " + std::string(weight_type_name(t)) + " blocks " + std::to_string(nb);
        for (int64_t r = 0; r < groups * 16; ++r) {
          if (r >= rows) {
            EXPECT_EQ(all[r], 0.0f) << where << " padding row " << r;
            continue;
          }
          const uint8_t* wr = w.data() + r * row_bytes;
          std::vector<float> wf(cols);
          dequantize(t, wr, cols, wf.data());
          const std::vector<uint8_t> one_row(wr, wr + row_bytes);
          const std::vector<double> mag = magnitudes(t, one_row, cols);
          double exact = 0.0, scale = 0.0;
          for (int64_t i = 0; i < cols; ++i) {
            const double xi = static_cast<double>(a.d[i / 32]) * a.q[i];
            exact += static_cast<double>(wf[i]) * xi;
            scale += mag[i] * std::fabs(xi);
          }
          const double bound = (nb + 8) * kU * scale;
          EXPECT_LE(std::fabs(all[r] - exact), bound) << where << " row " << r;
          float row_result = 0.0f;
          scalar_row_dot(t)(wr, row_bytes, 1, q8_row(a, 0), nb, &row_result);
          if (isa == QuantIsa::kScalar) {
            EXPECT_EQ(all[r], row_result) << where << " row " << r;
          } else {
            EXPECT_LE(std::fabs(all[r] - row_result), 2 * bound) << where << " row " << r;
          }
          if (r >= 32) {
            EXPECT_EQ(all[r], last[r - 32]) << where << ": the group alone, row " << r;
          }
        }
      }
    }
  }
}

// A matrix of three parts (Q5_0, Q8_0 and f32 rows), as a fused QKV of a mixed-type file is.
WeightMatrix mixed_matrix(int64_t cols, std::mt19937& rng) {
  WeightMatrix m(cols);
  const std::vector<uint8_t> a = random_blocks(WeightType::kQ5_0, 5 * cols, rng);
  const std::vector<uint8_t> b = random_blocks(WeightType::kQ8_0, 3 * cols, rng);
  m.append_blocks(WeightType::kQ5_0, a.data(), 5);
  m.append_blocks(WeightType::kQ8_0, b.data(), 3);
  const std::vector<float> c = random_activations(2 * cols, rng);
  m.append_f32(c.data(), 2);
  return m;
}

// Decode rows: row t of an n-row product equals the 1-row product of row t bit for bit (batched decode equals
// single decode), whatever n; beta accumulates; every output is written.
TEST(QuantDot, DecodeRowsDoNotDependOnTheBatch) {
  std::mt19937 rng(3);
  const int64_t cols = 96;
  const WeightMatrix m = mixed_matrix(cols, rng);
  ASSERT_EQ(m.rows(), 10);
  ASSERT_EQ(m.parts().size(), 3u);
  for (int64_t n : {1, 2, 3, 5}) {
    const std::vector<float> x = random_activations(n * cols, rng);
    std::vector<float> y(n * m.rows(), std::numeric_limits<float>::quiet_NaN());
    linear(x.data(), m, y.data(), n, 0.0f, Gemm::kRows);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> one(m.rows(), std::numeric_limits<float>::quiet_NaN());
      linear(x.data() + t * cols, m, one.data(), 1, 0.0f, Gemm::kBlas);  // n = 1 is a decode row in any mode
      for (int64_t o = 0; o < m.rows(); ++o) {
        EXPECT_TRUE(std::isfinite(y[t * m.rows() + o]));
        EXPECT_EQ(y[t * m.rows() + o], one[o]) << "n " << n << " row " << t << " out " << o;
      }
      std::vector<float> acc = one;
      linear(x.data() + t * cols, m, acc.data(), 1, 1.0f, Gemm::kRows);  // y += x W^T: twice the product
      for (int64_t o = 0; o < m.rows(); ++o) EXPECT_FLOAT_EQ(acc[o], 2.0f * one[o]);
    }
  }
}

// A matrix in row groups widens to the same floats as in the file's layout, and its decode rows equal the
// row-by-row kernels' within the kernels' bound (2 (nb + 8) u sum |w| |x|, as GroupKernelsMatchTheRowKernels);
// with the scalar kernels they are bit for bit those of the unpacked matrix (checked there).
TEST(QuantDot, RowGroupMatricesEqualTheFileLayout) {
  std::mt19937 rng(5);
  const int64_t cols = 96;
  WeightMatrix rows_layout = mixed_matrix(cols, rng);
  const std::vector<uint8_t> more = random_blocks(WeightType::kQ4_1, 21 * cols, rng);
  rows_layout.append_blocks(WeightType::kQ4_1, more.data(), 21);
  WeightMatrix groups = rows_layout;
  groups.pack_row_groups();
  int grouped = 0;
  for (const auto& p : groups.parts()) grouped += p.grouped ? 1 : 0;
  EXPECT_EQ(grouped, 3);  // Q5_0, Q8_0, Q4_1; the f32 part stays
  EXPECT_THROW(groups.append_blocks(WeightType::kQ4_1, more.data(), 1), Error);
  EXPECT_EQ(groups.to_f32(), rows_layout.to_f32());
  // The magnitudes of the elements (scale and min parts of the Q4_1 rows 10..30; |w| elsewhere).
  const std::vector<float> wf = rows_layout.to_f32();
  std::vector<double> mag(wf.begin(), wf.end());
  for (double& v : mag) v = std::fabs(v);
  const std::vector<double> q4_1 = magnitudes(WeightType::kQ4_1, more, 21 * cols);
  std::copy(q4_1.begin(), q4_1.end(), mag.begin() + 10 * cols);
  for (int64_t n : {1, 3}) {
    const std::vector<float> x = random_activations(n * cols, rng);
    Q8Rows a;  // the activations as both products see them
    quantize_q8_rows(x.data(), n, cols, a);
    std::vector<float> y(n * groups.rows(), std::numeric_limits<float>::quiet_NaN()), r(y);
    linear(x.data(), groups, y.data(), n, 0.0f, Gemm::kRows);
    linear(x.data(), rows_layout, r.data(), n, 0.0f, Gemm::kRows);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = 0; o < groups.rows(); ++o) {
        double scale = 0.0;
        for (int64_t i = 0; i < cols; ++i)
          scale += mag[o * cols + i] * std::fabs(a.d[(t * cols + i) / 32] * a.q[t * cols + i]);
        EXPECT_LE(std::fabs(y[t * groups.rows() + o] - r[t * groups.rows() + o]), 2 * (cols / 32 + 8) * kU * scale)
            << "n " << n << " row " << t << " out " << o;
      }
  }
}

// Prefill (n > 1, Gemm::kBlas): block parts widened per tile equal an sgemm of the whole f32 matrix up to
// sgemm's own f32 rounding (<= in * u * sum |w| |x| per output; 4x for a different blocking of the sum).
TEST(QuantDot, PrefillTilesEqualTheF32Product) {
  std::mt19937 rng(11);
  for (int64_t cols : {32, 96, 1056}) {  // 1056 x 4 B x 248 rows > the 1 MiB tile: several tiles
    WeightMatrix m = mixed_matrix(cols, rng);
    const std::vector<uint8_t> more = random_blocks(WeightType::kQ4_1, 240 * cols, rng);
    m.append_blocks(WeightType::kQ4_1, more.data(), 240);
    WeightMatrix f(cols);
    const std::vector<float> wf = m.to_f32();
    f.append_f32(wf.data(), m.rows());
    const int64_t n = 7;
    const std::vector<float> x = random_activations(n * cols, rng);
    std::vector<float> y(n * m.rows(), std::numeric_limits<float>::quiet_NaN()), r(n * m.rows());
    linear(x.data(), m, y.data(), n, 0.0f, Gemm::kBlas);
    linear(x.data(), f, r.data(), n, 0.0f, Gemm::kBlas);
    for (int64_t t = 0; t < n; ++t)
      for (int64_t o = 0; o < m.rows(); ++o) {
        double scale = 0.0;
        for (int64_t i = 0; i < cols; ++i) scale += std::fabs(wf[o * cols + i] * x[t * cols + i]);
        EXPECT_LE(std::fabs(y[t * m.rows() + o] - r[t * m.rows() + o]), 4 * cols * kU * scale)
            << "cols " << cols << " row " << t << " out " << o;
      }
  }
}

}  // namespace
}  // namespace retroinfer::model
