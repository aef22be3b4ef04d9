// Priorities of the decode step's streams (host side), and the graph instantiation that keeps them.
#pragma once

#include <cuda_runtime.h>

namespace retroinfer::cuda::detail {

// Priorities of the decode step's streams on the current device (lower numbers run first). The block
// scheduler starts a waiting kernel's blocks in priority order as multiprocessors free up, so the small grids
// that the critical path waits on (`urgent`: the wave buffer's side stream, its apply and ring) start ahead of
// the sessions' own work (`compute`), which stays above the default priority of streams the engine does not own.
struct StreamPriorities {
  int urgent = 0, compute = 0;
};
StreamPriorities stream_priorities();

// Graphs run every kernel at the priority of the stream they are launched into unless instantiated with
// this flag; capture copies each kernel's stream priority into its node.
inline constexpr unsigned long long kGraphInstantiateFlags = cudaGraphInstantiateFlagUseNodePriority;

}  // namespace retroinfer::cuda::detail
