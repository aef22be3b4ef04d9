// Helpers shared by the unit tests.
#pragma once

#include <vector>

namespace retroinfer::test {

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
