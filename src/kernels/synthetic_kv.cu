// cuda::SyntheticKv: the fidelity tool's synthetic K/V generated per KV head on the host (parallel
// threads), kept in pinned memory and copied into layers' K/V buffers.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <exception>
#include <thread>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/synthetic_kv.h"
#include "core/splitmix.h"
#include "retroinfer/error.h"
#include "retroinfer/kv_cache.h"

namespace retroinfer::cuda {

eval::SyntheticConfig synthetic_kv_head_config(const SyntheticKvShape& shape, int h) {
  eval::SyntheticConfig c;
  c.num_heads_q = 1;
  c.num_heads_kv = 1;
  c.head_dim = shape.head_dim;
  c.context_tokens = shape.tokens;
  c.decode_steps = 1;
  c.seed = SyntheticKv::head_seed(shape.seed, h);
  c.rope_theta = shape.rope_theta;
  c.rope_llama3_factor = shape.rope_llama3_factor;
  return c;
}

uint64_t SyntheticKv::head_seed(uint64_t seed, int h) {
  uint64_t s = seed ^ (static_cast<uint64_t>(h) + 1) * 0x9e3779b97f4a7c15ull;
  return eval::splitmix64_next(s);
}

struct SyntheticKv::Impl {
  SyntheticKvShape shape;
  uint16_t* pinned = nullptr;  // [2, num_heads_kv, tokens, head_dim] bf16: keys then values
  size_t bytes = 0;
  double seconds = 0.0;
  size_t head_elems() const { return static_cast<size_t>(shape.tokens) * shape.head_dim; }
  ~Impl() {
    if (pinned) cudaFreeHost(pinned);  // no throw from a destructor; a failure here leaks at worst
  }
};

SyntheticKv::SyntheticKv(const SyntheticKvShape& shape) : impl_(new Impl) {
  RETROINFER_CHECK(shape.num_heads_kv >= 1 && shape.num_heads_kv <= 1024, "SyntheticKv: num_heads_kv = ",
                   shape.num_heads_kv, " is out of range [1, 1024]");
  auto& m = *impl_;
  m.shape = shape;
  // Clear errors before any allocation.
  for (int h = 0; h < shape.num_heads_kv; ++h) eval::validate(synthetic_kv_head_config(shape, h));
  m.bytes = 2 * static_cast<size_t>(shape.num_heads_kv) * m.head_elems() * sizeof(uint16_t);
  const cudaError_t e = cudaMallocHost(reinterpret_cast<void**>(&m.pinned), m.bytes);
  if (e != cudaSuccess) {
    m.pinned = nullptr;
    RETROINFER_FAIL("SyntheticKv: cudaMallocHost of ", m.bytes, " bytes of pinned host memory failed: ",
                    cudaGetErrorString(e), "; use fewer tokens or free host memory");
  }
  const auto t0 = std::chrono::steady_clock::now();
  // One thread per KV head (heads are independent generator runs); at most hardware_concurrency at once.
  const int H = shape.num_heads_kv;
  const int workers = std::max(1, std::min<int>(H, static_cast<int>(std::thread::hardware_concurrency())));
  std::vector<std::exception_ptr> errors(H);
  auto run_head = [&](int h) {
    try {
      KvCache kv(1, shape.head_dim, DType::kBF16);
      eval::generate_synthetic(synthetic_kv_head_config(shape, h), kv);
      const size_t row = static_cast<size_t>(kv.row_bytes());
      RETROINFER_CHECK(kv.size() == shape.tokens && row == shape.head_dim * sizeof(uint16_t),
                       "SyntheticKv: the generator returned ", kv.size(), " tokens");
      std::memcpy(m.pinned + static_cast<size_t>(h) * m.head_elems(), kv.key_row(0, 0), row * shape.tokens);
      std::memcpy(m.pinned + (static_cast<size_t>(H) + h) * m.head_elems(), kv.value_row(0, 0), row * shape.tokens);
    } catch (...) {
      errors[h] = std::current_exception();
    }
  };
  for (int h0 = 0; h0 < H; h0 += workers) {
    std::vector<std::thread> pool;
    for (int h = h0; h < std::min(H, h0 + workers); ++h) pool.emplace_back(run_head, h);
    for (auto& t : pool) t.join();
  }
  for (auto& err : errors)
    if (err) std::rethrow_exception(err);
  m.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

SyntheticKv::~SyntheticKv() = default;

void SyntheticKv::fill(uint16_t* k, uint16_t* v, int num_seqs, int64_t kv_stride, Stream s) const {
  const auto& m = *impl_;
  const SyntheticKvShape& sh = m.shape;
  RETROINFER_CHECK(k != nullptr && v != nullptr, "SyntheticKv::fill: null K or V buffer");
  RETROINFER_CHECK(num_seqs >= 1, "SyntheticKv::fill: num_seqs must be >= 1, got ", num_seqs);
  RETROINFER_CHECK(kv_stride >= sh.tokens, "SyntheticKv::fill: kv_stride ", kv_stride, " is shorter than the ",
                   sh.tokens, " generated tokens");
  auto st = static_cast<cudaStream_t>(s);
  // One 1-D copy per (sequence, head): a head's rows are contiguous on both sides (2-D copies would need
  // pitches of kv_stride rows, which exceed the 2-D copy limits at millions of tokens).
  const size_t head_bytes = m.head_elems() * sizeof(uint16_t);
  const size_t dst_head = static_cast<size_t>(kv_stride) * sh.head_dim;  // elements between heads
  for (int which = 0; which < 2; ++which) {
    uint16_t* dst = which == 0 ? k : v;
    const uint16_t* src = m.pinned + static_cast<size_t>(which) * sh.num_heads_kv * m.head_elems();
    for (int q = 0; q < num_seqs; ++q)
      for (int h = 0; h < sh.num_heads_kv; ++h) {
        uint16_t* to = dst + (static_cast<size_t>(q) * sh.num_heads_kv + h) * dst_head;
        if (q == 0)
          RETROINFER_CUDA_CHECK(cudaMemcpyAsync(to, src + static_cast<size_t>(h) * m.head_elems(), head_bytes,
                                                cudaMemcpyHostToDevice, st));
        else  // from sequence 0, already on the device (stream order)
          RETROINFER_CUDA_CHECK(cudaMemcpyAsync(to, dst + static_cast<size_t>(h) * dst_head, head_bytes,
                                                cudaMemcpyDeviceToDevice, st));
      }
  }
}

const SyntheticKvShape& SyntheticKv::shape() const { return impl_->shape; }
const uint16_t* SyntheticKv::host_keys(int h) const {
  RETROINFER_CHECK(h >= 0 && h < impl_->shape.num_heads_kv, "SyntheticKv::host_keys: head ", h, " out of range");
  return impl_->pinned + static_cast<size_t>(h) * impl_->head_elems();
}
const uint16_t* SyntheticKv::host_values(int h) const {
  RETROINFER_CHECK(h >= 0 && h < impl_->shape.num_heads_kv, "SyntheticKv::host_values: head ", h, " out of range");
  return impl_->pinned + (static_cast<size_t>(impl_->shape.num_heads_kv) + h) * impl_->head_elems();
}
int64_t SyntheticKv::host_bytes() const { return static_cast<int64_t>(impl_->bytes); }
double SyntheticKv::generate_seconds() const { return impl_->seconds; }

}  // namespace retroinfer::cuda
