// The driver's tensor-map encoder for the 2-D / 3-D tensor-map copies (TMA) of decode_dense.cu and
// score_stream.cu, without linking against libcuda.
#pragma once

#include <cuda.h>  // CUtensorMap, cuTensorMapEncodeTiled's declaration

namespace retroinfer::cuda::detail {

using TensorMapEncode = decltype(&cuTensorMapEncodeTiled);

// cuTensorMapEncodeTiled, looked up once through the runtime (cudaGetDriverEntryPointByVersion, CUDA 12.0
// ABI); null where the driver has none (the callers then fall back to 1-D bulk copies).
TensorMapEncode tensor_map_encoder();

}  // namespace retroinfer::cuda::detail
