// Dot products with eight partial sums, so the compiler vectorises the reduction without reassociation
// flags (-ffast-math). The summation order differs from a serial loop by at most a few ulps of the result.
#pragma once

#include <cstdint>

#include "retroinfer/dtype.h"

namespace retroinfer::core {

// a . b over n floats.
inline float dot_f32(const float* a, const float* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// a . b over n elements, b in bf16.
inline float dot_bf16(const float* a, const uint16_t* b, int n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * bf16_to_f32(b[i + j]);
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * bf16_to_f32(b[i]);
  return s;
}

}  // namespace retroinfer::core
