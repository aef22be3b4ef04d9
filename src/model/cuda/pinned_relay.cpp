// PinnedRelay (pinned_relay.h): two pinned buffers of kRelayBytes; pieces are cut into chunks that fit one,
// copied in batches that fill one.
#include "model/cuda/pinned_relay.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include "buffer/cuda/pinned_host.h"
#include "kernels/cuda_check.h"

namespace retroinfer::cuda {
namespace {

constexpr size_t kRelayBytes = size_t{64} << 20;

struct Relay {
  std::mutex mu;
  PinnedHost buf[2];
  cudaEvent_t done[2] = {nullptr, nullptr};
  void ensure() {
    if (buf[0].bytes() != 0) return;
    for (int b = 0; b < 2; ++b) {
      buf[b] = PinnedHost(kRelayBytes);
      RETROINFER_CUDA_CHECK(cudaEventCreateWithFlags(&done[b], cudaEventDisableTiming));
    }
  }
};

Relay& relay() {
  static Relay* r = new Relay;  // kept for the process (the CUDA context may be gone at static destruction)
  return *r;
}

// The pieces cut so that each fits one buffer: whole rows where they fit, else one row in chunks.
std::vector<RelayPiece> cut(std::span<const RelayPiece> pieces) {
  std::vector<RelayPiece> out;
  for (const RelayPiece& p : pieces) {
    if (p.width == 0 || p.rows == 0) continue;
    if (p.width <= kRelayBytes) {
      const size_t per = kRelayBytes / p.width;
      for (size_t r = 0; r < p.rows; r += per) {
        RelayPiece q = p;
        q.host = p.host + r * p.width;
        q.device = p.device + r * p.device_pitch;
        q.rows = std::min(per, p.rows - r);
        out.push_back(q);
      }
    } else {
      for (size_t r = 0; r < p.rows; ++r)
        for (size_t x = 0; x < p.width; x += kRelayBytes) {
          RelayPiece q;
          q.host = p.host + r * p.width + x;
          q.device = p.device + r * p.device_pitch + x;
          q.width = std::min(kRelayBytes, p.width - x);
          q.rows = 1;
          q.device_pitch = q.width;
          out.push_back(q);
        }
    }
  }
  return out;
}

// Batches of consecutive pieces that fill one buffer: [begin, end) and their offsets in it.
struct Batch {
  size_t begin = 0, end = 0;
  std::vector<size_t> offset;
};
std::vector<Batch> batches(const std::vector<RelayPiece>& pieces) {
  std::vector<Batch> out;
  size_t i = 0;
  while (i < pieces.size()) {
    Batch b;
    b.begin = i;
    size_t used = 0;
    while (i < pieces.size() && used + pieces[i].width * pieces[i].rows <= kRelayBytes) {
      b.offset.push_back(used);
      used += pieces[i].width * pieces[i].rows;
      ++i;
    }
    b.end = i;
    out.push_back(std::move(b));
  }
  return out;
}

// Host-side copies of one batch (host <-> buffer) in spans of at most kSpanBytes over the OpenMP threads, so
// that a batch of one large piece (a snapshot's context: rows of tens of MB) spreads as well as many small ones.
constexpr size_t kSpanBytes = size_t{1} << 20;
void host_copies(const std::vector<RelayPiece>& pieces, const Batch& b, uint8_t* buf, bool into_buffer) {
  struct Span {
    uint8_t* host;
    uint8_t* staged;
    size_t bytes;
  };
  std::vector<Span> spans;
  for (size_t k = 0; k < b.end - b.begin; ++k) {
    const RelayPiece& p = pieces[b.begin + k];
    const size_t bytes = p.width * p.rows;  // the piece's host rows are contiguous
    for (size_t x = 0; x < bytes; x += kSpanBytes)
      spans.push_back({p.host + x, buf + b.offset[k] + x, std::min(kSpanBytes, bytes - x)});
  }
  const int64_t n = static_cast<int64_t>(spans.size());
#pragma omp parallel for schedule(dynamic, 4) if (n > 1)
  for (int64_t i = 0; i < n; ++i) {
    const Span& sp = spans[i];
    if (into_buffer)
      std::memcpy(sp.staged, sp.host, sp.bytes);
    else
      std::memcpy(sp.host, sp.staged, sp.bytes);
  }
}

// One batch's DMA between its buffer and the device, queued on st.
void queue_dma(const std::vector<RelayPiece>& pieces, const Batch& b, uint8_t* buf, bool to_device, cudaStream_t st) {
  for (size_t i = b.begin; i < b.end; ++i) {
    const RelayPiece& p = pieces[i];
    uint8_t* staged = buf + b.offset[i - b.begin];
    if (to_device)
      RETROINFER_CUDA_CHECK(cudaMemcpy2DAsync(p.device, p.device_pitch, staged, p.width, p.width, p.rows,
                                              cudaMemcpyHostToDevice, st));
    else
      RETROINFER_CUDA_CHECK(cudaMemcpy2DAsync(staged, p.width, p.device, p.device_pitch, p.width, p.rows,
                                              cudaMemcpyDeviceToHost, st));
  }
}

}  // namespace

void relay_to_device(std::span<const RelayPiece> pieces_in, Stream stream) {
  Relay& r = relay();
  std::lock_guard<std::mutex> lk(r.mu);
  r.ensure();
  auto st = static_cast<cudaStream_t>(stream);
  const std::vector<RelayPiece> pieces = cut(pieces_in);
  const std::vector<Batch> bs = batches(pieces);
  for (size_t k = 0; k < bs.size(); ++k) {
    const int b = static_cast<int>(k % 2);
    if (k >= 2) RETROINFER_CUDA_CHECK(cudaEventSynchronize(r.done[b]));  // its previous batch is on the device
    auto* buf = static_cast<uint8_t*>(r.buf[b].host());
    host_copies(pieces, bs[k], buf, true);
    queue_dma(pieces, bs[k], buf, true, st);
    RETROINFER_CUDA_CHECK(cudaEventRecord(r.done[b], st));
  }
  RETROINFER_CUDA_CHECK(cudaStreamSynchronize(st));
}

void relay_to_host(std::span<const RelayPiece> pieces_in, Stream stream) {
  Relay& r = relay();
  std::lock_guard<std::mutex> lk(r.mu);
  r.ensure();
  auto st = static_cast<cudaStream_t>(stream);
  const std::vector<RelayPiece> pieces = cut(pieces_in);
  const std::vector<Batch> bs = batches(pieces);
  // Batch k's DMA into buffer k % 2 is queued before batch k - 1 is copied out of the other one.
  auto queue = [&](size_t k) {
    const int b = static_cast<int>(k % 2);
    queue_dma(pieces, bs[k], static_cast<uint8_t*>(r.buf[b].host()), false, st);
    RETROINFER_CUDA_CHECK(cudaEventRecord(r.done[b], st));
  };
  auto drain = [&](size_t k) {
    const int b = static_cast<int>(k % 2);
    RETROINFER_CUDA_CHECK(cudaEventSynchronize(r.done[b]));
    host_copies(pieces, bs[k], static_cast<uint8_t*>(r.buf[b].host()), false);
  };
  for (size_t k = 0; k < bs.size(); ++k) {
    queue(k);
    if (k >= 1) drain(k - 1);
  }
  if (!bs.empty()) drain(bs.size() - 1);
}

}  // namespace retroinfer::cuda
