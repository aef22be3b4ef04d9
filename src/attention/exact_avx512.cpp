// The block step of exact CPU attention in AVX-512 intrinsics (exact_block.h), for head_dim 64 and 128 (the
// shapes of the models we run): the query heads of a chunk of the group stay in registers while the block's key
// rows stream past, their output rows stay in registers while the value rows stream past (the portable loop of
// exact.cpp loads and stores every output row once per token), and bf16 rows are widened in registers. The same
// arithmetic as the portable loop up to the order of the f32 sums (a logit's lanes are added in another tree),
// about twice its speed. Compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl (src/attention/CMakeLists.txt)
// and called only after a run-time check of the processor (exact.cpp).
#include <immintrin.h>

#include "attention/exact_block.h"
#include "core/avx512_rows.h"

namespace retroinfer::attention {
namespace {

using core::avx512::by_head_chunks;
using core::avx512::load_row;
using core::avx512::LogitsOp;
using exact_block::block_softmax;
using exact_block::kBlock;

// o[g] += sum_b p[g][b] v_b for query heads [g0, g0 + G).
template <int C, int G>
void block_values(const void* const* vrows, int nb, bool bf16, const float* s, int g0, float* o) {
  __m512 acc[G][C];
  for (int j = 0; j < G; ++j)
    for (int c = 0; c < C; ++c) acc[j][c] = _mm512_loadu_ps(o + (g0 + j) * C * 16 + 16 * c);
  for (int b = 0; b < nb; ++b) {
    __m512 v[C];
    load_row<C>(vrows[b], bf16, v);
    for (int j = 0; j < G; ++j) {
      const __m512 p = _mm512_set1_ps(s[(g0 + j) * kBlock + b]);
      for (int c = 0; c < C; ++c) acc[j][c] = _mm512_fmadd_ps(p, v[c], acc[j][c]);
    }
  }
  for (int j = 0; j < G; ++j)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(o + (g0 + j) * C * 16 + 16 * c, acc[j][c]);
}

template <int C, int G>
struct ValuesOp {
  static void run(int g0, const void* const* vrows, int nb, bool bf16, const float* s, float* o) {
    block_values<C, G>(vrows, nb, bf16, s, g0, o);
  }
};

template <int C>
void attend_block_c(const void* const* krows, const void* const* vrows, int nb, bool bf16, const float* q, int group,
                    float scale, SoftmaxScalars* st, float* o, float* scratch) {
  constexpr int d = 16 * C;
  float* s = scratch;  // [group, kBlock] logits, then weights
  by_head_chunks<C, LogitsOp>(group, krows, nb, bf16, q, scale, s, int64_t{kBlock});
  block_softmax(s, nb, group, d, st, o);
  by_head_chunks<C, ValuesOp>(group, vrows, nb, bf16, static_cast<const float*>(s), o);
}

}  // namespace

bool attend_block_avx512(const void* const* krows, const void* const* vrows, int nb, bool bf16, const float* q,
                         int group, int d, float scale, SoftmaxScalars* st, float* o, float* scratch) {
  if (d == 64)
    attend_block_c<4>(krows, vrows, nb, bf16, q, group, scale, st, o, scratch);
  else if (d == 128)
    attend_block_c<8>(krows, vrows, nb, bf16, q, group, scale, st, o, scratch);
  else
    return false;
  return true;
}

}  // namespace retroinfer::attention
