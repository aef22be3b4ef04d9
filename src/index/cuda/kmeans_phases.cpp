// Phase split of the GPU k-means builds (kmeans_phases.h).
#include "index/cuda/kmeans_phases.h"

#include <atomic>
#include <mutex>

#include "kernels/cuda_check.h"

namespace retroinfer::cuda::detail {
namespace {
std::mutex g_mutex;
KMeansPhaseTotals g_totals;
std::atomic<bool> g_timing{false};
}  // namespace

void set_kmeans_phase_timing(bool on) { g_timing.store(on); }
bool kmeans_phase_timing() { return g_timing.load(); }

const char* kmeans_phase_name(int phase) {
  static constexpr const char* kNames[kKmPhases] = {"mean_init", "assign_segment", "assign_global",
                                                    "group",     "update",         "finalize"};
  return phase >= 0 && phase < kKmPhases ? kNames[phase] : "?";
}

KMeansPhaseTotals kmeans_phase_totals() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_totals;
}

namespace {
BuildHostTimes g_host;
}  // namespace
void build_host_times_set(const BuildHostTimes& t) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_host = t;
}
BuildHostTimes build_host_times_last() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_host;
}

void kmeans_phase_reset() {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_totals = KMeansPhaseTotals{};
}

KMeansPhaseEvents::KMeansPhaseEvents(cudaStream_t st, bool on) : st_(st), on_(on) {
  if (!on_) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  RETROINFER_CUDA_CHECK(cudaStreamIsCapturing(st_, &capture));
  if (capture != cudaStreamCaptureStatusNone) {  // a graph capture: no timing (finish() cannot wait)
    on_ = false;
    return;
  }
  RETROINFER_CUDA_CHECK(cudaEventCreate(&start_));
  RETROINFER_CUDA_CHECK(cudaEventRecord(start_, st_));
}

KMeansPhaseEvents::~KMeansPhaseEvents() {
  if (start_ != nullptr) cudaEventDestroy(start_);
  for (auto& m : marks_) cudaEventDestroy(m.second);
}

void KMeansPhaseEvents::mark(int phase) {
  if (!on_) return;
  cudaEvent_t e = nullptr;
  RETROINFER_CUDA_CHECK(cudaEventCreate(&e));
  marks_.emplace_back(phase, e);
  RETROINFER_CUDA_CHECK(cudaEventRecord(e, st_));
}

void KMeansPhaseEvents::finish() {
  if (!on_ || marks_.empty()) return;
  RETROINFER_CUDA_CHECK(cudaEventSynchronize(marks_.back().second));
  double add[kKmPhases] = {};
  cudaEvent_t prev = start_;
  for (const auto& [phase, e] : marks_) {
    float ms = 0.0f;
    RETROINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, prev, e));
    if (phase >= 0 && phase < kKmPhases) add[phase] += ms;
    prev = e;
  }
  std::lock_guard<std::mutex> lock(g_mutex);
  for (int i = 0; i < kKmPhases; ++i) g_totals.ms[i] += add[i];
  ++g_totals.runs;
}

}  // namespace retroinfer::cuda::detail
