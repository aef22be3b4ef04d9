// The block step of exact CPU attention, shared by its portable form (exact.cpp, compiled per instruction set by
// target_clones) and its AVX-512 form (exact_avx512.cpp, compiled with AVX-512 flags): kBlock tokens' logits
// first, then per query head one maximum, one rescale of the running state and the weights (block_softmax),
// then the values. Internal linkage throughout, so that no copy compiled for AVX-512 can stand in for baseline
// code at link time.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>

#include "core/vec_math.h"
#include "retroinfer/softmax_state.h"

namespace retroinfer::attention {
namespace exact_block {
namespace {

// Tokens per block: their logits are computed first, then one maximum, one rescale of the running state and
// one exponential per (query head, token) that the compiler can vectorise, then the values.
constexpr int kBlock = 64;

// Raises a query head's running maximum to m (when m is larger): its sum and output rows scale by e^(old - m).
[[gnu::always_inline]] inline void raise_max(SoftmaxScalars& sc, float* og, int d, float m) {
  if (!(m > sc.m)) return;
  const float a = sc.m == -INFINITY ? 0.0f : core::exp_nonpositive(sc.m - m);
  for (int i = 0; i < d; ++i) og[i] *= a;
  sc.l *= a;
  sc.m = m;
}

// s: [group, kBlock] logits of nb tokens -> their weights e^(logit - m), m each head's new running maximum; the
// states st and output rows o [group, d] rescaled to m, the weights' sums added.
[[gnu::always_inline]] inline void block_softmax(float* s, int nb, int group, int d, SoftmaxScalars* st, float* o) {
  for (int g = 0; g < group; ++g) {
    float* sg = s + g * kBlock;
    float m = sg[0];
    for (int b = 1; b < nb; ++b) m = std::max(m, sg[b]);
    SoftmaxScalars& sc = st[g];
    raise_max(sc, o + static_cast<size_t>(g) * d, d, m);
    float sum = 0.0f;
    for (int b = 0; b < nb; ++b) {
      sg[b] = core::exp_nonpositive(sg[b] - sc.m);
      sum += sg[b];
    }
    sc.l += sum;
  }
}

}  // namespace
}  // namespace exact_block

// The AVX-512 block step (exact_avx512.cpp) for head_dim 64 or 128: false (nothing done) for another head_dim.
// Only on a processor with AVX-512 F/BW/DQ/VL. Arguments as attend_block's in exact.cpp.
bool attend_block_avx512(const void* const* krows, const void* const* vrows, int nb, bool bf16, const float* q,
                         int group, int d, float scale, SoftmaxScalars* st, float* o, float* scratch);

}  // namespace retroinfer::attention
