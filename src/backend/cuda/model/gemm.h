// The runner's matrix products through cuBLAS: y[n, out] = x[n, in] @ W[out, in]^T + beta * y, x and y f32
// row-major, W row-major in bf16 or f32. Included only from src/backend/cuda.
//
// bf16 weights: x is rounded to bf16 into a workspace, then cublasGemmEx with bf16 inputs, f32 output and
// f32 accumulation (CUBLAS_COMPUTE_32F): x's rounding (relative 2^-9) is the extra error against the CPU.
// f32 weights: cublasGemmEx with f32 inputs and CUBLAS_COMPUTE_32F_PEDANTIC, so that neither the math mode
// nor NVIDIA_TF32_OVERRIDE can switch to TF32: the f32 path differs from the CPU's cblas_sgemm only in
// summation order.
// Threading contract: one host thread at a time (the handle is bound to the stream of each call).
#pragma once

#include <cstdint>

#include "retroinfer/cuda_backend.h"

namespace retroinfer::cuda::model {

class Gemm {
 public:
  // max_x_elems: the largest n * in of a bf16 product (sizes the bf16 copy of x; 0 for f32 weights).
  Gemm(bool bf16_weights, int64_t max_x_elems);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // x: device [n, in] f32; w: device [out, in] (bf16 bits or f32 as constructed); y: device [n, out] f32.
  // beta 0 overwrites y, 1 accumulates (the residual adds).
  void linear(const float* x, int64_t n, int64_t in, const void* w, int64_t out, float* y, float beta, Stream s);

 private:
  void* handle_ = nullptr;  // cublasHandle_t
  bool bf16_ = true;
  DeviceBuffer xb_;  // [max_x_elems] bf16: x rounded for the bf16 product
};

}  // namespace retroinfer::cuda::model
