// The AVX-512 kernels of core/simd.h; compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl
// (src/core/CMakeLists.txt) and called only from simd.cpp, after its check of the processor (no instruction of
// this file may run before that check).
#include <algorithm>

#include "core/avx512_rows.h"

namespace retroinfer::core {
namespace {

template <int C>
void row_logits(const float* rows, int64_t n, const float* q, int group, float scale, float* logits, int64_t ld) {
  constexpr int kRows = 64;  // rows per pass: their pointers on the stack
  const void* ptrs[kRows];
  for (int64_t i0 = 0; i0 < n; i0 += kRows) {
    const int nb = static_cast<int>(std::min<int64_t>(kRows, n - i0));
    for (int b = 0; b < nb; ++b) ptrs[b] = rows + (i0 + b) * 16 * C;
    avx512::by_head_chunks<C, avx512::LogitsOp>(group, static_cast<const void* const*>(ptrs), nb, false, q, scale,
                                                logits + i0, ld);
  }
}

}  // namespace

bool row_logits_avx512_unchecked(const float* rows, int64_t n, int d, const float* q, int group, float scale,
                                 float* logits, int64_t ld) {
  if (d == 64)
    row_logits<4>(rows, n, q, group, scale, logits, ld);
  else if (d == 128)
    row_logits<8>(rows, n, q, group, scale, logits, ld);
  else
    return false;
  return true;
}

}  // namespace retroinfer::core
