#include "attention/exact.h"
#include "attention/exact_block.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "core/kv_row_widen.h"
#include "core/simd.h"
#include "core/vec_math.h"
#include "retroinfer/dtype.h"

namespace retroinfer::attention {

float effective_scale(float scale, int head_dim) {
  return scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

namespace {

using core::dot_lanes;
using core::exp_nonpositive;
using core::widen_bf16;
using exact_block::kBlock;
using exact_block::block_softmax;
using exact_block::raise_max;

// One block of nb <= kBlock tokens for the `group` query heads of one KV head: krows / vrows point at the
// tokens' key / value rows in storage (dt: f32, bf16, fp8 or int8); each row is read and widened once for the whole
// group. key_bias: with 8-bit keys relative to a key calibration (KeyCalibration: k = y * factor + mean), q is
// the queries times the factors and key_bias[g] query head g's q . mean, so that q . k = (q * factor) . y +
// q . mean without calibrating every row back (kv_cache.h); else nullptr.
// D: the head_dim when it is a compile-time constant (64, 128: the loops unroll), else 0 and d gives it.
// scratch: kBlock * group + d floats.
template <int D>
[[gnu::always_inline]] inline void attend_block_impl(const void* const* krows, const void* const* vrows, int nb, DType dt,
                              const float* key_bias, const float* q, int group, int d, float scale,
                              SoftmaxScalars* st, float* o, float* scratch) {
  if constexpr (D > 0) d = D;
  float* s = scratch;                                           // [group, kBlock] logits, then weights
  float* row = scratch + static_cast<size_t>(group) * kBlock;   // [d] a widened row
  for (int b = 0; b < nb; ++b) {
    const float* k = static_cast<const float*>(krows[b]);
    if (dt == DType::kBF16) {
      widen_bf16(krows[b], d, row);
      k = row;
    } else if (is_scaled_8bit(dt)) {
      widen_scaled_8bit_row(dt, krows[b], d, row);
      k = row;
    }
    if (key_bias != nullptr) {
      for (int g = 0; g < group; ++g)
        s[g * kBlock + b] = (dot_lanes(q + static_cast<size_t>(g) * d, k, d) + key_bias[g]) * scale;
    } else {
      for (int g = 0; g < group; ++g) s[g * kBlock + b] = dot_lanes(q + static_cast<size_t>(g) * d, k, d) * scale;
    }
  }
  block_softmax(s, nb, group, d, st, o);
  // Values.
  for (int b = 0; b < nb; ++b) {
    const float* v = static_cast<const float*>(vrows[b]);
    if (dt == DType::kBF16) {
      widen_bf16(vrows[b], d, row);
      v = row;
    } else if (is_scaled_8bit(dt)) {
      widen_scaled_8bit_row(dt, vrows[b], d, row);
      v = row;
    }
    for (int g = 0; g < group; ++g) {
      const float p = s[g * kBlock + b];
      float* og = o + static_cast<size_t>(g) * d;
      for (int i = 0; i < d; ++i) og[i] += p * v[i];
    }
  }
}

// attend_block_impl for the head_dim at hand, compiled for AVX-512, AVX2 + FMA and the baseline and picked at
// run time (target_clones): the loops over head_dim and over the block vectorise.
RETROINFER_TARGET_CLONES
void attend_block(const void* const* krows, const void* const* vrows, int nb, DType dt, const float* key_bias,
                  const float* q, int group, int d, float scale, SoftmaxScalars* st, float* o, float* scratch) {
  if (d == 128)
    attend_block_impl<128>(krows, vrows, nb, dt, key_bias, q, group, d, scale, st, o, scratch);
  else if (d == 64)
    attend_block_impl<64>(krows, vrows, nb, dt, key_bias, q, group, d, scale, st, o, scratch);
  else
    attend_block_impl<0>(krows, vrows, nb, dt, key_bias, q, group, d, scale, st, o, scratch);
}

// attend_block, or its AVX-512 form where the processor, head_dim and storage (f32, bf16) allow.
void attend_block_best(const void* const* krows, const void* const* vrows, int nb, DType dt, const float* key_bias,
                       const float* q, int group, int d, float scale, SoftmaxScalars* st, float* o, float* scratch) {
#if RETROINFER_ATTENTION_AVX512
  if (!is_scaled_8bit(dt) && core::cpu_has_avx512() &&
      attend_block_avx512(krows, vrows, nb, dt == DType::kBF16, q, group, d, scale, st, o, scratch))
    return;
#endif
  attend_block(krows, vrows, nb, dt, key_bias, q, group, d, scale, st, o, scratch);
}

// Runs the n tokens token_at(0..n-1) through attend_block, kBlock at a time.
template <typename TokenAt>
void accumulate(const KvCache& kv, int kvh, const float* q, float scale, int64_t n, TokenAt token_at,
                GroupState& gs) {
  if (n <= 0) return;
  const int g = gs.group, d = gs.head_dim;
  const DType dt = kv.dtype();
  // Calibrated 8-bit keys (k = y * factor + mean): the rows are scored by the queries times the factors, plus
  // each query head's q . mean (attend_block_impl); both live after the block scratch, in the same allocation.
  const float* mean = kv.key_mean(kvh);
  const size_t block_scratch = static_cast<size_t>(kBlock) * g + d;
  std::vector<float> scratch(block_scratch + (mean != nullptr ? static_cast<size_t>(g) * (d + 1) : 0));
  const float* key_q = q;
  const float* key_bias = nullptr;
  if (mean != nullptr) {
    const float* factor = kv.key_factor(kvh);
    float* scaled_q = scratch.data() + block_scratch;      // [g, d]
    float* bias = scaled_q + static_cast<size_t>(g) * d;  // [g]
    for (int h = 0; h < g; ++h) {
      const float* qh = q + static_cast<size_t>(h) * d;
      double sum = 0.0;
      for (int i = 0; i < d; ++i) {
        scaled_q[static_cast<size_t>(h) * d + i] = qh[i] * factor[i];
        sum += static_cast<double>(qh[i]) * mean[i];
      }
      bias[h] = static_cast<float>(sum);
    }
    key_q = scaled_q;
    key_bias = bias;
  }
  const void* krows[kBlock];
  const void* vrows[kBlock];
  for (int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const int nb = static_cast<int>(std::min<int64_t>(kBlock, n - i0));
    for (int b = 0; b < nb; ++b) {
      const int64_t t = token_at(i0 + b);
      krows[b] = kv.key_row(kvh, t);
      vrows[b] = kv.value_row(kvh, t);
    }
    attend_block_best(krows, vrows, nb, dt, key_bias, key_q, g, d, scale, gs.st.data(), gs.o.data(), scratch.data());
  }
}

// accumulate_estimates' body for the head_dim at hand (see attend_block_impl for D).
template <int D>
[[gnu::always_inline]] inline void estimate_impl(const float* logits, int64_t num_clusters, const int32_t* ids, int n,
                                                  const int32_t* sizes, const float* value_sums, int group, int d,
                                                  SoftmaxScalars* st, float* o, float* p) {
  if constexpr (D > 0) d = D;
  // Per query head: the zone's maximum logit, one rescale of the state, the weights e^(logit - m).
  for (int g = 0; g < group; ++g) {
    const float* lg = logits + static_cast<int64_t>(g) * num_clusters;
    float* pg = p + static_cast<int64_t>(g) * n;
    float m = -INFINITY;
    for (int i = 0; i < n; ++i) m = std::max(m, lg[ids[i]]);
    if (m == -INFINITY) {  // nothing to add for this head (every logit -inf)
      for (int i = 0; i < n; ++i) pg[i] = 0.0f;
      continue;
    }
    SoftmaxScalars& sc = st[g];
    raise_max(sc, o + static_cast<size_t>(g) * d, d, m);
    float l = 0.0f;
    for (int i = 0; i < n; ++i) {
      pg[i] = exp_nonpositive(lg[ids[i]] - sc.m);
      l += static_cast<float>(sizes[ids[i]]) * pg[i];
    }
    sc.l += l;
  }
  // The value sums, each row read once for the group.
  for (int i = 0; i < n; ++i) {
    const float* vs = value_sums + static_cast<int64_t>(ids[i]) * d;
    for (int g = 0; g < group; ++g) {
      const float w = p[static_cast<int64_t>(g) * n + i];
      float* og = o + static_cast<size_t>(g) * d;
      for (int e = 0; e < d; ++e) og[e] += w * vs[e];
    }
  }
}

RETROINFER_TARGET_CLONES
void estimate(const float* logits, int64_t num_clusters, const int32_t* ids, int n, const int32_t* sizes,
              const float* value_sums, int group, int d, SoftmaxScalars* st, float* o, float* p) {
  if (d == 128)
    estimate_impl<128>(logits, num_clusters, ids, n, sizes, value_sums, group, d, st, o, p);
  else if (d == 64)
    estimate_impl<64>(logits, num_clusters, ids, n, sizes, value_sums, group, d, st, o, p);
  else
    estimate_impl<0>(logits, num_clusters, ids, n, sizes, value_sums, group, d, st, o, p);
}

}  // namespace

void accumulate_range(const KvCache& kv, int kvh, const float* q, float scale, int64_t begin, int64_t end,
                      GroupState& gs) {
  accumulate(kv, kvh, q, scale, end - begin, [begin](int64_t i) { return begin + i; }, gs);
}

void accumulate_tokens(const KvCache& kv, int kvh, const float* q, float scale, const int64_t* tokens,
                       int64_t n, GroupState& gs) {
  accumulate(kv, kvh, q, scale, n, [tokens](int64_t i) { return tokens[i]; }, gs);
}

}  // namespace retroinfer::attention

namespace retroinfer::attention {

void accumulate_estimates(const float* logits, int64_t num_clusters, const int32_t* ids, int n, const int32_t* sizes,
                          const float* value_sums, GroupState& gs) {
  if (n <= 0) return;
  std::vector<float> p(static_cast<size_t>(gs.group) * n);
  estimate(logits, num_clusters, ids, n, sizes, value_sums, gs.group, gs.head_dim, gs.st.data(), gs.o.data(),
           p.data());
}

}  // namespace retroinfer::attention
