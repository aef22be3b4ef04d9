// Fault injection points: see include/retroinfer/fault_injection.h.
#include "retroinfer/fault_injection.h"

#include <array>
#include <mutex>

#include "retroinfer/error.h"

namespace retroinfer::fault {
namespace detail {
std::atomic<int> g_armed_points{0};
}  // namespace detail

namespace {

struct PointState {
  bool armed = false;
  int64_t skip = 0;
  int64_t times = 0;  // < 0: unbounded
  int64_t fired = 0;
  int64_t passes = 0;
};

// The slow path only (a point is armed): one mutex for all points keeps skip / times / fired consistent.
std::mutex g_mu;
std::array<PointState, static_cast<size_t>(Point::kCount)> g_points;

PointState& state(Point p) {
  const auto i = static_cast<size_t>(p);
  RETROINFER_CHECK(i < g_points.size(), "fault injection: unknown point ", static_cast<int>(p));
  return g_points[i];
}

}  // namespace

std::string_view point_name(Point p) {
  switch (p) {
    case Point::kDeviceAlloc: return "device_alloc";
    case Point::kPinnedHostAlloc: return "pinned_host_alloc";
    case Point::kHostKvAppend: return "host_kv_append";
    case Point::kDecodeStep: return "decode_step";
    case Point::kSnapshotWrite: return "snapshot_write";
    case Point::kCount: break;
  }
  return "unknown";
}

void arm(Point p, int64_t skip, int64_t times) {
  RETROINFER_CHECK(skip >= 0, "fault injection: skip must be >= 0, got ", skip);
  std::lock_guard<std::mutex> lk(g_mu);
  PointState& s = state(p);
  if (!s.armed) detail::g_armed_points.fetch_add(1);
  s = PointState{true, skip, times, 0, 0};
}

void disarm(Point p) {
  std::lock_guard<std::mutex> lk(g_mu);
  PointState& s = state(p);
  if (s.armed) detail::g_armed_points.fetch_sub(1);
  s.armed = false;
}

void disarm_all() {
  for (int i = 0; i < static_cast<int>(Point::kCount); ++i) disarm(static_cast<Point>(i));
}

int64_t fired(Point p) {
  std::lock_guard<std::mutex> lk(g_mu);
  return state(p).fired;
}

int64_t passes(Point p) {
  std::lock_guard<std::mutex> lk(g_mu);
  return state(p).passes;
}

namespace detail {
bool should_fail_armed(Point p) {
  std::lock_guard<std::mutex> lk(g_mu);
  PointState& s = state(p);
  if (!s.armed) return false;
  ++s.passes;
  if (s.skip > 0) {
    --s.skip;
    return false;
  }
  if (s.times == 0) return false;
  if (s.times > 0) --s.times;
  ++s.fired;
  return true;
}
}  // namespace detail

}  // namespace retroinfer::fault
