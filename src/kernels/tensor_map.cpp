#include "kernels/tensor_map.h"

#include <cuda_runtime.h>

namespace retroinfer::cuda::detail {

TensorMapEncode tensor_map_encoder() {
  static const TensorMapEncode encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<TensorMapEncode>(fn);
  }();
  return encode;
}

}  // namespace retroinfer::cuda::detail
