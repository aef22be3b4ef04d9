// Session memory planner (see session_planner.h for every term and its derivation).
#include "retroinfer/session_planner.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <utility>

#include "retroinfer/memory_planner.h"
#include "retroinfer/error.h"
#include "retroinfer/wave_counts.h"

namespace retroinfer::buffer {

namespace {

std::string gib(int64_t bytes) { return format_gib(bytes); }

// KMeansWork::run (retro_layer.cpp) for h flat heads, n tokens, c clusters in s segments, plus the outlier
// split's buffers (split_outliers): every buffer the run allocates.
int64_t kmeans_work_bytes(const AttentionConfig& a, bool outliers, int64_t h, int64_t n, int64_t c,
                          int64_t s, int64_t d) {
  const int64_t items = h * n, flat = h * c;
  int64_t b = 2 * (s + 1) * 4;                   // segment token / cluster prefix sums
  b += h * 32 * d * 4 + h * d * 4;               // mean partial sums (kMeanChunks = 32) and the mean
  b += items * d + flat * (d + 4);               // int8 centred keys, int8 centroid copies and scales
  b += flat * d * (4 + 2 + 4 + 2) + flat * 4;    // f32 / bf16 centroids and value sums, sizes
  b += (flat + 1) * 4;                           // CSR offsets
  b += items * 4 * 5;                            // assignment, sort keys in / out, iota, members
  b += std::max<int64_t>(items * kRetroSortBytesPerItem + kRetroSortFixedBytes, 16);  // radix-sort temp
  const int64_t want = outliers ? outlier_split_count(a.outlier_fraction, n) : 0;
  if (want > 0) b += items * 4 + h * want * 4 * 2 + h * 4 + h * (want + 1) * 4 + flat;  // residual, picks, touched
  return b;
}

}  // namespace

RetroLayerBytes retro_layer_bytes(const RetroLayerBytesRequest& r) {
  const AttentionConfig& a = r.attention;
  RETROINFER_CHECK(r.num_seqs >= 1 && r.num_heads_kv >= 1 && r.group >= 1 && r.head_dim >= 1 && r.tokens >= 1 &&
                       r.kv_stride >= r.tokens && r.build_group_seqs >= 0,
                   "retro_layer_bytes: need positive sequences (", r.num_seqs, "), KV heads (", r.num_heads_kv,
                   "), group (", r.group, "), head_dim (", r.head_dim, ") and tokens (", r.tokens,
                   ") <= kv_stride (", r.kv_stride, "), build_group_seqs >= 0 (", r.build_group_seqs, ")");
  validate(a);
  const int64_t H = int64_t{r.num_seqs} * r.num_heads_kv, G = r.group, D = r.head_dim, n = r.tokens;
  const int64_t U = a.update_tokens;
  // Zones as RetroLayer::build.
  const SteadySplit split = steady_split(n, a);
  const int64_t idx_begin = split.sink_end;
  const int64_t n_idx = retro_indexed_tokens(split, a.tokens_per_cluster);
  const int64_t C = index_clusters(n_idx, a);
  RETROINFER_CHECK(C <= INT32_MAX, "retro_layer_bytes: ", C, " clusters per head exceed the index's int range");
  const double f = r.outlier_zone ? a.outlier_fraction : 0.0;
  const int64_t out_build = outlier_split_count(f, n_idx);
  const int64_t appendable = r.growth_bound ? r.kv_stride : r.kv_stride - n;
  const int64_t out_stride = outlier_capacity(f, n_idx, appendable, a.update_tokens);
  RetroLayerBytes b;
  b.n_idx = n_idx;
  b.clusters = C;
  // Index arrays (what build() leaves, and an update regrows to the same shapes).
  // bf16 value sums, bf16 centroids (not kept with int8 scoring), f32 copies, sizes, CSR, members.
  const bool int8_scoring = a.int8_centroid_scoring;  // RetroLayer::int8_scoring
  const int64_t bf16_per = int8_scoring ? 2 : 2 + 2;
  const int64_t arrays = n_idx == 0 ? 4  // the empty CSR: offsets[0]
                                    : H * C * D * (bf16_per + (r.keep_f32_index ? 8 : 0)) + H * C * 4 +
                                          (H * C + 1) * 4 + H * n_idx * 4 * (r.keep_assignment ? 2 : 1);
  // Int8 scoring: the centroids' int8 copies and row scales (an update appends the block's rows, regrown
  // while the old ones are still held), in place of the bf16 centroids.
  const int64_t q8 = int8_scoring && C > 0 ? H * C * (D + 4) : 0;
  // ... + the mean key and the retrieval-capacity sums (H int64, retro_layer.cpp size_workspace) when indexed
  b.index = arrays + q8 + (n_idx > 0 ? H * D * 4 + H * 8 : 0) + std::max<int64_t>(H * out_stride * 4, 16) + H * 4;
  // Decode workspace (RetroLayer::Impl::size_workspace).
  const ZoneCounts z = zone_counts(static_cast<int>(C), a);
  const int64_t nr = z.n_retrieval, ne = z.n_estimation;
  const int64_t idx_end = n_idx == 0 ? std::max<int64_t>(idx_begin, a.sink_tokens) : idx_begin + n_idx;
  const int64_t steady_now = n_idx == 0 ? n : idx_begin + (n - idx_end);
  const int64_t tail_max = std::min<int64_t>(steady_tail_max(a), r.kv_stride - idx_end);
  const int64_t steady = r.growth_bound ? std::min<int64_t>(r.kv_stride, int64_t{a.sink_tokens} + a.window_tokens +
                                                                             std::max<int64_t>(U, a.tokens_per_cluster))
                                        : std::max(steady_now, idx_begin + tail_max);
  const int64_t ret = C == 0 ? 0
                      : r.retrieval_tokens >= 0
                          ? r.retrieval_tokens
                          : retrieval_rows_bound(a.retrieval_fraction, n_idx);
  const int64_t outl = C == 0 ? 0 : r.outlier_tokens >= 0 ? r.outlier_tokens : out_build;
  const int64_t ctas = std::max(H, r.decode_ctas);
  b.decode = H * (steady + ret + outl) * 4 + H * 4 + H * 4;              // token lists, counts, merge counter
  b.decode += (ctas + H * ceil_div(ne, kRetroEstimateChunk)) * G * (8 + 4 * D);  // split states (m, l), o
  if (C > 0)
    b.decode += H * G * C * 4 + ctas * G * 8 + H * C * 4 +                // logits, norm partials, scores
                H * std::max<int64_t>(nr, 1) * 4 + H * std::max<int64_t>(ne, 1) * 4 + H * (nr + 1) * 4;
  if (n_idx == 0) return b;
  // build(): groups of build_group_seqs sequences through one workspace; a single group (the whole
  // batch) hands its result arrays to the index, so only the rest is transient.
  const int64_t S = segment_count(n_idx, a.segment_tokens);
  const int64_t gs = r.build_group_seqs == 0 ? r.num_seqs : std::min<int64_t>(r.build_group_seqs, r.num_seqs);
  const int64_t Hg = gs * r.num_heads_kv;
  b.build = kmeans_work_bytes(a, r.outlier_zone, Hg, n_idx, C, S, D);
  if (gs == r.num_seqs) b.build -= arrays + H * D * 4;
  // An update (one layer at a time): its workspace (U tokens, update_clusters clusters), the grown copies
  // of the index arrays while the old ones wait for the sync, and a regrown logits / token list.
  b.update = kmeans_work_bytes(a, r.outlier_zone, H, U, a.update_clusters, 1, D) + arrays + q8 + H * G * C * 4 +
             H * (steady + ret + outl) * 4;
  return b;
}

namespace {

struct LayerSizes {
  int64_t kv = 0, method = 0, host_gpu = 0, host_host = 0, build = 0;
  int64_t staging = 0;  // one layer's bf16 K/V of every sequence (the layer-major prefill's staging)
  int64_t host_build = 0;  // transient, one host-tier layer at a time: the index that clusters it
};

LayerSizes layer_sizes(const SessionPlanRequest& r) {
  const AttentionConfig& a = r.attention;
  const int64_t n = r.max_context, d = r.head_dim, g = r.num_heads_q / r.num_heads_kv;
  const int64_t flat = int64_t{r.num_seqs} * r.num_heads_kv;
  LayerSizes s;
  s.staging = 2 * flat * n * d * 2;
  // The 8-bit KV cache's int8 K and V rows with an f32 scale each, and per flat head and channel its key
  // calibration (attention/cuda/kv_int8_cache.h KvInt8Cache::bytes).
  s.kv = r.kv_dtype == DType::kI8
             ? flat * n * 2 * stored_row_bytes(DType::kI8, r.head_dim) + flat * d * 4 * kInt8KvCalibrationFloats
             : s.staging;
  const int64_t split_ws = kDecodeCtaBound * g * (8 + 4 * d);
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
      RetroLayerBytesRequest q;
      q.attention = a;
      q.num_seqs = r.num_seqs;
      q.num_heads_kv = r.num_heads_kv;
      q.group = static_cast<int>(g);
      q.head_dim = r.head_dim;
      q.tokens = n;
      q.kv_stride = n;
      q.outlier_zone = true;  // the runner's RetroLayerAttention and WaveLayerAttention
      q.keep_f32_index = r.retro_keeps_f32_index;
      q.keep_assignment = r.retro_keeps_assignment;
      q.build_group_seqs = r.retro_build_group_seqs;
      q.growth_bound = true;
      const RetroLayerBytes rb = retro_layer_bytes(q);
      s.method = rb.held() + (r.retro_keeps_build_buffers ? rb.build : 0);
      s.build = r.retro_keeps_build_buffers ? rb.update : std::max(rb.build, rb.update);
      // Host tier: the wave buffer's per-sequence sizes (memory_planner.h).
      PlannerShape ps;
      ps.num_layers = r.num_layers;
      ps.num_heads_kv = r.num_heads_kv;
      ps.head_dim = r.head_dim;
      PlannerSettings st;
      st.page_tokens = r.wave.page_tokens;
      st.cache_fraction = r.wave.cache_fraction;
      st.store_dtype = r.wave.store_dtype;  // host bytes of the compressed store
      st.attention = a;
      StoreBytes b = store_bytes(ps, st, n);
      if (r.wave.cache_pages >= 0)
        b.cache = r.wave.cache_pages * r.wave.page_tokens * int64_t{r.num_heads_kv} * 2 * d * 2;
      // A host-tier layer (WaveBufferLayer) decodes from its own copies of the index (meta) with RetroLayer's
      // decode workspace, besides its steady rows, cache and execution buffer. The RetroLayer that clusters
      // the layer is released after the build (WaveBufferLayer::release_index): one layer's index at a
      // time, counted with the build's staging (plan_session).
      s.host_gpu = rb.decode + r.num_seqs * (b.meta + b.steady + b.cache + b.exec);
      s.host_build = s.method;
      s.host_host = r.num_seqs * b.store;
      break;
    }
  }
  return s;
}

}  // namespace

