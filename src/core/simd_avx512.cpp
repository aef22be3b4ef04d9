// The AVX-512 kernels of core/simd.h; compiled with -mavx512f -mavx512bw -mavx512dq -mavx512vl
// (src/core/CMakeLists.txt).
#include <algorithm>

#include "core/avx512_rows.h"
#include "core/simd.h"

namespace retroinfer::core {
namespace {

template <int C>
void row_logits(const float* rows, int64_t n, const float* q, int group, float scale, float* logits, int64_t ld) {
  constexpr int kRows = 64;      // rows per pass: their pointers on the stack
  constexpr int kHeads = C == 4 ? 4 : 2;  // heads per pass: kHeads x C registers of queries
  const void* ptrs[kRows];
  for (int64_t i0 = 0; i0 < n; i0 += kRows) {
    const int nb = static_cast<int>(std::min<int64_t>(kRows, n - i0));
    for (int b = 0; b < nb; ++b) ptrs[b] = rows + (i0 + b) * 16 * C;
    for (int g0 = 0; g0 < group; g0 += kHeads) {
      float* s = logits + i0;
      switch (std::min(kHeads, group - g0)) {
        case 4: avx512::block_logits<C, 4>(ptrs, nb, false, q, g0, scale, s, ld); break;
        case 3: avx512::block_logits<C, 3>(ptrs, nb, false, q, g0, scale, s, ld); break;
        case 2: avx512::block_logits<C, 2>(ptrs, nb, false, q, g0, scale, s, ld); break;
        default: avx512::block_logits<C, 1>(ptrs, nb, false, q, g0, scale, s, ld); break;
      }
    }
  }
}

}  // namespace

bool row_logits_avx512(const float* rows, int64_t n, int d, const float* q, int group, float scale, float* logits,
                       int64_t ld) {
  if (!cpu_has_avx512()) return false;
  if (d == 64)
    row_logits<4>(rows, n, q, group, scale, logits, ld);
  else if (d == 128)
    row_logits<8>(rows, n, q, group, scale, logits, ld);
  else
    return false;
  return true;
}

}  // namespace retroinfer::core
