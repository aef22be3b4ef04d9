// The driver's tensor-map encoder for the 2-D / 3-D tensor-map copies (TMA) of decode_dense.cu and
// score_clusters.cu, without linking against libcuda, and the per-thread cache of their encodings.
#pragma once

#include <cuda.h>  // CUtensorMap, cuTensorMapEncodeTiled's declaration
#include <cuda_runtime.h>  // cudaError_t

namespace retroinfer::cuda::detail {

using TensorMapEncode = decltype(&cuTensorMapEncodeTiled);

// cuTensorMapEncodeTiled, looked up once through the runtime (cudaGetDriverEntryPointByVersion, CUDA 12.0
// ABI); null where the driver has none (the callers then fall back to 1-D bulk copies).
TensorMapEncode tensor_map_encoder();

// The last kEntries encodings of a kind of tensor maps, per host thread: the maps depend only on a few
// pointers and shapes (Key, with operator==), which a layer keeps from one decode to the next, and encoding
// is host work on every launch. get(key, maps, encode) copies the cached Maps on a hit; on a miss it calls
// encode(&maps) (a cudaError_t; nothing is cached on failure) and stores the result over the oldest entry.
// Use one instance per kind (a function-local thread_local).
template <class Key, class Maps, int kEntries = 64>
class TensorMapCache {
 public:
  template <class Encode>
  cudaError_t get(const Key& key, Maps* maps, Encode&& encode) {
    for (int i = 0; i < filled_; ++i)
      if (entries_[i].key == key) {
        *maps = entries_[i].maps;
        return cudaSuccess;
      }
    const cudaError_t e = encode(maps);
    if (e != cudaSuccess) return e;
    entries_[next_] = Entry{key, *maps};
    next_ = (next_ + 1) % kEntries;
    filled_ = filled_ < kEntries ? filled_ + 1 : kEntries;
    return cudaSuccess;
  }

 private:
  struct Entry {
    Key key;
    Maps maps;
  };
  Entry entries_[kEntries];
  int filled_ = 0, next_ = 0;
};

}  // namespace retroinfer::cuda::detail
