// Test-only fault injection: named points in the library where an allocation or a step can be made to fail on
// demand, so that tests reach the error paths that real exhaustion or device faults take (docs/reliability.md).
//
// Every point is disarmed unless a test arms it through this API; nothing reads the environment. A disarmed
// point costs one relaxed atomic load (no point is armed) on its path. When a point fires, the code at the point
// fails the way the real fault would: an allocation reports the CUDA error (cudaErrorMemoryAllocation) or
// throws Error as for exhausted host memory, a decode step throws Error; each message says "injected".
//
// Threading contract: arm / disarm / fired / should_fail may be called from any thread at once; a point's
// skip and fail counts are consumed atomically, so with several threads passing a point exactly `times` of the
// passes after the first `skip` fail (which thread's pass fails is not specified).
#pragma once

#include <atomic>
#include <cstdint>
#include <string_view>

namespace retroinfer::fault {

enum class Point : int {
  kDeviceAlloc = 0,     // DeviceBuffer's cudaMalloc (kernels): "out of memory" from the device
  kPinnedHostAlloc,     // PinnedHost (both its paths) and the runner's cudaMallocHost staging buffers
  kHostKvAppend,        // the CPU KV cache growing by a token (KvCache::append): host memory exhausted
  kDecodeStep,          // one decode step of a sequence (CPU Session, CudaSession): the step fails
  kSnapshotWrite,       // a snapshot's section written to its temporary file (save_snapshot): the disk fails
  kCount
};

std::string_view point_name(Point p);

// Arms `p`: the next `skip` passes succeed, then `times` passes fail (times < 0: every pass until disarmed).
// Re-arming resets the point's counts.
void arm(Point p, int64_t skip = 0, int64_t times = 1);
void disarm(Point p);
void disarm_all();
// Failures injected at `p` since it was last armed.
int64_t fired(Point p);
// Passes through `p` (failed or not) since it was last armed: arm(p, 0, 0) counts a workload's passes without
// failing any, so that a test can then fail exactly the last one (mid-session).
int64_t passes(Point p);

namespace detail {
extern std::atomic<int> g_armed_points;  // how many points are armed: the fast path's only read
bool should_fail_armed(Point p);
}  // namespace detail

// Called at the point: true when this pass must fail (the pass is counted).
inline bool should_fail(Point p) {
  return detail::g_armed_points.load(std::memory_order_relaxed) != 0 && detail::should_fail_armed(p);
}

// Arms a point for one scope (a test), disarming it at the end.
class ScopedFault {
 public:
  explicit ScopedFault(Point p, int64_t skip = 0, int64_t times = 1) : p_(p) { arm(p, skip, times); }
  ~ScopedFault() { disarm(p_); }
  ScopedFault(const ScopedFault&) = delete;
  ScopedFault& operator=(const ScopedFault&) = delete;
  int64_t fired() const { return fault::fired(p_); }

 private:
  Point p_;
};

}  // namespace retroinfer::fault
