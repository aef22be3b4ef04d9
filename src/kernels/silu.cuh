// SwiGLU's element function, shared by the SwiGLU kernel (model_kernels.cu) and the fused gate/up GEMV
// (gemv.cu) so that both round alike: silu(g) * u with IEEE division, expf and a separately rounded product
// (as the CPU runner). .cu files of the model runner only.
#pragma once

#include <cuda_runtime.h>

namespace retroinfer::cuda::model {

__device__ __forceinline__ float silu_mul(float g, float u) { return __fmul_rn(g / (1.0f + expf(-g)), u); }

}  // namespace retroinfer::cuda::model
