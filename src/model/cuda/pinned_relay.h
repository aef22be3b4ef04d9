// Copies between pageable host memory (prefix K/V blocks, snapshots) and device memory through two pinned
// buffers: host threads fill one (or empty it) while the other's DMA runs, so the copy goes at the link's speed
// instead of the driver's pageable path (which stages through its own small pinned buffers in the calling
// thread). The buffers are allocated once per process, at the first copy, and kept.
//
// Threading contract: any thread; one relay at a time (a process-wide lock).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "retroinfer/cuda_device.h"

namespace retroinfer::cuda {

// A 2-D piece: `rows` rows of `width` bytes, contiguous on the host (pitch = width) and `device_pitch` bytes
// apart on the device.
struct RelayPiece {
  uint8_t* host = nullptr;
  uint8_t* device = nullptr;
  size_t width = 0, rows = 0, device_pitch = 0;
};

// Host -> device; returns once every byte is on the device (the host memory may go).
void relay_to_device(std::span<const RelayPiece> pieces, Stream stream);
// Device -> host; returns once every byte is on the host. The device data must be ready on `stream`.
void relay_to_host(std::span<const RelayPiece> pieces, Stream stream);

}  // namespace retroinfer::cuda
