// Cluster-trace recording for the CUDA retro layer (retroinfer/cluster_trace.h): after each decode, the
// retrieval ids and cluster sizes are copied asynchronously into pinned memory behind the decode, with an
// event; the host reads them at the next decode of the same layer (or at drain()), after waiting on that
// event. In generation the host has already waited for the step's logits by then, so the wait costs
// nothing; the copies are H * (n_r + C) * 4 bytes per layer and step.
//
// Threading contract: owned by one LayerAttention and used by its (single) caller thread.
#pragma once

#include <cstdint>

#include "buffer/cuda/pinned_host.h"
#include "retroinfer/cuda_backend.h"

namespace retroinfer {
class ClusterTraceWriter;
}

namespace retroinfer::cuda {

class SelectionRecorder {
 public:
  SelectionRecorder() = default;
  ~SelectionRecorder();  // drains (errors dropped: a destructor does not throw)
  SelectionRecorder(const SelectionRecorder&) = delete;
  SelectionRecorder& operator=(const SelectionRecorder&) = delete;

  // Records to `trace` (nullptr: stops) as `layer` of a RetroLayer of num_seqs sequences; flat head f is
  // sequence first_seq + f / num_heads_kv, KV head f % num_heads_kv. Drains what is pending first.
  void set_trace(ClusterTraceWriter* trace, int layer, int first_seq, int num_seqs, int num_heads_kv);
  bool active() const { return trace_ != nullptr; }
  // A new prompt was indexed: steps count from 0 again (drains first).
  void restart();
  // Writes the pending step's records (waits on its event) and then enqueues this decode's copies on `s`.
  // num_tokens: tokens per sequence after the step's append.
  void after_decode(const RetroLayer& layer, int64_t num_tokens, Stream s);
  // Writes the pending step's records, if any.
  void drain();

 private:
  ClusterTraceWriter* trace_ = nullptr;  // not owned
  int layer_ = 0, first_seq_ = 0, heads_kv_ = 1, heads_ = 1;  // heads_: flat heads
  PinnedHost ids_, sizes_;  // [H, n_r], [H, C] int32 of the pending step
  void* event_ = nullptr;   // cudaEvent_t after the pending step's copies
  bool pending_ = false;
  int pending_heads_ = 0, pending_n_r_ = 0, pending_clusters_ = 0;
  int64_t pending_tokens_ = 0;
  int32_t step_ = 0;        // the next step to record
};

}  // namespace retroinfer::cuda
