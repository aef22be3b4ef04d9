// PinnedHost: see pinned_host.h.
#include "buffer/cuda/pinned_host.h"

#include <cuda_runtime.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cuda_check.h"
#include "retroinfer/error.h"
#include "retroinfer/fault_injection.h"

namespace retroinfer::cuda {
namespace {

std::atomic<size_t> g_register_pin_threshold{kRegisterPinBytes};

// Faults [p, p + n) in from `threads` workers, each zeroing a contiguous, 2 MiB-aligned slice (so that a
// huge page is touched by one worker only).
void touch_parallel(char* p, size_t n, int threads) {
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t slices = std::max<size_t>(1, std::min<size_t>(threads, (n + kHuge - 1) / kHuge));
  const size_t per = ((n / slices + kHuge - 1) / kHuge) * kHuge;
  std::vector<std::thread> pool;
  for (size_t i = 1; i < slices; ++i) {
    const size_t b = i * per;
    if (b >= n) break;
    pool.emplace_back([p, b, len = std::min(per, n - b)] { std::memset(p + b, 0, len); });
  }
  std::memset(p, 0, std::min(per, n));
  for (auto& t : pool) t.join();
}

}  // namespace

size_t register_pin_threshold() { return g_register_pin_threshold.load(); }
void set_register_pin_threshold(size_t bytes) { g_register_pin_threshold.store(bytes); }

PinnedHost::PinnedHost(size_t bytes, bool allow_register, int threads) : bytes_(bytes) {
  if (bytes == 0) return;
  if (allow_register && bytes >= register_pin_threshold()) {
    void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p != MAP_FAILED) {
#ifdef MADV_HUGEPAGE
      madvise(p, bytes, MADV_HUGEPAGE);  // advisory: without THP the 4 KiB pages still fault in parallel
#endif
      const int hw = static_cast<int>(std::thread::hardware_concurrency());
      const int workers = threads > 0 ? threads : std::clamp(hw, 1, 16);
      try {
        touch_parallel(static_cast<char*>(p), bytes, workers);
      } catch (...) {  // std::system_error from std::thread: fall back below
        munmap(p, bytes);
        p = MAP_FAILED;
      }
    }
    if (p != MAP_FAILED) {
      const cudaError_t e = fault::should_fail(fault::Point::kPinnedHostAlloc)
                                ? cudaErrorMemoryAllocation
                                : cudaHostRegister(p, bytes, cudaHostRegisterMapped | cudaHostRegisterPortable);
      if (e == cudaSuccess) {
        host_ = p;
        mapped_ = bytes;
        registered_ = true;
        const cudaError_t g = cudaHostGetDevicePointer(&dev_, host_, 0);
        if (g != cudaSuccess) {
          release();
          RETROINFER_FAIL("PinnedHost: cudaHostGetDevicePointer failed: ", cudaGetErrorString(g));
        }
        return;
      }
      (void)cudaGetLastError();  // clear the registration error; try cudaHostAlloc
      munmap(p, bytes);
    }
  }
  const cudaError_t e = fault::should_fail(fault::Point::kPinnedHostAlloc)
                            ? cudaErrorMemoryAllocation
                            : cudaHostAlloc(&host_, bytes, cudaHostAllocMapped | cudaHostAllocPortable);
  if (e != cudaSuccess) {
    host_ = nullptr;
    RETROINFER_FAIL("PinnedHost: pinning ", bytes, " bytes of host memory failed: ", cudaGetErrorString(e),
                    " (plan the batch with the memory planner; free host memory or lower the batch / context)");
  }
  const cudaError_t g = cudaHostGetDevicePointer(&dev_, host_, 0);
  if (g != cudaSuccess) {
    release();
    RETROINFER_FAIL("PinnedHost: cudaHostGetDevicePointer failed: ", cudaGetErrorString(g));
  }
}

void PinnedHost::release() noexcept {
  if (host_ == nullptr) return;
  if (registered_) {
    cudaHostUnregister(host_);  // no throw from cleanup; a failure here is not actionable
    munmap(host_, mapped_);
  } else {
    cudaFreeHost(host_);
  }
  host_ = dev_ = nullptr;
  registered_ = false;
  mapped_ = 0;
}

PinnedHost::~PinnedHost() { release(); }

PinnedHost::PinnedHost(PinnedHost&& o) noexcept
    : host_(std::exchange(o.host_, nullptr)),
      dev_(std::exchange(o.dev_, nullptr)),
      bytes_(std::exchange(o.bytes_, 0)),
      mapped_(std::exchange(o.mapped_, 0)),
      registered_(std::exchange(o.registered_, false)) {}

PinnedHost& PinnedHost::operator=(PinnedHost&& o) noexcept {
  if (this != &o) {
    release();
    host_ = std::exchange(o.host_, nullptr);
    dev_ = std::exchange(o.dev_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    mapped_ = std::exchange(o.mapped_, 0);
    registered_ = std::exchange(o.registered_, false);
  }
  return *this;
}

}  // namespace retroinfer::cuda
