// Helpers shared by the unit tests.
#pragma once

#include <vector>

namespace retroinfer::test {

// The factor a test's wall-time bound is scaled by: the bounds are set for an optimised build, and a sanitizer
// build (cpu-debug: ASan + UBSan at -O0; cpu-tsan) runs the same code several times slower (the tokenizer's
// 100 KB of spaces: 4.5 s under ASan at -O0 on a loaded 2-core machine against a 2 s bound); 10x leaves room.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr double kTimeBoundScale = 10.0;
#else
inline constexpr double kTimeBoundScale = 1.0;
#endif

// Normalised mean squared error sum (a - b)^2 / sum b^2, accumulated in double (b is the reference).
inline double nmse(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    num += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return num / den;
}

}  // namespace retroinfer::test
