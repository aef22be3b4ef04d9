// The six-bit scales and mins of the Q4_K / Q5_K blocks, shared by their dequantization (ggml_quants.cpp) and
// the CPU's dot-product kernels (src/model/quant_dot.cpp, quant_dot_x86.h). Internal linkage: the SIMD
// translation units include it too, and no copy compiled for their instruction sets may serve baseline code.
#pragma once

#include <cstdint>

namespace retroinfer::ggml {
namespace {

// The scale and min of sub-block j (0..7) of a Q4_K / Q5_K block's scales[12].
[[maybe_unused]] inline void scale_min_k4(int j, const uint8_t* q, int& sc, int& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

}  // namespace
}  // namespace retroinfer::ggml
