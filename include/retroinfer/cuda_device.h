// Host-only view of the CUDA runtime basics (no CUDA headers here): device discovery, streams, an owning
// device buffer, timing, CUDA graphs and bandwidth measurement. Layer: kernels (src/kernels implements it).
// Errors throw retroinfer::Error. Set RETROINFER_CUDA_SYNC=1 to synchronise after every launch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace retroinfer::cuda {


// True when this build has the CUDA backend and a usable device is present. Any CUDA error while
// asking (no driver, no device, a static runtime on a machine with no GPU) counts as "no GPU".
bool device_available();
// "NVIDIA H200 (sm_90, 139 GiB)" or why none is usable.
std::string device_description();

using Stream = void*;  // a cudaStream_t; nullptr is the default stream

// Blocks until all work on `s` is done; throws Error on an asynchronous fault.
void synchronize(Stream s = nullptr);

// Owning device allocation (cudaMalloc). Move-only. Copies are synchronous.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& o) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }
  // Host -> device / device -> host of `bytes` at byte `offset`; throws if out of range.
  void upload(const void* src, size_t bytes, size_t offset = 0);
  void download(void* dst, size_t bytes, size_t offset = 0) const;
  // Sets every byte (0xff makes f32 and bf16 NaN: a sentinel for "never written").
  void fill_bytes(uint8_t value);

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// One 2-D copy inside device memory: `rows` rows of `width` bytes, src_pitch / dst_pitch bytes apart.
struct DeviceCopyPiece {
  const uint8_t* src = nullptr;
  uint8_t* dst = nullptr;
  uint64_t width = 0, rows = 0, src_pitch = 0, dst_pitch = 0;
};
// Every piece in one kernel launch on `s` (thousands of small copies cost one launch, not one each: a prefix's
// K/V blocks x layers); returns once they are done. Pieces must not overlap one another's destinations.
void copy_device_pieces(std::span<const DeviceCopyPiece> pieces, Stream s);

// Device-side test and benchmark data: fills count elements with pseudo-random values (counter-based
// hash, reproducible for a seed) of mean 0 and standard deviation `stddev` (sum of 4 uniforms).
void fill_random_bf16(uint16_t* dst, size_t count, uint64_t seed, float stddev, Stream s = nullptr);
void fill_random_f32(float* dst, size_t count, uint64_t seed, float stddev, Stream s = nullptr);
// Evicts the L2 cache (writes a buffer of twice its size) so the next kernel starts cold.
void flush_l2(Stream s = nullptr);
// Evicts L2 by reading twice its size (no writes): L2 is left holding clean lines, as after a decode step's
// weight reads (benchmarks: the "read" flush; RetroLayer::decode_stage_ms uses it when
// RETROINFER_PHASE_FLUSH=read).
void flush_l2_read(Stream s = nullptr);

// CUDA-event timer: start() and stop() record on the stream; elapsed_ms() waits for stop.
class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(Stream s = nullptr);
  void stop(Stream s = nullptr);
  float elapsed_ms() const;

 private:
  void* start_ = nullptr;  // cudaEvent_t
  void* stop_ = nullptr;
};

// A non-blocking CUDA stream owned by the caller (capture into graphs needs one).
class StreamHandle {
 public:
  StreamHandle();
  ~StreamHandle();
  StreamHandle(const StreamHandle&) = delete;
  StreamHandle& operator=(const StreamHandle&) = delete;
  Stream get() const { return stream_; }

 private:
  Stream stream_ = nullptr;
};

// A CUDA graph captured from the work that `record` issues on `s` (e.g. one RetroLayer::decode), replayed
// with launch(): one launch instead of one per kernel. The captured pointers must stay valid.
class CapturedGraph {
 public:
  template <typename F>
  CapturedGraph(Stream s, F&& record) {
    begin_capture(s);
    record();
    end_capture(s);
  }
  ~CapturedGraph();
  CapturedGraph(const CapturedGraph&) = delete;
  CapturedGraph& operator=(const CapturedGraph&) = delete;
  void launch(Stream s);

 private:
  void begin_capture(Stream s);
  void end_capture(Stream s);
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

// Measured memory bandwidths for the bytes-moved floors of `retroinfer bench decode` (src/kernels/bandwidth.cu).
struct BandwidthFigures {
  double hbm_gb_s = 0.0;  // device-to-device copy, (bytes read + bytes written) / time, GB/s (1e9)
  double h2d_gb_s = 0.0;  // pinned host -> device cudaMemcpyAsync, bytes / time, GB/s
  size_t hbm_bytes = 0, h2d_bytes = 0;  // bytes per copy
  int reps = 0;                         // timed copies per figure (median reported)
};

// Medians of `reps` timed copies (CUDA events) after one warm-up copy each: a device-to-device copy of
// hbm_bytes (large against the 60 MB L2, so it streams from HBM) and a pinned host-to-device copy of
// h2d_bytes. Allocates and frees the buffers; synchronous. Throws Error on CUDA failures.
BandwidthFigures measure_bandwidth(size_t hbm_bytes = size_t{1} << 30, size_t h2d_bytes = size_t{256} << 20,
                                   int reps = 10);

// Free and total device memory (cudaMemGetInfo), bytes.
std::pair<int64_t, int64_t> device_memory_info();
// Asynchronous device-to-device copy on `s` (benchmarks: feed a query trace to a captured graph).
void copy_device_async(void* dst, const void* src, size_t bytes, Stream s);

}  // namespace retroinfer::cuda
