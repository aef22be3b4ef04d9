// core/simd.h: the run-time check (compiled for the baseline) and the fallbacks where no AVX-512 code is built.
#include "core/simd.h"

namespace retroinfer::core {

bool cpu_has_avx2_fma() {
#if defined(__x86_64__)
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  }();
  return yes;
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__)
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
  }();
  return yes;
#else
  return false;
#endif
}

#if RETROINFER_CORE_AVX512
// simd_avx512.cpp (compiled for AVX-512).
bool row_logits_avx512_unchecked(const float* rows, int64_t n, int d, const float* q, int group, float scale,
                                 float* logits, int64_t ld);
#endif

bool row_logits_avx512(const float* rows, int64_t n, int d, const float* q, int group, float scale, float* logits,
                       int64_t ld) {
#if RETROINFER_CORE_AVX512
  if (cpu_has_avx512()) return row_logits_avx512_unchecked(rows, n, d, q, group, scale, logits, ld);
#endif
  return false;
}

}  // namespace retroinfer::core
