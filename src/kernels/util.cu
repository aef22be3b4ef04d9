// Benchmark and test utilities of the CUDA backend: random device data, L2 eviction, event timing.
#include <cuda_runtime.h>

#include "kernels/common.cuh"
#include "kernels/cuda_check.h"
#include "kernels/stream_priority.h"
#include "retroinfer/cuda_device.h"

namespace retroinfer::cuda {
namespace {

__device__ __forceinline__ uint32_t hash32(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<uint32_t>(x);
}

// Sum of 4 uniforms on [-0.5, 0.5): mean 0, variance 4/12, scaled to `stddev`.
__device__ __forceinline__ float rand_normalish(uint64_t i, uint64_t seed, float stddev) {
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) s += static_cast<float>(hash32(i * 4 + j + seed * 0x9e3779b97f4a7c15ull)) * 2.3283064e-10f - 0.5f;
  return s * stddev * 1.7320508f;  // sqrt(3) = 1 / sqrt(4/12)
}

__global__ void fill_bf16_kernel(uint16_t* dst, size_t n, uint64_t seed, float stddev) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    dst[i] = f32_to_bf16(rand_normalish(i, seed, stddev));
}
__global__ void fill_f32_kernel(float* dst, size_t n, uint64_t seed, float stddev) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x)
    dst[i] = rand_normalish(i, seed, stddev);
}

int fill_blocks(size_t n) { return static_cast<int>(n / 256 + 1 < 32768 ? n / 256 + 1 : 32768); }

}  // namespace

void fill_random_bf16(uint16_t* dst, size_t count, uint64_t seed, float stddev, Stream s) {
  auto st = static_cast<cudaStream_t>(s);
  fill_bf16_kernel<<<fill_blocks(count), 256, 0, st>>>(dst, count, seed, stddev);
  detail::launch_check(cudaSuccess, "fill_random_bf16", st);
}

void fill_random_f32(float* dst, size_t count, uint64_t seed, float stddev, Stream s) {
  auto st = static_cast<cudaStream_t>(s);
  fill_f32_kernel<<<fill_blocks(count), 256, 0, st>>>(dst, count, seed, stddev);
  detail::launch_check(cudaSuccess, "fill_random_f32", st);
}

namespace {
// A scratch buffer of twice the L2 (zeroed once, so the read flush reads defined data).
DeviceBuffer& flush_scratch() {
  static DeviceBuffer scratch = [] {
    int dev = 0, l2 = 0;
    RETROINFER_CUDA_CHECK(cudaGetDevice(&dev));
    RETROINFER_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev));
    DeviceBuffer b(size_t(l2) * 2);
    RETROINFER_CUDA_CHECK(cudaMemset(b.data(), 0, b.bytes()));
    RETROINFER_CUDA_CHECK(cudaDeviceSynchronize());
    return b;
  }();
  return scratch;
}

// Reads every 16 bytes of src (n16 uint4) and stores only if a value is impossible for the zeroed buffer,
// so the loads are kept and nothing is written: L2 ends up holding clean lines of src.
__global__ void read_flush_kernel(const uint4* __restrict__ src, size_t n16, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n16; i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcg(src + i);
    acc |= v.x | v.y | v.z | v.w;
  }
  if (acc == 0xdeadbeefu) *sink = acc;
}
}  // namespace

namespace {
// blockIdx.x: the piece; blockIdx.y strides over its rows; 16-byte moves when every address and length allows.
__global__ void copy_pieces_kernel(const DeviceCopyPiece* __restrict__ pieces) {
  const DeviceCopyPiece p = pieces[blockIdx.x];
  const bool wide =
      ((reinterpret_cast<uintptr_t>(p.src) | reinterpret_cast<uintptr_t>(p.dst) | p.width | p.src_pitch | p.dst_pitch) &
       15) == 0;
  for (uint64_t r = blockIdx.y; r < p.rows; r += gridDim.y) {
    const uint8_t* s = p.src + r * p.src_pitch;
    uint8_t* d = p.dst + r * p.dst_pitch;
    if (wide) {
      for (uint64_t i = threadIdx.x; i < p.width / 16; i += blockDim.x)
        reinterpret_cast<uint4*>(d)[i] = reinterpret_cast<const uint4*>(s)[i];
    } else {
      for (uint64_t i = threadIdx.x; i < p.width; i += blockDim.x) d[i] = s[i];
    }
  }
}
}  // namespace

