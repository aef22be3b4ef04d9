// Session memory planner (see session_planner.h for every term and its derivation).
#include "buffer/session_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "buffer/memory_planner.h"
#include "retroinfer/error.h"

namespace retroinfer::buffer {

namespace {

std::string gib(int64_t bytes) { return format_gib(bytes); }

// Tokens outside the steady zone (as RetroLayer::build: fewer than one cluster's worth stay steady).
int64_t indexed_tokens(const AttentionConfig& a, int64_t n) {
  const int64_t n_idx = std::max<int64_t>(0, n - a.sink_tokens - a.window_tokens);
  return n_idx < a.tokens_per_cluster ? 0 : n_idx;
}
// Clusters of one flat head: ceil(L / tokens_per_cluster) per segment (at least 1).
int64_t cluster_count(const AttentionConfig& a, int64_t n_idx) {
  int64_t c = 0;
  for (int64_t b = 0; b < n_idx; b += a.segment_tokens)
    c += std::max<int64_t>(1, ceil_div(std::min<int64_t>(a.segment_tokens, n_idx - b), a.tokens_per_cluster));
  return c;
}
// K-means build buffers per indexed token of one flat head (header: 2 D + 32).
int64_t build_bytes_per_item(int d) { return int64_t{2} * d + 32; }

struct LayerSizes {
  int64_t kv = 0, method = 0, host_gpu = 0, host_host = 0, build = 0;
};

LayerSizes layer_sizes(const SessionPlanRequest& r) {
  const AttentionConfig& a = r.attention;
  const int64_t n = r.max_context, d = r.head_dim, g = r.num_heads_q / r.num_heads_kv;
  const int64_t flat = int64_t{r.num_seqs} * r.num_heads_kv;
  LayerSizes s;
  s.kv = 2 * flat * n * d * 2;
  const int64_t split_ws = kDecodeCtaBound * g * (8 + 4 * d);
  const int64_t n_idx = indexed_tokens(a, n);
  const int64_t build = flat * n_idx * build_bytes_per_item(r.head_dim);
  switch (a.kind) {
    case AttentionKind::kFull:
    case AttentionKind::kStreaming:
      s.method = split_ws;
      break;
    case AttentionKind::kOracle:
      s.method = split_ws + flat * n * (4 * g + 8);
      break;
    case AttentionKind::kQuest:
      s.method = split_ws + flat * ceil_div(n, std::max(1, a.quest_page_tokens)) * (8 * d + 8);
      break;
    case AttentionKind::kRetro: {
      const int64_t c = cluster_count(a, n_idx);
      const int64_t steady = std::min<int64_t>(n, int64_t{a.sink_tokens} + a.window_tokens + a.update_tokens);
      const int64_t lists = steady + static_cast<int64_t>(std::ceil(kExecSlack * a.retrieval_fraction * double(n_idx)));
      const int64_t per_cluster = (r.retro_keeps_f32_index ? 12 : 4) * d + 12 + 4 * g;
      s.method = split_ws + flat * c * per_cluster + flat * n_idx * 8 + flat * lists * 4 +
                 (r.retro_keeps_build_buffers ? build : 0);
      s.build = r.retro_keeps_build_buffers ? 0 : build;
      // Host tier: the wave buffer's per-sequence sizes (memory_planner.h).
      PlannerShape ps;
      ps.num_layers = r.num_layers;
      ps.num_heads_kv = r.num_heads_kv;
      ps.head_dim = r.head_dim;
      PlannerSettings st;
      st.page_tokens = r.wave.page_tokens;
      st.cache_fraction = r.wave.cache_fraction;
      st.tokens_per_cluster = a.tokens_per_cluster;
      st.retrieval_fraction = a.retrieval_fraction;
      st.exec_slack = kExecSlack;
      st.sink_tokens = a.sink_tokens;
      st.window_tokens = a.window_tokens;
      st.update_tokens = a.update_tokens;
      StoreBytes b = store_bytes(ps, st, n);
      if (r.wave.cache_pages >= 0)
        b.cache = r.wave.cache_pages * r.wave.page_tokens * int64_t{r.num_heads_kv} * 2 * d * 2;
      // A host-tier layer (WaveBufferLayer) keeps its wave index (a RetroLayer: the GPU tier's method bytes,
      // s.method) on the GPU besides the wave buffer's own copies, steady rows, cache and execution buffer.
      // Counting only the latter under-planned 1M-token split sessions by ~0.8 GiB per host layer (the H200
      // run ran out of memory filling the 31st of 32 layers).
      s.host_gpu = s.method + r.num_seqs * (b.meta + b.steady + b.cache + b.exec);
      s.host_host = r.num_seqs * b.store;
      break;
    }
  }
  return s;
}

}  // namespace

std::string_view session_placement_name(SessionPlacement p) {
  switch (p) {
    case SessionPlacement::kGpu: return "gpu";
    case SessionPlacement::kHost: return "host";
    case SessionPlacement::kSplit: return "split";
    case SessionPlacement::kAuto: return "auto";
  }
  return "?";
}

SessionPlacement parse_session_placement(std::string_view s) {
  if (s == "gpu") return SessionPlacement::kGpu;
  if (s == "host") return SessionPlacement::kHost;
  if (s == "split") return SessionPlacement::kSplit;
  if (s == "auto") return SessionPlacement::kAuto;
  RETROINFER_FAIL("unknown KV placement '", s, "' (known: gpu, host, split, auto)");
}

void set_model_shape(SessionPlanRequest& r, const ModelConfig& c) {
  r.num_layers = c.num_layers;
  r.hidden_size = c.hidden_size;
  r.intermediate_size = c.intermediate_size;
  r.vocab_size = c.vocab_size;
  r.num_heads_q = c.num_heads_q;
  r.num_heads_kv = c.num_heads_kv;
  r.head_dim = c.head_dim;
}

std::string SessionPlanBreakdown::summary() const {
  std::ostringstream os;
  os << num_seqs << " x " << max_context << " tokens, placement " << session_placement_name(placement) << " ("
     << gpu_layers << " GPU / " << host_layers << " host layers): GPU " << gib(gpu_bytes) << " of "
     << gib(gpu_free_bytes) << " (weights " << gib(weight_bytes) << ", KV " << gib(kv_layer_bytes * gpu_layers)
     << ", method " << gib(method_layer_bytes * gpu_layers) << ", host-tier layers "
     << gib(host_layer_gpu_bytes * host_layers) << ", staging " << gib(staging_bytes) << ", build "
     << gib(build_workspace_bytes) << ", activations+logits " << gib(activation_bytes + logits_bytes)
     << "); host " << gib(host_bytes) << " of " << gib(host_free_bytes);
  return os.str();
}

SessionPlanBreakdown plan_session(const SessionPlanRequest& r) {
  RETROINFER_CHECK(r.num_layers >= 1 && r.hidden_size >= 1 && r.intermediate_size >= 1 && r.vocab_size >= 1 &&
                       r.num_heads_q >= 1 && r.num_heads_kv >= 1 && r.head_dim >= 1 &&
                       r.num_heads_q % r.num_heads_kv == 0,
                   "session plan: invalid model shape (layers ", r.num_layers, ", heads ", r.num_heads_q, "/",
                   r.num_heads_kv, ", head_dim ", r.head_dim, ")");
  RETROINFER_CHECK(r.num_seqs >= 1, "session plan: num_seqs must be >= 1, got ", r.num_seqs);
  RETROINFER_CHECK(r.max_context >= 1, "session plan: max_context must be >= 1, got ", r.max_context);
  RETROINFER_CHECK(r.prefill_chunk >= 1, "session plan: prefill_chunk must be >= 1, got ", r.prefill_chunk);
  RETROINFER_CHECK(r.weight_bytes >= 0 && r.gpu_free_bytes >= 0 && r.host_free_bytes >= 0,
                   "session plan: negative weight bytes or memory limits");
  RETROINFER_CHECK(r.wave.page_tokens >= 1 && r.wave.cache_fraction >= 0.0 && r.wave.cache_fraction <= 1.0,
                   "session plan: wave buffer page_tokens must be >= 1 and cache_fraction in [0, 1]");
  validate(r.attention);
  const bool retro = r.attention.kind == AttentionKind::kRetro;
  const int L = r.num_layers;
  RETROINFER_CHECK(retro || r.placement == SessionPlacement::kGpu || r.placement == SessionPlacement::kAuto ||
                       (r.placement == SessionPlacement::kSplit && r.gpu_layers == L),
                   "session plan: KV placement '", session_placement_name(r.placement), "' keeps layers in host ",
                   "memory, which only the retro method supports (wave buffer); use placement gpu or method retro");
  RETROINFER_CHECK(r.placement != SessionPlacement::kSplit || (r.gpu_layers >= -1 && r.gpu_layers <= L),
                   "session plan: gpu_layers = ", r.gpu_layers, " is out of range [-1, ", L, "]");

  const LayerSizes ls = layer_sizes(r);
  SessionPlanBreakdown p;
  p.num_seqs = r.num_seqs;
  p.max_context = r.max_context;
  p.kv_layer_bytes = ls.kv;
  p.method_layer_bytes = ls.method;
  p.host_layer_gpu_bytes = ls.host_gpu;
  p.host_layer_host_bytes = ls.host_host;
  p.build_workspace_bytes = ls.build;
  p.weight_bytes = r.weight_bytes;
  const int64_t per_token = int64_t{2} * r.hidden_size + int64_t{r.num_heads_q + 2 * r.num_heads_kv} * r.head_dim +
                            int64_t{r.num_heads_q} * r.head_dim + int64_t{3} * r.intermediate_size;
  if (r.activation_bytes_override >= 0) {
    p.activation_bytes = r.activation_bytes_override;
  } else {
    const int64_t rows = std::max<int64_t>(std::min<int64_t>(r.prefill_chunk, r.max_context), r.num_seqs);
    p.activation_bytes = rows * per_token * 4;
    p.logits_bytes = int64_t{r.num_seqs} * r.vocab_size * 4;
  }
  p.gpu_free_bytes = r.gpu_free_bytes;
  p.host_free_bytes = r.host_free_bytes;
  const int64_t fixed = p.weight_bytes + p.activation_bytes + p.logits_bytes + p.build_workspace_bytes;
  auto gpu_need = [&](int g) {
    return fixed + g * (ls.kv + ls.method) + (L - g) * ls.host_gpu + (g < L ? ls.kv : 0);
  };
  auto host_need = [&](int g) { return (L - g) * ls.host_host; };

  int g = L;
  SessionPlacement placed = r.placement;
  switch (r.placement) {
    case SessionPlacement::kGpu: g = L; break;
    case SessionPlacement::kHost: g = 0; break;
    case SessionPlacement::kSplit:
    case SessionPlacement::kAuto: {
      if (r.placement == SessionPlacement::kSplit && r.gpu_layers >= 0) {
        g = r.gpu_layers;
        break;
      }
      if (r.placement == SessionPlacement::kAuto && (gpu_need(L) <= r.gpu_free_bytes || !retro)) {
        placed = SessionPlacement::kGpu;
        g = L;
        break;
      }
      // The most GPU layers that fit on the GPU (fewer GPU layers only move more to the host).
      g = L;
      while (g > 0 && gpu_need(g) > r.gpu_free_bytes) --g;
      placed = g == L ? SessionPlacement::kGpu : g == 0 ? SessionPlacement::kHost : SessionPlacement::kSplit;
      if (r.placement == SessionPlacement::kSplit) placed = SessionPlacement::kSplit;
      break;
    }
  }
  p.placement = placed;
  p.gpu_layers = g;
  p.host_layers = L - g;
  p.staging_bytes = g < L ? ls.kv : 0;
  p.gpu_bytes = gpu_need(g);
  p.host_bytes = host_need(g);
  const bool gpu_ok = p.gpu_bytes <= r.gpu_free_bytes, host_ok = p.host_bytes <= r.host_free_bytes;
  if (!gpu_ok || !host_ok) {
    std::ostringstream what;
    what << "session plan: " << r.num_seqs << " sequence(s) x " << r.max_context << " tokens with "
         << attention_kind_name(r.attention.kind) << " attention, KV placement "
         << session_placement_name(r.placement) << " (" << g << " GPU / " << (L - g) << " host layers), need "
         << gib(p.gpu_bytes) << " of GPU memory (weights " << gib(p.weight_bytes) << ", KV + method "
         << gib(g * (ls.kv + ls.method)) << ", host-tier layers' GPU part " << gib((L - g) * ls.host_gpu)
         << ", staging " << gib(p.staging_bytes) << ", activations, logits and build workspace "
         << gib(p.activation_bytes + p.logits_bytes + p.build_workspace_bytes) << ") with "
         << gib(r.gpu_free_bytes) << " free" << (gpu_ok ? "" : " (does not fit)") << ", and " << gib(p.host_bytes)
         << " of pinned host memory with " << gib(r.host_free_bytes) << " free" << (host_ok ? "" : " (does not fit)")
         << "; nothing was allocated. Use fewer or shorter sequences"
         << (retro ? ", another placement (split / host / auto)" : ", method retro with placement split or host")
         << ", or raise the memory limits";
    throw Error(what.str());
  }
  return p;
}

int largest_batch(SessionPlanRequest r, int limit) {
  RETROINFER_CHECK(limit >= 1, "largest_batch: limit must be >= 1, got ", limit);
  auto fits = [&](int b) {
    r.num_seqs = b;
    try {
      plan_session(r);
      return true;
    } catch (const Error&) {
      return false;
    }
  };
  if (!fits(1)) return 0;
  int lo = 1, hi = 2;  // invariant: lo fits; hi does not fit or exceeds limit
  while (hi <= limit && fits(hi)) {
    lo = hi;
    hi = hi > limit / 2 ? limit + 1 : hi * 2;
  }
  hi = std::min(hi, limit + 1);
  while (hi - lo > 1) {
    const int mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  return lo;
}

int64_t resolve_gpu_limit(int64_t limit, const std::function<int64_t()>& free_query) {
  RETROINFER_CHECK(limit >= 0, "session plan: gpu_memory_limit must be >= 0, got ", limit);
  if (limit > 0) return limit;
  RETROINFER_CHECK(static_cast<bool>(free_query), "session plan: no GPU free-memory query");
  return std::max<int64_t>(0, free_query() - kGpuReserveBytes);
}

int64_t resolve_host_limit(int64_t limit, const std::function<int64_t()>& available_query) {
  RETROINFER_CHECK(limit >= 0, "session plan: host_memory_limit must be >= 0, got ", limit);
  if (limit > 0) return limit;
  RETROINFER_CHECK(static_cast<bool>(available_query), "session plan: no host available-memory query");
  return static_cast<int64_t>(double(std::max<int64_t>(0, available_query())) * kHostUsableFraction);
}

}  // namespace retroinfer::buffer
