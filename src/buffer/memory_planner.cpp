#include "retroinfer/memory_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "retroinfer/error.h"

namespace retroinfer::buffer {

std::string format_gib(int64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f GiB", double(bytes) / double(int64_t{1} << 30));
  return buf;
}
namespace {
std::string gib(int64_t bytes) { return format_gib(bytes); }
}  // namespace

std::string_view kv_tier_name(KvTier t) { return t == KvTier::kGpu ? "gpu" : "host"; }

StoreBytes store_bytes(const PlannerShape& shape, const PlannerSettings& s, int64_t n) {
  const int64_t row = int64_t{shape.num_heads_kv} * 2 * shape.head_dim * shape.bytes_per_element;  // K+V, all heads
  const AttentionConfig& a = s.attention;
  const int64_t n_idx = retro_indexed_tokens(steady_split(n, a), a.tokens_per_cluster);
  // The steady zone: sinks, the outliers (the build's and one update's: the runner's layers split them off),
  // the window and the tail an update leaves; the execution buffer holds it before the retrieval rows.
  const int64_t outliers = n_idx == 0 ? 0 : outlier_capacity(a.outlier_fraction, n_idx, 0, a.update_tokens);
  const int64_t steady_cap = int64_t{a.sink_tokens} + a.window_tokens + a.update_tokens + outliers;
  const int64_t clusters = index_clusters(n_idx, a);
  StoreBytes b;
  // An int8 or int4 store: its quantised K and V rows plus their scales (wave_buffer.h store_token_bytes).
  b.store = s.store_dtype == StoreDtype::kBf16 ? n * row
                                               : n * shape.num_heads_kv * store_token_bytes(s.store_dtype, shape.head_dim);
  // The layer's copies of the index (wave_buffer_layer.cpp copy_index_tables, index_update.h tables):
  // centroids (int8 copies and a row scale with int8 scoring) and value sums; per cluster its size, the
  // per-head and absolute CSR offsets, page-slot start, store row, residency byte and at most one page slot
  // beyond the tokens' own (a cluster of s tokens takes ceil(s / page) slots); per indexed token its
  // member id; with an int4 store, per cluster its K and V base rows (bf16). An empty index holds nothing.
  const int64_t D = shape.head_dim, e = shape.bytes_per_element;
  const int64_t centroid = a.int8_centroid_scoring ? D + 4 : D * e;
  const int64_t base = s.store_dtype == StoreDtype::kInt4 ? 4 * D : 0;
  b.meta = clusters == 0 ? 0
                         : shape.num_heads_kv * (clusters * (centroid + D * e + 29 + base) + 4 * n_idx +
                                                 4 * ceil_div(n_idx, s.page_tokens) + 8);
  b.steady = steady_cap * row;
  b.cache = ceil_div(static_cast<int64_t>(std::ceil(s.cache_fraction * double(n))), s.page_tokens) * s.page_tokens * row;
  b.exec = (std::min<int64_t>(n, steady_cap) + retrieval_rows_bound(a.retrieval_fraction, n_idx, s.exec_slack)) * row;
  b.workspace = n_idx * shape.num_heads_kv * (int64_t{shape.head_dim} * shape.bytes_per_element + 20);
  return b;
}

MemoryPlan plan_memory(const PlannerShape& shape, const PlannerSettings& s, const std::vector<int64_t>& contexts,
                       int64_t gpu_free, int64_t host_free) {
  RETROINFER_CHECK(shape.num_layers >= 1 && shape.num_heads_kv >= 1 && shape.head_dim >= 1 &&
                       shape.bytes_per_element >= 1,
                   "plan_memory: the model shape must be positive (layers ", shape.num_layers, ", KV heads ",
                   shape.num_heads_kv, ", head_dim ", shape.head_dim, ")");
  RETROINFER_CHECK(s.page_tokens >= 1 && s.cache_fraction >= 0.0 && s.cache_fraction <= 1.0 &&
                       s.host_usable_fraction >= 0.0 && s.host_usable_fraction <= 1.0,
                   "plan_memory: page_tokens must be >= 1, cache_fraction and host_usable_fraction in [0, 1]");
  validate(s.attention);
  RETROINFER_CHECK(gpu_free >= 0 && host_free >= 0, "plan_memory: negative free memory");
  RETROINFER_CHECK(!contexts.empty(), "plan_memory: empty batch");
  for (size_t i = 0; i < contexts.size(); ++i)
    RETROINFER_CHECK(contexts[i] >= 1, "plan_memory: sequence ", i, " has context ", contexts[i], " (need >= 1)");

  MemoryPlan plan;
  plan.gpu_free_bytes = gpu_free;
  plan.host_free_bytes = host_free;
  const int L = shape.num_layers;
  int64_t workspace = 0, total_ctx_idx = 0;
  for (int64_t n : contexts) {
    const StoreBytes b = store_bytes(shape, s, n);
    plan.gpu_fixed_bytes += (b.meta + b.steady + b.cache + b.exec) * L;
    total_ctx_idx += b.workspace;
  }
  workspace = total_ctx_idx;  // one layer of the whole batch at a time
  plan.gpu_fixed_bytes += workspace;
  const int64_t gpu_budget = gpu_free - s.gpu_reserve_bytes;
  RETROINFER_CHECK(plan.gpu_fixed_bytes <= gpu_budget, "plan_memory: the GPU-resident parts of the wave buffer (meta ",
                   "index, steady zone, block cache, execution buffer, build workspace) need ",
                   gib(plan.gpu_fixed_bytes), " for ", contexts.size(), " sequences x ", L, " layers, but only ",
                   gib(std::max<int64_t>(0, gpu_budget)), " of GPU memory is free (", gib(gpu_free), " free, ",
                   gib(s.gpu_reserve_bytes), " reserved); use fewer or shorter sequences or a smaller cache_fraction");

  int64_t gpu_left = gpu_budget - plan.gpu_fixed_bytes;
  const int64_t host_budget = static_cast<int64_t>(double(host_free) * s.host_usable_fraction);
  int64_t host_left = host_budget;
  int64_t host_needed = 0;
  plan.tier.assign(contexts.size(), std::vector<KvTier>(size_t(L), KvTier::kGpu));
  for (size_t i = 0; i < contexts.size(); ++i) {
    const int64_t bytes = store_bytes(shape, s, contexts[i]).store;
    for (int l = 0; l < L; ++l) {
      const bool gpu_ok = s.force_tier ? *s.force_tier == KvTier::kGpu : bytes <= gpu_left;
      if (gpu_ok) {
        gpu_left -= bytes;
        plan.gpu_store_bytes += bytes;
        ++plan.gpu_stores;
      } else {
        plan.tier[i][size_t(l)] = KvTier::kHost;
        host_needed += bytes;
        host_left -= bytes;
        plan.host_store_bytes += bytes;
        ++plan.host_stores;
      }
    }
  }
  RETROINFER_CHECK(gpu_left >= 0, "plan_memory: the KV stores forced onto the GPU need ", gib(plan.gpu_store_bytes),
                   " beyond the wave buffer's ", gib(plan.gpu_fixed_bytes), ", but ", gib(gpu_budget),
                   " of GPU memory is free in all; place stores on the host or shrink the batch");
  RETROINFER_CHECK(host_left >= 0, "plan_memory: ", plan.host_stores, " (sequence, layer) KV stores do not fit on ",
                   "the GPU and need ", gib(host_needed), " of pinned host memory, but only ", gib(host_budget),
                   " is usable (", gib(host_free), " MemAvailable x ", s.host_usable_fraction,
                   "); the batch needs ", gib(plan.gpu_fixed_bytes + plan.gpu_store_bytes + host_needed),
                   " in all; use fewer or shorter sequences");
  return plan;
}

std::string MemoryPlan::summary() const {
  std::ostringstream os;
  os << "GPU " << gib(gpu_fixed_bytes + gpu_store_bytes) << " of " << gib(gpu_free_bytes) << " free (fixed "
     << gib(gpu_fixed_bytes) << ", " << gpu_stores << " stores " << gib(gpu_store_bytes) << "); host "
     << gib(host_store_bytes) << " of " << gib(host_free_bytes) << " available (" << host_stores << " stores)";
  return os.str();
}

int64_t parse_meminfo_available(std::string_view text) {
  const std::string_view key = "MemAvailable:";
  size_t at = 0;
  while ((at = text.find(key, at)) != std::string_view::npos) {
    if (at == 0 || text[at - 1] == '\n') break;
    at += key.size();
  }
  RETROINFER_CHECK(at != std::string_view::npos, "parse_meminfo_available: no MemAvailable line in /proc/meminfo "
                   "(kernel older than 3.14?)");
  std::istringstream is(std::string(text.substr(at + key.size(), 64)));
  int64_t kib = -1;
  std::string unit;
  is >> kib >> unit;
  RETROINFER_CHECK(is && kib >= 0 && unit == "kB", "parse_meminfo_available: malformed MemAvailable line '",
                   text.substr(at, std::min<size_t>(48, text.size() - at)), "'");
  return kib * 1024;
}

int64_t host_memory_available() {
  std::ifstream f("/proc/meminfo");
  RETROINFER_CHECK(f.good(), "host_memory_available: cannot open /proc/meminfo");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_meminfo_available(ss.str());
}

}  // namespace retroinfer::buffer
