// The AVX-512 VNNI kernels of quant_dot.h (256-bit vectors, vpdpbusd for the integer dots); this file is
// compiled with the AVX2 flags plus -mavx512f -mavx512vl -mavx512bw -mavx512vnni (src/model/CMakeLists.txt)
// and only called after best_quant_isa() found those instructions.
#define RETROINFER_QUANT_DOT_VNNI 1
#include "model/quant_dot_x86.h"

namespace retroinfer::model {

RowDot avx512_row_dot(WeightType t) { return simd_table(t); }
GroupDot avx512_group_dot(WeightType t) { return simd_group_table(t); }

}  // namespace retroinfer::model
