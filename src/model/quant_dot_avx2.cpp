// The AVX2 kernels of quant_dot.h; this file is compiled with -mavx2 -mfma -mf16c (src/model/CMakeLists.txt)
// and only called after best_quant_isa() found those instructions.
#define RETROINFER_QUANT_DOT_VNNI 0
#include "model/quant_dot_x86.h"

namespace retroinfer::model {

RowDot avx2_row_dot(WeightType t) { return simd_table(t); }
GroupDot avx2_group_dot(WeightType t) { return simd_group_table(t); }

}  // namespace retroinfer::model