void copy_device_pieces(std::span<const DeviceCopyPiece> pieces, Stream s) {
  if (pieces.empty()) return;
  RETROINFER_CHECK(pieces.size() < (size_t{1} << 31), "copy_device_pieces: ", pieces.size(), " pieces in one call");
  uint64_t rows = 1;
  for (const DeviceCopyPiece& p : pieces) rows = p.rows > rows ? p.rows : rows;
  auto st = static_cast<cudaStream_t>(s);
  DeviceBuffer list(pieces.size_bytes());
  RETROINFER_CUDA_CHECK(cudaMemcpyAsync(list.data(), pieces.data(), pieces.size_bytes(), cudaMemcpyHostToDevice, st));
  const dim3 grid(static_cast<unsigned>(pieces.size()), static_cast<unsigned>(rows < 64 ? rows : 64));
  copy_pieces_kernel<<<grid, 256, 0, st>>>(list.as<const DeviceCopyPiece>());
  detail::launch_check(cudaSuccess, "copy_device_pieces", st);
  synchronize(s);  // `list` is freed on return
}

void flush_l2(Stream s) {
  DeviceBuffer& scratch = flush_scratch();
  RETROINFER_CUDA_CHECK(cudaMemsetAsync(scratch.data(), 0, scratch.bytes(), static_cast<cudaStream_t>(s)));
}

void flush_l2_read(Stream s) {
  DeviceBuffer& scratch = flush_scratch();
  auto st = static_cast<cudaStream_t>(s);
  read_flush_kernel<<<1024, 256, 0, st>>>(static_cast<const uint4*>(scratch.data()), scratch.bytes() / 16,
                                          static_cast<unsigned*>(scratch.data()));
  detail::launch_check(cudaSuccess, "flush_l2_read", st);
}

EventTimer::EventTimer() {
  cudaEvent_t a, b;
  RETROINFER_CUDA_CHECK(cudaEventCreate(&a));
  RETROINFER_CUDA_CHECK(cudaEventCreate(&b));
  start_ = a;
  stop_ = b;
}
EventTimer::~EventTimer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}
void EventTimer::start(Stream s) {
  RETROINFER_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(start_), static_cast<cudaStream_t>(s)));
}
void EventTimer::stop(Stream s) {
  RETROINFER_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(stop_), static_cast<cudaStream_t>(s)));
}
float EventTimer::elapsed_ms() const {
  RETROINFER_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)));
  float ms = 0.0f;
  RETROINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)));
  return ms;
}

StreamHandle::StreamHandle() {
  cudaStream_t st;
  RETROINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  stream_ = st;
}
StreamHandle::~StreamHandle() { cudaStreamDestroy(static_cast<cudaStream_t>(stream_)); }

void CapturedGraph::begin_capture(Stream s) {
  RETROINFER_CHECK(s != nullptr, "CapturedGraph: capture needs a non-default stream (use StreamHandle)");
  RETROINFER_CUDA_CHECK(cudaStreamBeginCapture(static_cast<cudaStream_t>(s), cudaStreamCaptureModeThreadLocal));
}
void CapturedGraph::end_capture(Stream s) {
  cudaGraph_t g = nullptr;
  RETROINFER_CUDA_CHECK(cudaStreamEndCapture(static_cast<cudaStream_t>(s), &g));
  graph_ = g;
  cudaGraphExec_t e = nullptr;
  RETROINFER_CUDA_CHECK(cudaGraphInstantiate(&e, g, detail::kGraphInstantiateFlags));
  exec_ = e;
}
CapturedGraph::~CapturedGraph() {
  if (exec_ != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_ != nullptr) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
}
void CapturedGraph::launch(Stream s) {
  RETROINFER_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), static_cast<cudaStream_t>(s)));
}

}  // namespace retroinfer::cuda
