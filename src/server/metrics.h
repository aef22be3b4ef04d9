// The counters of `retroinfer serve` and their Prometheus text exposition (GET /metrics): responses by
// status, connections, admission (running / queued / refused), tokens, time-to-first-token and inter-token
// latency histograms, the KV read share, the GPU block cache's hit ratio and the KV bytes the running
// requests hold. docs/server.md lists every metric.
//
// Threading contract: every method may be called from any thread at once (atomics; the histograms take a
// mutex). The transport counts connections and responses, the handler the requests and their tokens.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "retroinfer/prefix_cache.h"

namespace retroinfer::server {

// A Prometheus histogram: cumulative counts per upper bound, the sum and the count of the observations.
class LatencyHistogram {
 public:
  explicit LatencyHistogram(std::vector<double> upper_bounds);
  void observe(double seconds);
  // Appends "# TYPE name histogram" and its _bucket / _sum / _count lines.
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  const std::vector<double> bounds_;
  mutable std::mutex mu_;
  std::vector<uint64_t> counts_;  // guarded by mu_: per bucket, not cumulative; the last is +Inf
  double sum_ = 0.0;              // guarded by mu_
  uint64_t count_ = 0;            // guarded by mu_
};

class ServerMetrics {
 public:
  ServerMetrics();

  // Transport.
  void count_response(int status);  // every response sent (handler replies and the transport's own)
  std::atomic<int64_t> connections_open{0};
  std::atomic<int64_t> connections_refused{0};  // over --max-connections: answered 503 and closed

  // Handler: admission and generation.
  std::atomic<int64_t> requests_in_flight{0};  // admitted generation requests not finished (running + queued)
  int max_batch = 1;                           // running = min(in flight, max_batch): the scheduler admits FCFS
  std::atomic<int64_t> requests_cancelled_client{0};    // the client left before the end
  std::atomic<int64_t> requests_cancelled_deadline{0};  // --request-timeout passed
  std::atomic<int64_t> requests_cancelled_shutdown{0};  // drained past --drain-timeout
  std::atomic<int64_t> prompt_tokens{0};                // of finished requests
  std::atomic<int64_t> generated_tokens{0};             // live: counted as each token is sampled
  std::atomic<int64_t> kv_exact_tokens{0}, kv_context_tokens{0};  // GenerateSummary's, of finished requests
  std::atomic<int64_t> cache_hits{0}, cache_misses{0}, pcie_bytes{0};  // host-tier layers (CUDA)
  std::atomic<int64_t> kv_bytes_gpu{0}, kv_bytes_host{0};  // KV reserved by the running and queued requests
  LatencyHistogram time_to_first_token;  // submit to the first sampled token (queue + prefill)
  LatencyHistogram inter_token_latency;  // between a request's successive tokens
  std::shared_ptr<const PrefixCache> prefix_cache;  // set by the handler when the server has one (read at render)
  // The CUDA runner's prefix GPU tier (EngineModel::prefix_gpu_tier_stats) as the handler last saw it: at start
  // and after each finished request. A copy, so that rendering never reaches into the model.
  void set_prefix_gpu_tier(const std::optional<PrefixGpuTierStats>& s);

  std::string render(bool ready) const;

 private:
  mutable std::mutex tier_mu_;
  std::optional<PrefixGpuTierStats> prefix_gpu_tier_;  // guarded by tier_mu_
  static constexpr int kMaxStatus = 600;
  std::array<std::atomic<uint64_t>, kMaxStatus> responses_{};  // by HTTP status
};

}  // namespace retroinfer::server