std::string_view kv_placement_name(KvPlacement p) {
  switch (p) {
    case KvPlacement::kGpu: return "gpu";
    case KvPlacement::kHost: return "host";
    case KvPlacement::kSplit: return "split";
    case KvPlacement::kAuto: return "auto";
  }
  return "?";
}

KvPlacement parse_kv_placement(std::string_view s) {
  if (s == "gpu") return KvPlacement::kGpu;
  if (s == "host") return KvPlacement::kHost;
  if (s == "split") return KvPlacement::kSplit;
  if (s == "auto") return KvPlacement::kAuto;
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
  os << num_seqs << " x " << max_context << " tokens, placement " << kv_placement_name(placement) << " ("
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
  const bool kv8 = r.kv_dtype == DType::kI8;
  RETROINFER_CHECK(r.kv_dtype == DType::kBF16 || kv8, "session plan: the CUDA runner keeps its KV cache in bf16 ",
                   "or int8, not ", dtype_name(r.kv_dtype));
  RETROINFER_CHECK(!kv8 || retro || r.attention.kind == AttentionKind::kFull, "session plan: the 8-bit KV cache ",
                   "(kv_dtype int8) is provided for full and retro attention on the GPU, not for '",
                   attention_kind_name(r.attention.kind), "'; use kv_dtype bf16");
  RETROINFER_CHECK(!kv8 || r.placement == KvPlacement::kGpu || r.placement == KvPlacement::kAuto ||
                       (r.placement == KvPlacement::kSplit && r.gpu_layers == L),
                   "session plan: the 8-bit KV cache (kv_dtype int8) keeps every layer on the GPU, not placement '",
                   kv_placement_name(r.placement), "'; use placement gpu or auto (the host tier's store is ",
                   "compressed by host_store int8 / int4 instead)");
  RETROINFER_CHECK(retro || r.placement == KvPlacement::kGpu || r.placement == KvPlacement::kAuto ||
                       (r.placement == KvPlacement::kSplit && r.gpu_layers == L),
                   "session plan: KV placement '", kv_placement_name(r.placement), "' keeps layers in host ",
                   "memory, which only the retro method supports (wave buffer); use placement gpu or method retro");
  RETROINFER_CHECK(r.placement != KvPlacement::kSplit || (r.gpu_layers >= -1 && r.gpu_layers <= L),
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
    return fixed + g * (ls.kv + ls.method) + (L - g) * ls.host_gpu + (g < L ? ls.staging + ls.host_build : 0) +
           (kv8 ? ls.staging : 0);
  };
  auto host_need = [&](int g) { return (L - g) * ls.host_host; };

  int g = L;
  KvPlacement placed = r.placement;
  switch (r.placement) {
    case KvPlacement::kGpu: g = L; break;
    case KvPlacement::kHost: g = 0; break;
    case KvPlacement::kSplit:
    case KvPlacement::kAuto: {
      if (r.placement == KvPlacement::kSplit && r.gpu_layers >= 0) {
        g = r.gpu_layers;
        break;
      }
      if (r.placement == KvPlacement::kAuto && (gpu_need(L) <= r.gpu_free_bytes || !retro || kv8)) {
        placed = KvPlacement::kGpu;
        g = L;
        break;
      }
      // The most GPU layers that fit on the GPU (fewer GPU layers only move more to the host).
      g = L;
      while (g > 0 && gpu_need(g) > r.gpu_free_bytes) --g;
      placed = g == L ? KvPlacement::kGpu : g == 0 ? KvPlacement::kHost : KvPlacement::kSplit;
      if (r.placement == KvPlacement::kSplit) placed = KvPlacement::kSplit;
      break;
    }
  }
  p.placement = placed;
  p.gpu_layers = g;
  p.host_layers = L - g;
  p.staging_bytes = (g < L ? ls.staging + ls.host_build : 0) + (kv8 ? ls.staging : 0);
  p.gpu_bytes = gpu_need(g);
  p.host_bytes = host_need(g);
  const bool gpu_ok = p.gpu_bytes <= r.gpu_free_bytes, host_ok = p.host_bytes <= r.host_free_bytes;
  if (!gpu_ok || !host_ok) {
    std::ostringstream what;
    what << "session plan: " << r.num_seqs << " sequence(s) x " << r.max_context << " tokens with "
         << attention_kind_name(r.attention.kind) << " attention, KV placement "
         << kv_placement_name(r.placement) << " (" << g << " GPU / " << (L - g) << " host layers), need "
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
