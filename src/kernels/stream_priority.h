// Priorities of the decode step's streams (host side), and the graph instantiation that keeps them.
#pragma once

#include <cuda_runtime.h>

namespace retroinfer::cuda::detail {

// Priorities of the decode step's streams on the current device (lower numbers run first). The block
// scheduler starts a waiting kernel's blocks in priority order as multiprocessors free up, so work on the
// critical path (`compute`: sessions' streams) starts ahead of blocks of side work queued before it
// (`background`: the wave buffer's PCIe-bound misses), and the small grids that the critical path waits on
// (`urgent`: the wave buffer's apply) ahead of both.
struct StreamPriorities {
  int urgent = 0, compute = 0, background = 0;
};
StreamPriorities stream_priorities();

// Graphs run every kernel at the priority of the stream they are launched into unless instantiated with
// this flag; capture copies each kernel's stream priority into its node.
inline constexpr unsigned long long kGraphInstantiateFlags = cudaGraphInstantiateFlagUseNodePriority;

}  // namespace retroinfer::cuda::detail
