// DeviceBuffer and synchronize().
#include <cmath>
#include <utility>

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.h"
#include "retroinfer/cuda_device.h"
#include "retroinfer/fault_injection.h"

namespace retroinfer::cuda {

void synchronize(Stream s) { RETROINFER_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(s))); }

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  if (bytes == 0) return;
  const cudaError_t e = fault::should_fail(fault::Point::kDeviceAlloc) ? cudaErrorMemoryAllocation : cudaMalloc(&ptr_, bytes);
  if (e != cudaSuccess) {
    ptr_ = nullptr;
    RETROINFER_FAIL("DeviceBuffer: cudaMalloc of ", bytes, " bytes failed: ", cudaGetErrorString(e),
                    " (free device memory or use a smaller batch / context)");
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) cudaFree(ptr_);  // no throw from a destructor; a failure here is not actionable
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept
    : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = std::exchange(o.ptr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void DeviceBuffer::upload(const void* src, size_t bytes, size_t offset) {
  RETROINFER_CHECK(offset + bytes <= bytes_, "DeviceBuffer::upload: ", bytes, " bytes at offset ", offset,
                   " exceed the buffer's ", bytes_, " bytes");
  if (bytes > 0)
    RETROINFER_CUDA_CHECK(cudaMemcpy(static_cast<char*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice));
}

void DeviceBuffer::download(void* dst, size_t bytes, size_t offset) const {
  RETROINFER_CHECK(offset + bytes <= bytes_, "DeviceBuffer::download: ", bytes, " bytes at offset ", offset,
                   " exceed the buffer's ", bytes_, " bytes");
  if (bytes > 0)
    RETROINFER_CUDA_CHECK(cudaMemcpy(dst, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost));
}

void DeviceBuffer::fill_bytes(uint8_t value) {
  if (bytes_ > 0) RETROINFER_CUDA_CHECK(cudaMemset(ptr_, value, bytes_));
}

namespace detail {

int sm_count() {
  static const int n = [] {
    int dev = 0, v = 0;
    RETROINFER_CUDA_CHECK(cudaGetDevice(&dev));
    RETROINFER_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

void validate_layer_shape(const AttentionShape& s, int num_seqs, const char* who) {
  RETROINFER_CHECK(num_seqs >= 1, who, ": num_seqs must be >= 1, got ", num_seqs);
  RETROINFER_CHECK(s.num_heads_q > 0 && s.num_heads_kv > 0 && s.num_heads_q % s.num_heads_kv == 0, who,
                   ": num_heads_q (", s.num_heads_q, ") must be a positive multiple of num_heads_kv (",
                   s.num_heads_kv, ")");
  const int group = s.num_heads_q / s.num_heads_kv;
  RETROINFER_CHECK(group <= kMaxGroup, who, ": GQA group ", group, " exceeds the supported ", kMaxGroup,
                   " query heads per KV head");
  RETROINFER_CHECK(s.head_dim == 64 || s.head_dim == 128, who, ": head_dim ", s.head_dim,
                   " is not supported by the CUDA kernels (64 or 128)");
}

void validate_kv(const void* k, const void* v, int64_t num_tokens, int64_t kv_stride, const char* who) {
  RETROINFER_CHECK(k != nullptr && v != nullptr, who, ": null K or V pointer");
  RETROINFER_CHECK(num_tokens >= 1, who, ": num_tokens must be >= 1, got ", num_tokens);
  RETROINFER_CHECK(kv_stride >= num_tokens, who, ": kv_stride (", kv_stride, ") must be >= num_tokens (",
                   num_tokens, ")");
  RETROINFER_CHECK(num_tokens < (int64_t{1} << 31), who, ": num_tokens ", num_tokens,
                   " exceeds the 2^31 token positions the token lists hold");
}

float effective_scale(float scale, int head_dim) {
  return scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

}  // namespace detail
}  // namespace retroinfer::cuda
