// Gemm: cuBLAS products of the model runner (see gemm.h).
#include "backend/cuda/model/gemm.h"

#include <cublas_v2.h>

#include <climits>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/model/model_kernels.h"

namespace retroinfer::cuda::model {
namespace {

const char* status_name(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "unknown status";
  }
}

void check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    RETROINFER_FAIL("cuBLAS ", what, " failed: ", status_name(st), " (", static_cast<int>(st),
                    "); check the device state and the matrix shapes");
}

}  // namespace

Gemm::Gemm(bool bf16_weights, int64_t max_x_elems) : bf16_(bf16_weights) {
  cublasHandle_t h = nullptr;
  check(cublasCreate(&h), "cublasCreate");
  handle_ = h;
  if (bf16_ && max_x_elems > 0) {
    try {
      xb_ = DeviceBuffer(static_cast<size_t>(max_x_elems) * 2);
    } catch (...) {
      cublasDestroy(h);
      throw;
    }
  }
}

Gemm::~Gemm() {
  if (handle_ != nullptr) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

void Gemm::linear(const float* x, int64_t n, int64_t in, const void* w, int64_t out, float* y, float beta, Stream s) {
  RETROINFER_CHECK(n >= 1 && in >= 1 && out >= 1 && n <= INT_MAX && in <= INT_MAX && out <= INT_MAX,
                   "Gemm: shape [", n, ", ", in, "] x [", out, ", ", in, "]^T outside cuBLAS's int range");
  auto h = static_cast<cublasHandle_t>(handle_);
  auto st = static_cast<cudaStream_t>(s);
  check(cublasSetStream(h, st), "cublasSetStream");
  const float alpha = 1.0f;
  // cuBLAS is column-major: row-major y [n, out] is C [out, n] (ldc = out); row-major W [out, in] is
  // [in, out] (lda = in), taken transposed; row-major x [n, in] is B [in, n] (ldb = in).
  const int m = static_cast<int>(out), nn = static_cast<int>(n), k = static_cast<int>(in);
  if (bf16_) {
    RETROINFER_CHECK(static_cast<size_t>(n * in) * 2 <= xb_.bytes(), "Gemm: ", n * in,
                     " activations exceed the bf16 workspace of ", xb_.bytes() / 2);
    detail::launch_check(f32_to_bf16_array(x, xb_.as<uint16_t>(), static_cast<size_t>(n * in), st), "f32_to_bf16",
                         st);
    check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &alpha, w, CUDA_R_16BF, k, xb_.data(), CUDA_R_16BF, k,
                       &beta, y, CUDA_R_32F, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx(bf16)");
  } else {
    check(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &alpha, w, CUDA_R_32F, k, x, CUDA_R_32F, k, &beta, y,
                       CUDA_R_32F, m, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx(f32)");
  }
  detail::launch_check(cudaSuccess, "cublasGemmEx", st);
}

}  // namespace retroinfer::cuda::model
