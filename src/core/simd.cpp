// core/simd.h: the run-time check (compiled for the baseline) and the fallbacks where no AVX-512 code is built.
#include "core/simd.h"

namespace retroinfer::core {

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

#if !RETROINFER_CORE_AVX512
bool row_logits_avx512(const float*, int64_t, int, const float*, int, float, float*, int64_t) { return false; }
#endif

}  // namespace retroinfer::core
