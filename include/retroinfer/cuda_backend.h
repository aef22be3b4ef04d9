// Host-only view of the CUDA backend (no CUDA headers here).
#pragma once

#include <string>

namespace retroinfer::cuda {

// True when this build has the CUDA backend and a usable device is present. Any CUDA error while
// asking (no driver, no device, a static runtime on a machine with no GPU) counts as "no GPU".
bool device_available();
// "NVIDIA H200 (sm_90, 139 GiB)" or why none is usable.
std::string device_description();

}  // namespace retroinfer::cuda
