#include "model/prefill_attention.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/vec_math.h"
#include "retroinfer/error.h"

namespace retroinfer::model {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One row's step of the online softmax over a key block: s [kb] scores of which the first `valid` are visible
// -> their weights e^(score - m') (0 past valid), m' the row's new running maximum; the running sum l and the
// output row o [d] rescaled to m', the weights' sum added. Maximum and sum by core::max_lanes / sum_lanes and
// the exponential by core::exp_nonpositive, so that the loops vectorise without -ffast-math (libm's expf is ~2 ns
// a call; at 32K tokens a prompt's prefill takes ~10^11 of them); compiled per instruction set.
RETROINFER_TARGET_CLONES
void softmax_block_row(float* s, int64_t valid, int64_t kb, float& m, float& l, float* o, int d) {
  const float mx = core::max_lanes(s, valid, m);
  if (valid == 0 || mx == kNegInf) {
    std::fill(s, s + kb, 0.0f);
    return;
  }
  const float a = m == kNegInf ? 0.0f : core::exp_nonpositive(m - mx);  // rescale the earlier blocks
  for (int c = 0; c < d; ++c) o[c] *= a;
  for (int64_t j = 0; j < valid; ++j) s[j] = core::exp_nonpositive(s[j] - mx);
  const float sum = core::sum_lanes(s, valid);
  std::fill(s + valid, s + kb, 0.0f);
  l = l * a + sum;
  m = mx;
}

}  // namespace

void blas_prefill_attention(const KvCache& kv, const AttentionShape& shape, float scale, int64_t pos0, int64_t n,
                            const float* q, float* out, PrefillAttentionScratch& sc) {
  validate(shape);
  RETROINFER_CHECK(kv.num_heads_kv() == shape.num_heads_kv && kv.head_dim() == shape.head_dim,
                   "prefill attention: KV cache shape does not match the attention shape");
  RETROINFER_CHECK(pos0 >= 0 && n >= 1 && pos0 + n <= kv.size(), "prefill attention: positions [", pos0, ", ",
                   pos0 + n, ") exceed the ", kv.size(), " cached tokens");
  const int d = shape.head_dim, hq = shape.num_heads_q, group = hq / shape.num_heads_kv;
  const float sm = scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t T = pos0 + n;  // keys visible to the last query
  const int64_t rows = group * n;
  sc.q.resize(rows * d);
  sc.o.resize(rows * d);
  sc.m.resize(rows);
  sc.l.resize(rows);
  sc.s.resize(rows * std::min(T, kKeyBlock));

  for (int h = 0; h < shape.num_heads_kv; ++h) {
    // Keys and values of head h as contiguous [T, d] f32 rows.
    const float* K;
    const float* V;
    if (kv.dtype() == DType::kF32) {
      K = static_cast<const float*>(kv.key_row(h, 0));
      V = static_cast<const float*>(kv.value_row(h, 0));
    } else {
      sc.k.resize(T * d);
      sc.v.resize(T * d);
#pragma omp parallel for schedule(static) if (T * d >= (1 << 16))
      for (int64_t t = 0; t < T; ++t) {
        kv.load_key(h, t, &sc.k[t * d]);
        kv.load_value(h, t, &sc.v[t * d]);
      }
      K = sc.k.data();
      V = sc.v.data();
    }
    // Row r = g * n + i holds query head h * group + g at position pos0 + i.
    for (int g = 0; g < group; ++g)
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(q + (i * hq + h * group + g) * d, d, &sc.q[(g * n + i) * d]);
    std::fill(sc.o.begin(), sc.o.end(), 0.0f);
    std::fill(sc.m.begin(), sc.m.end(), kNegInf);
    std::fill(sc.l.begin(), sc.l.end(), 0.0f);
    for (int64_t k0 = 0; k0 < T; k0 += kKeyBlock) {
      const int64_t kb = std::min(kKeyBlock, T - k0);
      // S = scale * Q K[k0:k0+kb]^T: [rows, kb].
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(kb), d, sm,
                  sc.q.data(), d, K + k0 * d, d, 0.0f, sc.s.data(), static_cast<int>(kb));
#pragma omp parallel for schedule(static) if (rows * kb >= (1 << 16))
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t valid = std::clamp<int64_t>(pos0 + r % n + 1 - k0, 0, kb);  // causal: keys <= pos0 + i
        softmax_block_row(&sc.s[r * kb], valid, kb, sc.m[r], sc.l[r], &sc.o[r * d], d);
      }
      // O += P V[k0:k0+kb]: [rows, d].
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(rows), d, static_cast<int>(kb), 1.0f,
                  sc.s.data(), static_cast<int>(kb), V + k0 * d, d, 1.0f, sc.o.data(), d);
    }
    for (int g = 0; g < group; ++g)
      for (int64_t i = 0; i < n; ++i) {
        const int64_t r = g * n + i;
        const float inv = 1.0f / sc.l[r];  // l >= 1: the row's own max contributes exp(0)
        float* dst = out + (i * hq + h * group + g) * d;
        for (int c = 0; c < d; ++c) dst[c] = sc.o[r * d + c] * inv;
      }
  }
}

}  // namespace retroinfer::model
