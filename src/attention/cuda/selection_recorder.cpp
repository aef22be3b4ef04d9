// Cluster-trace recording for the CUDA retro layer (selection_recorder.h).
#include "attention/cuda/selection_recorder.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "kernels/cuda_check.h"
#include "retroinfer/cluster_trace.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda {

SelectionRecorder::~SelectionRecorder() {
  try {
    drain();
  } catch (...) {
  }
  if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

void SelectionRecorder::set_trace(ClusterTraceWriter* trace, int layer, int first_seq, int num_seqs, int num_heads_kv) {
  drain();
  RETROINFER_CHECK(num_heads_kv >= 1 && num_seqs >= 1, "SelectionRecorder: num_seqs and num_heads_kv must be >= 1");
  heads_ = num_seqs * num_heads_kv;
  trace_ = trace;
  layer_ = layer;
  first_seq_ = first_seq;
  heads_kv_ = num_heads_kv;
}

void SelectionRecorder::restart() {
  drain();
  step_ = 0;
}

void SelectionRecorder::after_decode(const RetroLayer& layer, int64_t num_tokens, Stream s) {
  drain();
  if (trace_ == nullptr) return;
  const int H = heads_;
  const int n_r = layer.indexed_tokens() > 0 ? layer.n_retrieval() : 0;
  const int C = layer.indexed_tokens() > 0 ? layer.num_clusters() : 0;
  const size_t id_bytes = std::max<size_t>(size_t(H) * n_r * 4, 4), size_bytes = std::max<size_t>(size_t(H) * C * 4, 4);
  if (ids_.bytes() < id_bytes) ids_ = PinnedHost(id_bytes * 2, /*allow_register=*/false);  // x2: index growth
  if (sizes_.bytes() < size_bytes) sizes_ = PinnedHost(size_bytes * 2, /*allow_register=*/false);
  if (event_ == nullptr) {
    cudaEvent_t e = nullptr;
    RETROINFER_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    event_ = e;
  }
  if (n_r > 0 || C > 0)
    layer.copy_selection_async(static_cast<int32_t*>(ids_.host()), static_cast<int32_t*>(sizes_.host()), s);
  RETROINFER_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(s)));
  pending_ = true;
  pending_heads_ = H;
  pending_n_r_ = n_r;
  pending_clusters_ = C;
  pending_tokens_ = num_tokens;
}

void SelectionRecorder::drain() {
  if (!pending_) return;
  pending_ = false;
  RETROINFER_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
  const auto* ids = static_cast<const int32_t*>(ids_.host());
  const auto* sizes = static_cast<const int32_t*>(sizes_.host());
  ClusterTraceRecord r;
  r.step = step_++;
  r.layer = layer_;
  r.num_clusters = pending_clusters_;
  r.context_tokens = pending_tokens_;
  for (int f = 0; f < pending_heads_; ++f) {
    r.seq = first_seq_ + f / heads_kv_;
    r.head = f % heads_kv_;
    r.ids.clear();
    r.sizes.clear();
    for (int j = 0; j < pending_n_r_; ++j) {
      const int32_t c = ids[size_t(f) * pending_n_r_ + j];
      if (c < 0) continue;  // padding past the head's selection
      r.ids.push_back(c);
      r.sizes.push_back(sizes[size_t(f) * pending_clusters_ + c]);
    }
    trace_->write(r);
  }
}

}  // namespace retroinfer::cuda
