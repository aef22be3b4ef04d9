// Phase split of the GPU k-means builds (bench diagnostics). While set_kmeans_phase_timing(true) is in force
// (kernel_bench --kmeans-phases 1 sets it around one build), each k-means run (kmeans_run.h KMeansRun::run)
// records a CUDA event after every phase on its stream, waits for the last one and adds the elapsed times to
// process-wide totals, which kernel_bench reads (its "kmeans_phases" lines). Off (the default): no event is
// created and nothing waits. Included only from src/index/cuda, src/attention/cuda and bench.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace retroinfer::cuda::detail {

enum KMeansPhase : int {
  kKmMeanInit = 0,    // mean key, centred keys, initial centroids
  kKmAssignSegment,   // every segment-pass assignment
  kKmAssignGlobal,    // every global-pass assignment
  kKmGroup,           // radix sort + CSR offsets, every iteration
  kKmUpdate,          // centroid updates, every iteration
  kKmFinalize,        // value sums, sizes, de-centred centroids
  kKmPhases
};
const char* kmeans_phase_name(int phase);

// The process-wide switch of the phase timing (off by default; thread-safe). The k-means runs live inside
// RetroLayer, so the benchmark turns the timing on around a build rather than per run.
void set_kmeans_phase_timing(bool on);
bool kmeans_phase_timing();

struct KMeansPhaseTotals {
  double ms[kKmPhases] = {};  // summed over the runs
  int64_t runs = 0;
};
KMeansPhaseTotals kmeans_phase_totals();  // thread-safe copy
void kmeans_phase_reset();

// Host-side split of the latest RetroLayer::build (every build records it; kernel_bench reads it after each
// timed build): enqueue = build start until the k-means launches return, wait = from then until the
// stream synchronisation of size_workspace returns (the GPU still working), after = the rest (the host's
// capacity computation and buffer sizing). Milliseconds.
struct BuildHostTimes {
  double enqueue_ms = 0, wait_ms = 0, after_ms = 0;
};
void build_host_times_set(const BuildHostTimes& t);
BuildHostTimes build_host_times_last();

// Events of one run: the constructor records the start, mark(phase) follows the launches of `phase`,
// finish() after the last (waits for it, adds to the totals). Inactive (every call a no-op) unless `on` and
// `st` is not capturing a graph.
class KMeansPhaseEvents {
 public:
  KMeansPhaseEvents(cudaStream_t st, bool on);
  ~KMeansPhaseEvents();
  KMeansPhaseEvents(const KMeansPhaseEvents&) = delete;
  KMeansPhaseEvents& operator=(const KMeansPhaseEvents&) = delete;
  void mark(int phase);
  void finish();

 private:
  cudaStream_t st_;
  bool on_;
  cudaEvent_t start_ = nullptr;
  std::vector<std::pair<int, cudaEvent_t>> marks_;  // (phase ending at the event, event)
};

}  // namespace retroinfer::cuda::detail
