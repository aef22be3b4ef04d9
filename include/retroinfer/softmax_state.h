// Partial softmax-attention state and its exact log-sum-exp merge, shared by the CPU reference and the
// CUDA kernels (host and device).
//
// A state over a set S of (logit s_i, value v_i) pairs, for one query head, is
//   m = max_i s_i                      (running max; -inf for the empty set)
//   l = sum_i w_i * exp(s_i - m)       (denominator relative to m; w_i = 1 for exact tokens, the
//                                        cluster size for an estimated cluster)
//   o = sum_i exp(s_i - m) * v_i       (un-normalised numerator, head_dim floats, relative to m)
// The attention output is o / l and the log-sum-exp is m + log(l). Two states merge exactly:
//   m = max(m_a, m_b); o = o_a e^{m_a-m} + o_b e^{m_b-m}; l = l_a e^{m_a-m} + l_b e^{m_b-m}.
// The empty state (m = -inf, l = 0, o = 0) is the identity; merging two empty states stays empty and
// produces no NaN (exp(-inf - -inf) is never evaluated).
#pragma once

#include <cmath>
#include <limits>

#include "retroinfer/dtype.h"  // RETROINFER_HD

namespace retroinfer {

struct SoftmaxScalars {
  float m = -std::numeric_limits<float>::infinity();
  float l = 0.0f;
};

// Scale factor exp(m_old - m_new), with the empty state (m_old = -inf) mapping to 0.
RETROINFER_HD float softmax_rescale(float m_old, float m_new) {
  return m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
}

// Adds one (logit, weight, value) item to the state: weight 1 for an exact token, s_j for an estimated
// cluster whose numerator is e^{logit} * value_sum (then `v` is the value sum and `weight` the size).
// o: [dim] f32.
RETROINFER_HD void softmax_push(SoftmaxScalars& st, float* o, float logit, float weight,
                                const float* v, int dim) {
  if (logit == -INFINITY) return;
  if (logit > st.m) {
    const float a = softmax_rescale(st.m, logit);
    for (int i = 0; i < dim; ++i) o[i] *= a;
    st.l *= a;
    st.m = logit;
  }
  const float p = expf(logit - st.m);
  st.l += weight * p;
  for (int i = 0; i < dim; ++i) o[i] += p * v[i];
}

// Merges state b into state a. o_a, o_b: [dim] f32 (un-normalised).
RETROINFER_HD void softmax_merge(SoftmaxScalars& a, float* o_a, const SoftmaxScalars& b,
                                 const float* o_b, int dim) {
  if (b.m == -INFINITY) return;  // b empty: identity
  const float m = a.m > b.m ? a.m : b.m;
  const float sa = softmax_rescale(a.m, m);
  const float sb = softmax_rescale(b.m, m);
  for (int i = 0; i < dim; ++i) o_a[i] = o_a[i] * sa + o_b[i] * sb;
  a.l = a.l * sa + b.l * sb;
  a.m = m;
}

// Writes the normalised output o / l; the empty state gives zeros (not NaN).
RETROINFER_HD void softmax_finish(const SoftmaxScalars& st, const float* o, float* out, int dim) {
  const float inv = st.l > 0.0f ? 1.0f / st.l : 0.0f;
  for (int i = 0; i < dim; ++i) out[i] = o[i] * inv;
}

// log-sum-exp of the state; -inf for the empty state.
RETROINFER_HD float softmax_lse(const SoftmaxScalars& st) {
  return st.l > 0.0f ? st.m + logf(st.l) : -INFINITY;
}

}  // namespace retroinfer
