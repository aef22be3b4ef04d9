#include "server/metrics.h"

#include <algorithm>
#include <cstdio>

namespace retroinfer::server {

namespace {

std::string number(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

void metric(std::string& out, const char* name, const char* type, const char* help, double value) {
  out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " +
         number(value) + "\n";
}

}  // namespace

LatencyHistogram::LatencyHistogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void LatencyHistogram::observe(double seconds) {
  const size_t k = std::lower_bound(bounds_.begin(), bounds_.end(), seconds) - bounds_.begin();
  std::lock_guard<std::mutex> lk(mu_);
  ++counts_[k];
  sum_ += seconds;
  ++count_;
}

void LatencyHistogram::render(std::string& out, const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lk(mu_);
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  uint64_t cumulative = 0;
  for (size_t k = 0; k < counts_.size(); ++k) {
    cumulative += counts_[k];
    const std::string le = k < bounds_.size() ? number(bounds_[k]) : "+Inf";
    out += name + "_bucket{le=\"" + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_sum " + number(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
}

// Bucket bounds in seconds: TTFT spans a short prompt on an idle GPU (ms) to a long prompt queued behind
// others on the CPU (a minute); inter-token latency a batched GPU step (ms) to a CPU step with a prefill
// interleaved (seconds).
ServerMetrics::ServerMetrics()
    : time_to_first_token({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      inter_token_latency({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}) {}

void ServerMetrics::count_response(int status) {
  if (status >= 0 && status < kMaxStatus) responses_[status].fetch_add(1, std::memory_order_relaxed);
}

void ServerMetrics::set_prefix_gpu_tier(const std::optional<PrefixGpuTierStats>& s) {
  std::lock_guard<std::mutex> lk(tier_mu_);
  prefix_gpu_tier_ = s;
}

std::string ServerMetrics::render(bool ready) const {
  std::string out;
  out += "# HELP retroinfer_http_responses_total HTTP responses sent, by status code\n"
         "# TYPE retroinfer_http_responses_total counter\n";
  for (int s = 0; s < kMaxStatus; ++s) {
    const uint64_t n = responses_[s].load(std::memory_order_relaxed);
    if (n) out += "retroinfer_http_responses_total{status=\"" + std::to_string(s) + "\"} " + std::to_string(n) + "\n";
  }
  metric(out, "retroinfer_ready", "gauge", "1 once the model is loaded and requests are served", ready ? 1 : 0);
  metric(out, "retroinfer_http_connections_open", "gauge", "open client connections", connections_open.load());
  metric(out, "retroinfer_http_connections_refused_total", "counter",
         "connections refused with 503 over --max-connections", connections_refused.load());
  const int64_t in_flight = requests_in_flight.load();
  metric(out, "retroinfer_requests_running", "gauge", "generation requests in the batch (at most --max-batch)",
         std::min<int64_t>(in_flight, max_batch));
  metric(out, "retroinfer_requests_queued", "gauge", "generation requests waiting for a batch slot (at most --max-queue)",
         std::max<int64_t>(0, in_flight - max_batch));
  out += "# HELP retroinfer_requests_cancelled_total generation requests ended early, by reason\n"
         "# TYPE retroinfer_requests_cancelled_total counter\n";
  out += "retroinfer_requests_cancelled_total{reason=\"client_gone\"} " + std::to_string(requests_cancelled_client.load()) + "\n";
  out += "retroinfer_requests_cancelled_total{reason=\"deadline\"} " + std::to_string(requests_cancelled_deadline.load()) + "\n";
  out += "retroinfer_requests_cancelled_total{reason=\"shutdown\"} " + std::to_string(requests_cancelled_shutdown.load()) + "\n";
  metric(out, "retroinfer_prompt_tokens_total", "counter", "prompt tokens of finished generation requests",
         prompt_tokens.load());
  metric(out, "retroinfer_generation_tokens_total", "counter", "tokens generated (counted as each is sampled)",
         generated_tokens.load());
  time_to_first_token.render(out, "retroinfer_time_to_first_token_seconds",
                             "from admission to the first generated token (queue + prefill)");
  inter_token_latency.render(out, "retroinfer_inter_token_latency_seconds", "between a request's successive tokens");
  const int64_t exact = kv_exact_tokens.load(), context = kv_context_tokens.load();
  metric(out, "retroinfer_kv_exact_tokens_total", "counter", "cached KV tokens read exactly over all decode steps and layers",
         exact);
  metric(out, "retroinfer_kv_context_tokens_total", "counter", "cached KV tokens in context over all decode steps and layers",
         context);
  metric(out, "retroinfer_kv_read_share", "gauge", "exact tokens over context tokens of the finished requests (1: full attention)",
         context > 0 ? double(exact) / double(context) : 1.0);
  const int64_t hits = cache_hits.load(), misses = cache_misses.load();
  metric(out, "retroinfer_block_cache_hits_total", "counter", "host-tier retrieval clusters served by the GPU block cache", hits);
  metric(out, "retroinfer_block_cache_misses_total", "counter", "host-tier retrieval clusters read from host memory", misses);
  metric(out, "retroinfer_block_cache_hit_ratio", "gauge", "hits / (hits + misses); -1 before any host-tier retrieval",
         hits + misses > 0 ? double(hits) / double(hits + misses) : -1.0);
  metric(out, "retroinfer_pcie_bytes_total", "counter", "K/V bytes of the block-cache misses read over PCIe", pcie_bytes.load());
  out += "# HELP retroinfer_kv_bytes KV cache bytes reserved by the admitted requests (prompt + max_tokens), by memory\n"
         "# TYPE retroinfer_kv_bytes gauge\n";
  out += "retroinfer_kv_bytes{memory=\"gpu\"} " + std::to_string(kv_bytes_gpu.load()) + "\n";
  out += "retroinfer_kv_bytes{memory=\"host\"} " + std::to_string(kv_bytes_host.load()) + "\n";
  if (prefix_cache) {
    const PrefixCacheStats p = prefix_cache->stats();
    metric(out, "retroinfer_prefix_cache_lookups_total", "counter", "prompts looked up in the prefix cache", p.lookups);
    metric(out, "retroinfer_prefix_cache_hits_total", "counter", "prompts that reused at least one cached block", p.hits);
    metric(out, "retroinfer_prefix_cache_lookup_tokens_total", "counter", "prompt tokens looked up", p.lookup_tokens);
    metric(out, "retroinfer_prefix_cache_hit_tokens_total", "counter", "prompt tokens reused from the cache (not prefilled)",
           p.hit_tokens);
    metric(out, "retroinfer_prefix_cache_hit_ratio", "gauge",
           "hit tokens / lookup tokens: the share of prompt tokens not prefilled; -1 before any lookup", p.hit_ratio());
    metric(out, "retroinfer_prefix_cache_bytes", "gauge", "K/V bytes the prefix cache holds", p.bytes);
    metric(out, "retroinfer_prefix_cache_blocks", "gauge", "blocks the prefix cache holds (pinned included)", p.blocks);
    metric(out, "retroinfer_prefix_cache_pinned_blocks", "gauge", "blocks of preloaded snapshots (never evicted)",
           p.pinned_blocks);
    metric(out, "retroinfer_prefix_cache_evicted_blocks_total", "counter", "blocks evicted (least recently used)",
           p.evicted_blocks);
  }
  std::optional<PrefixGpuTierStats> g;
  {
    std::lock_guard<std::mutex> lk(tier_mu_);
    g = prefix_gpu_tier_;
  }
  if (g) {
    metric(out, "retroinfer_prefix_gpu_tier_bytes", "gauge", "GPU bytes of the prefix cache's device block copies",
           g->held_bytes);
    metric(out, "retroinfer_prefix_gpu_tier_capacity_bytes", "gauge", "--prefix-cache-gpu-mb in bytes", g->capacity_bytes);
    metric(out, "retroinfer_prefix_gpu_tier_loaded_blocks_total", "counter",
           "cached blocks loaded from their GPU copies (inside the GPU)", g->loaded);
    metric(out, "retroinfer_prefix_gpu_tier_relayed_blocks_total", "counter",
           "cached blocks loaded from host memory (no GPU copy)", g->relayed);
    metric(out, "retroinfer_prefix_gpu_tier_dropped_copies_total", "counter",
           "GPU copies dropped to make room (least recently used)", g->dropped);
  }
  return out;
}

}  // namespace retroinfer::server
