// WaveBufferLayer: the wave index (RetroLayer's k-means) plus the tiered store, block cache, manager
// thread and execution buffer of the wave buffer (include/retroinfer/wave_buffer.h).
#include "retroinfer/wave_buffer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string_view>
#include <utility>

#include "kernels/cuda_check.h"
#include "kernels/stream_priority.h"
#include "buffer/cuda/pinned_host.h"
#include "attention/cuda/layer_common.h"
#include "attention/cuda/wave_buffer_layer_impl.h"
#include "buffer/cache_manager.h"
#include "retroinfer/cuda_backend.h"

namespace retroinfer::cuda {

namespace {
template <typename T>
DeviceBuffer upload_vec(const std::vector<T>& v) {
  DeviceBuffer b(std::max<size_t>(v.size() * sizeof(T), 16));
  b.upload(v.data(), v.size() * sizeof(T));
  return b;
}
}  // namespace


WaveBufferLayer::WaveBufferLayer(const AttentionShape& shape, const AttentionConfig& cfg, const WaveBufferConfig& wcfg,
                                 int num_seqs)
    : impl_(new Impl) {
  detail::validate_layer_shape(shape, num_seqs, "WaveBufferLayer");
  RETROINFER_CHECK(wcfg.page_tokens >= 1 && wcfg.page_tokens <= 1024, "WaveBufferLayer: page_tokens must be in [1, 1024], got ",
                   wcfg.page_tokens);
  RETROINFER_CHECK(wcfg.cache_fraction >= 0.0 && wcfg.cache_fraction <= 1.0,
                   "WaveBufferLayer: cache_fraction must be in [0, 1], got ", wcfg.cache_fraction);
  RETROINFER_CHECK(wcfg.ring_slots >= 2, "WaveBufferLayer: ring_slots must be >= 2, got ", wcfg.ring_slots);
  auto& m = *impl_;
  m.shape = shape;
  m.cfg = cfg;
  m.wcfg = wcfg;
  m.num_seqs = num_seqs;
  m.H = num_seqs * shape.num_heads_kv;
  m.G = shape.num_heads_q / shape.num_heads_kv;
  m.D = shape.head_dim;
  m.scale = detail::effective_scale(cfg.scale, shape.head_dim);
  m.index = std::make_unique<RetroLayer>(shape, cfg, num_seqs);
  m.index->set_keep_f32_index(false);  // only the bf16 index is read (decode, the store's copies)
}

WaveBufferLayer::~WaveBufferLayer() = default;

void WaveBufferLayer::build(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride) {
  auto& m = *impl_;
  m.manager.reset();
  m.drop_graph();  // a graph captured before bakes in the buffers this build replaces
  m.index->build(k, v, num_tokens, kv_stride);  // validates k, v, sizes; synchronous
  m.take_index_counts(num_tokens);
  const std::vector<int32_t> out_tokens = m.outlier_tokens();
  m.per_head = m.n_idx - m.n_out;
  m.steady_rows = static_cast<int>(num_tokens - m.n_idx + m.n_out);
  m.steady_cap = m.steady_rows;
  m.copy_index_tables();
  m.allocate_cache_and_rows(num_tokens);
  m.copy_steady_zone(k, v, num_tokens, kv_stride, out_tokens);
  m.fill_store(k, v, num_tokens, kv_stride);
  m.reset_decode_state();
  m.start_manager(m.ring_width(num_tokens));
}

// The built index's token and cluster counts, zone sizes and token-list capacity.
void WaveBufferLayer::Impl::take_index_counts(int64_t num_tokens) {
  auto& m = *this;
  m.n = num_tokens;
  m.n_idx = m.index->indexed_tokens();
  m.idx_begin = m.index->indexed_begin();
  RETROINFER_CHECK(m.n_idx > 0, "WaveBufferLayer::build: ", num_tokens, " tokens leave nothing to index beyond the ",
                   "steady zone (sink ", m.cfg.sink_tokens, ", window ", m.cfg.window_tokens,
                   "); use RetroLayer or DenseDecoder for such short contexts");
  m.C = m.index->num_clusters();
  m.n_r = m.index->n_retrieval();
  m.n_e = m.index->n_estimation();
  m.list_cap = m.index->token_list_capacity();
}

// Outlier zone (when the index has one: the seam's host tier turns it on): read exactly every step, so
// its rows join the steady zone after the sinks; one row count serves every head, so the heads must
// hold equally many (round(f * n) each unless a head has fewer tokens off their centroid). Sets n_out;
// returns the outlier tokens, [H, n_out].
std::vector<int32_t> WaveBufferLayer::Impl::outlier_tokens() {
  auto& m = *this;
  m.n_out = m.index->max_outliers();
  std::vector<int32_t> out_tokens(size_t(m.H) * m.n_out);
  for (int h = 0; h < m.H && m.n_out > 0; ++h) {
    const std::vector<int32_t> o = m.index->outliers(h);
    RETROINFER_CHECK(int64_t(o.size()) == m.n_out, "WaveBufferLayer::build: flat head ", h, " has ", o.size(),
                     " outlier tokens, another ", m.n_out, "; the wave buffer needs the same count in every head ",
                     "(set outlier_fraction 0 for such K/V)");
    std::copy(o.begin(), o.end(), out_tokens.begin() + size_t(h) * m.n_out);
  }
  return out_tokens;
}

// The index, head by head (synchronous downloads; a one-time cost of the build), into the host tables
// (tab) and the device copies that decode reads.
void WaveBufferLayer::Impl::copy_index_tables() {
  auto& m = *this;
  const int pt = m.wcfg.page_tokens;
  m.outliers_on = m.index->outlier_zone();
  m.updates = 0;
  m.int8_on = m.index->int8_scoring();
  // int8 scoring: the index keeps (and the buffer uploads) only the centroids' int8 copies, no bf16 ones.
  std::vector<uint16_t> cent(m.int8_on ? 0 : size_t(H) * C * D), vsum(size_t(H) * C * D);
  std::vector<uint8_t> cq8(m.int8_on ? size_t(H) * C * D : 0);
  std::vector<float> cscl(m.int8_on ? size_t(H) * C : 0);
  std::vector<int32_t> sizes_all(size_t(H) * C);
  std::vector<uint32_t> mem(size_t(H) * m.per_head);
  std::vector<std::vector<int32_t>> offs(static_cast<size_t>(H));
  for (int h = 0; h < H; ++h) {
    const RetroDebugState st = m.index->debug_state(h);
    if (m.int8_on) copy_int8_centroids(st, h, C, D, cq8, cscl, "WaveBufferLayer::build");
    else std::copy(st.centroids_bf16.begin(), st.centroids_bf16.end(), cent.begin() + size_t(h) * C * D);
    std::copy(st.value_sums_bf16.begin(), st.value_sums_bf16.end(), vsum.begin() + size_t(h) * C * D);
    std::copy(st.sizes.begin(), st.sizes.end(), sizes_all.begin() + size_t(h) * C);
    RETROINFER_CHECK(int64_t(st.members.size()) == m.per_head, "WaveBufferLayer::build: flat head ", h, " has ",
                     st.members.size(), " clustered tokens, expected ", m.per_head);
    std::copy(st.members.begin(), st.members.end(), mem.begin() + size_t(h) * m.per_head);
    offs[size_t(h)] = st.offsets;
  }
  m.tab = buffer::WaveIndexTables::from_sizes(H, C, pt, sizes_all);
  for (int h = 0; h < H; ++h)
    RETROINFER_CHECK(std::equal(offs[size_t(h)].begin(), offs[size_t(h)].end(), m.tab.offsets.begin() + int64_t(h) * (C + 1)),
                     "WaveBufferLayer::build: flat head ", h, "'s CSR offsets are not the prefix sums of its sizes ",
                     "(internal error)");
  m.slot_stride = m.tab.slot_stride;
  if (!m.int8_on) m.centroids_bf16 = upload_vec(cent);
  if (m.int8_on) {
    m.centroids_q8 = upload_vec(cq8);
    m.centroid_scale = upload_vec(cscl);
  }
  m.value_sums_bf16 = upload_vec(vsum);
  m.sizes = upload_vec(m.tab.sizes);
  m.offsets_head = upload_vec(m.tab.offsets);
  m.offsets_abs = upload_vec(m.tab.offsets_abs());
  m.members = upload_vec(mem);
  m.slot_begin = upload_vec(m.tab.slot_begin);
  m.store_at = upload_vec(m.tab.store_at);
}

// The block cache (P pages per flat head, from cache_pages or cache_fraction of num_tokens), the execution
// buffer with its identity token list, and the steady zone's buffers (steady_rows rows per flat head).
void WaveBufferLayer::Impl::allocate_cache_and_rows(int64_t num_tokens) {
  auto& m = *this;
  const int pt = m.wcfg.page_tokens;
  // Block cache: pages per flat head.
  m.P = m.wcfg.cache_pages >= 0
            ? m.wcfg.cache_pages
            : detail::ceil_div(static_cast<int64_t>(std::ceil(m.wcfg.cache_fraction * double(num_tokens))), pt);
  const size_t row_bytes = size_t(D) * 2;
  m.cache_k = DeviceBuffer(std::max<size_t>(size_t(H) * m.P * pt * row_bytes, 16));
  m.cache_v = DeviceBuffer(std::max<size_t>(size_t(H) * m.P * pt * row_bytes, 16));

  // Execution buffer, steady zone, identity token list.
  m.exec_k = DeviceBuffer(size_t(H) * m.list_cap * row_bytes);
  m.exec_v = DeviceBuffer(size_t(H) * m.list_cap * row_bytes);
  std::vector<int32_t> iota(size_t(m.list_cap));
  std::iota(iota.begin(), iota.end(), 0);
  m.identity = upload_vec(iota);
  m.steady_k = DeviceBuffer(size_t(H) * m.steady_rows * row_bytes);
  m.steady_v = DeviceBuffer(size_t(H) * m.steady_rows * row_bytes);
}

// The steady zone's rows from the layer's K/V (synchronous copies): per head [sinks | its outlier tokens
// out_tokens[h] | the tokens after the indexed region].
void WaveBufferLayer::Impl::copy_steady_zone(const uint16_t* k, const uint16_t* v, int64_t num_tokens,
                                             int64_t kv_stride, const std::vector<int32_t>& out_tokens) {
  auto& m = *this;
  const size_t row_bytes = size_t(D) * 2;
  const int64_t w_begin = m.idx_begin + m.n_idx;
  for (int kv = 0; kv < 2; ++kv) {
    const uint16_t* src = kv == 0 ? k : v;
    uint16_t* dst = (kv == 0 ? m.steady_k : m.steady_v).as<uint16_t>();
    const size_t spitch = size_t(kv_stride) * row_bytes, dpitch = size_t(m.steady_rows) * row_bytes;
    if (m.idx_begin > 0)
      RETROINFER_CUDA_CHECK(cudaMemcpy2D(dst, dpitch, src, spitch, size_t(m.idx_begin) * row_bytes, size_t(H),
                                         cudaMemcpyDeviceToDevice));
    // Outlier rows (per head its own tokens), one row copy each: a one-time cost of round(f * n) rows.
    for (int h = 0; h < H; ++h)
      for (int64_t j = 0; j < m.n_out; ++j)
        RETROINFER_CUDA_CHECK(cudaMemcpy(dst + (size_t(h) * m.steady_rows + m.idx_begin + j) * D,
                                         src + (size_t(h) * kv_stride + out_tokens[size_t(h) * m.n_out + j]) * D,
                                         row_bytes, cudaMemcpyDeviceToDevice));
    if (num_tokens > w_begin)
      RETROINFER_CUDA_CHECK(cudaMemcpy2D(reinterpret_cast<char*>(dst) + size_t(m.idx_begin + m.n_out) * row_bytes, dpitch,
                                         reinterpret_cast<const char*>(src) + size_t(w_begin) * row_bytes, spitch,
                                         size_t(num_tokens - w_begin) * row_bytes, size_t(H), cudaMemcpyDeviceToDevice));
  }
}

// The store, cluster-ordered, on its tier; with index updates on and wcfg.max_tokens set, tail room for
// every token up to max_tokens (each update's clusters go there; without it the store grows by
// reallocation at an update, wave_buffer_layer_update.cpp).
void WaveBufferLayer::Impl::fill_store(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride) {
  auto& m = *this;
  const int64_t room = m.wcfg.index_updates && m.wcfg.max_tokens > num_tokens ? m.wcfg.max_tokens - num_tokens : 0;
  m.store_cap_rows = m.tab.store_rows + int64_t{H} * room;
  const size_t store_bytes = m.store_alloc_bytes(m.store_cap_rows);
  m.store_dev = DeviceBuffer();
  m.store_host = PinnedHost();
  if (m.wcfg.tier == KvTier::kGpu) {
    m.store_dev = DeviceBuffer(store_bytes);
    m.point_store(m.store_dev.data(), m.store_cap_rows);
  } else {
    m.store_host = PinnedHost(store_bytes);
    m.point_store(m.store_host.device(), m.store_cap_rows);
  }
  // An int4 store's base rows (every cluster's K and V means), in device memory whatever the tier.
  m.store_base = m.wcfg.store_dtype == StoreDtype::kInt4
                     ? DeviceBuffer(std::max<size_t>(size_t(H) * m.base_bytes(m.C), 16))
                     : DeviceBuffer();
  detail::StoreFillParams fp;
  fp.t = m.tables();
  m.set_fill_store(fp, m.C, 0);
  fp.k = k;
  fp.v = v;
  fp.kv_stride = kv_stride;
  fp.idx_begin = m.idx_begin;
  fp.members = m.members.as<uint32_t>();
  detail::launch_check(detail::wave_store_fill(fp, nullptr), "wave_store_fill", nullptr);
}

// The decode's counters and workspaces, zeroed and sized; the step counts and the manager's stats restart.
void WaveBufferLayer::Impl::reset_decode_state() {
  auto& m = *this;
  m.sel_ws = DeviceBuffer(detail::select_grid_ws_bytes(H));  // the grid selection leaves it zero
  m.sel_ws.fill_bytes(0);
  m.exec_count = DeviceBuffer(size_t(H) * 4);
  m.counts = DeviceBuffer(size_t(H) * 4 * 8);
  m.counts.fill_bytes(0);
  m.state = DeviceBuffer(sizeof(detail::WaveDeviceState));
  m.size_decode_workspace();
  m.steps = m.steps_base = 0;
  m.stats_base = {};
  m.applied_ahead = false;
  m.override_step = -1;
}

// The ring's width: n_r, or with index updates on and wcfg.max_tokens set, n_r of the most clusters the
// session can reach (an update past the width rebuilds the protocol with an empty cache).
int WaveBufferLayer::Impl::ring_width(int64_t num_tokens) const {
  const auto& m = *this;
  int k_cap = m.n_r;
  if (m.wcfg.index_updates && m.wcfg.max_tokens > num_tokens) {
    const int64_t blocks = detail::ceil_div(m.wcfg.max_tokens - num_tokens, int64_t{m.cfg.update_tokens});
    k_cap = std::max(k_cap, zone_counts(static_cast<int>(C + blocks * m.cfg.update_clusters), m.cfg).n_retrieval);
  }
  return k_cap;
}

// Decode workspace (as RetroLayer's, so that the splits and hence the results agree bit for bit).
void WaveBufferLayer::Impl::size_decode_workspace() {
  auto& m = *this;
  m.logits = DeviceBuffer(size_t(H) * m.G * C * 4);
  m.norm_partial = DeviceBuffer(size_t(H) * m.G * detail::score_blocks(C, D, H) * 8);
  m.scores = DeviceBuffer(size_t(H) * C * 4);
  m.ret_ids = DeviceBuffer(size_t(H) * std::max(m.n_r, 1) * 4);
  m.est_ids = DeviceBuffer(size_t(H) * std::max(m.n_e, 1) * 4);
  m.scan_scratch = DeviceBuffer(size_t(H) * (m.n_r + 1) * 4);
  m.token_list = DeviceBuffer(size_t(H) * m.list_cap * 4);
  m.token_count = DeviceBuffer(size_t(H) * 4);
  m.attn_splits = detail::exact_splits(m.list_cap, H);  // RetroLayer's rule (layer_common.h)
  m.est_splits = static_cast<int>(detail::ceil_div(m.n_e, detail::kEstimateChunk));
  const int total = m.attn_splits + m.est_splits;
  m.part_ml = DeviceBuffer(size_t(H) * total * m.G * 8);
  m.part_o = DeviceBuffer(size_t(H) * total * m.G * D * 4);
  m.seg_row = DeviceBuffer(size_t(H) * std::max(m.n_r, 1) * 4);
  m.seg_hit = DeviceBuffer(size_t(H) * std::max(m.n_r, 1));
}

// Protocol region and manager. Limits: every retrieval cluster of every head may miss in one step; its
// pages are at most (retrieval rows) / page + one partial page per cluster; each eviction frees at least
// one page. (The limits only throttle the manager's admissions; the ring must hold n_r ids per head.)
void WaveBufferLayer::Impl::start_manager(int k_cap) {
  auto& m = *this;
  RETROINFER_CHECK(k_cap >= m.n_r, "WaveBufferLayer: ring width ", k_cap, " below n_r ", m.n_r, " (internal error)");
  m.manager.reset();  // stop the thread before its region goes
  const int pt = m.wcfg.page_tokens;
  const int64_t ret_rows = m.list_cap - m.steady_rows;
  const int64_t max_pages = int64_t{H} * (detail::ceil_div(ret_rows, pt) + k_cap);
  m.layout = buffer::WaveProtocolLayout::make(H, k_cap, m.wcfg.ring_slots, static_cast<int>(max_pages), H * k_cap,
                                              static_cast<int>(max_pages));
  m.region = PinnedHost(m.layout.total_bytes, /*allow_register=*/false);
  m.mirror = DeviceBuffer(m.layout.ack_offset - m.layout.evictions_offset);
  std::memset(m.region.host(), 0, m.layout.total_bytes);
  // A fresh manager knows no resident cluster: the device's page table starts empty too.
  m.state.fill_bytes(0);
  m.resident = DeviceBuffer(std::max<size_t>(size_t(H) * C, 16));
  m.resident.fill_bytes(0);
  m.cluster_pages = DeviceBuffer(std::max<size_t>(size_t(H) * m.slot_stride * 4, 16));
  m.cluster_pages.fill_bytes(0xff);
  RETROINFER_CUDA_CHECK(cudaDeviceSynchronize());
  m.manager = std::make_unique<buffer::CacheManager>(m.layout, m.region.host(), m.tab.sizes, C, pt, m.P);
  m.manager->start();
}

void WaveBufferLayer::Impl::drop_graph() {
  if (graph_exec != nullptr) cudaGraphExecDestroy(std::exchange(graph_exec, nullptr));
  if (graph != nullptr) cudaGraphDestroy(std::exchange(graph, nullptr));
}

void WaveBufferLayer::Impl::ensure_aux() {
  if (aux == nullptr) {
    RETROINFER_CUDA_CHECK(
        cudaStreamCreateWithPriority(&aux, cudaStreamNonBlocking, detail::stream_priorities().urgent));
    for (cudaEvent_t* e : {&ev_fork, &ev_applied, &ev_looked_up, &ev_ringed})
      RETROINFER_CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
  }
  if (wcfg.stage_times && stage_ev[0] == nullptr)
    for (cudaEvent_t& e : stage_ev) RETROINFER_CUDA_CHECK(cudaEventCreate(&e));
}

void WaveBufferLayer::Impl::collect_stage_times() {
  if (!stage_pending) return;
  stage_pending = false;
  RETROINFER_CUDA_CHECK(cudaEventSynchronize(stage_ev[kEnd]));
  auto ms = [&](int a, int b) {
    float x = 0.0f;
    RETROINFER_CUDA_CHECK(cudaEventElapsedTime(&x, stage_ev[a], stage_ev[b]));
    return double(x);
  };
  stage_sum.apply += ms(kApplyStart, kApplied);
  stage_sum.select += ms(kStart, kSelected);
  stage_sum.apply_wait += ms(kSelected, kLookupBegin);
  stage_sum.lookup += ms(kLookupBegin, kLookedUp);
  stage_sum.gather += ms(kLookedUp, kGathered);
  stage_sum.attention += ms(kGathered, kAttended);
  stage_sum.ring_wait += ms(kAttended, kEnd);
  stage_sum.step += ms(kStart, kEnd);
  ++stage_sum.steps;
}

// One step. With `marks` (decode_stage_ms) every stage runs on `stream` in turn with an event after each;
// otherwise the apply and the ring run on the layer's second stream (Impl::aux).
void WaveBufferLayer::launch_step(const float* q, float* out, void* stream, std::vector<void*>* marks) {
  auto& m = *impl_;
  RETROINFER_CHECK(m.manager != nullptr, "WaveBufferLayer::decode: build() was not called");
  RETROINFER_CHECK(q != nullptr && out != nullptr, "WaveBufferLayer::decode: null q or out");
  m.manager->check();
  auto st = static_cast<cudaStream_t>(stream);
  auto mark = [&] {
    if (marks == nullptr) return;
    cudaEvent_t e;
    RETROINFER_CUDA_CHECK(cudaEventCreate(&e));
    RETROINFER_CUDA_CHECK(cudaEventRecord(e, st));
    marks->push_back(e);
  };
  const bool two_streams = marks == nullptr;
  if (two_streams) m.ensure_aux();
  const bool timed = two_streams && m.wcfg.stage_times && !m.capturing;
  if (timed) m.collect_stage_times();  // the previous step's events are reused below
  auto stamp = [&](Impl::StageEvent e, cudaStream_t s) {
    if (timed) RETROINFER_CUDA_CHECK(cudaEventRecord(m.stage_ev[e], s));
  };
  auto fork = [&](cudaEvent_t e, cudaStream_t from, cudaStream_t to) {
    RETROINFER_CUDA_CHECK(cudaEventRecord(e, from));
    RETROINFER_CUDA_CHECK(cudaStreamWaitEvent(to, e, 0));
  };
  const detail::WaveTables t = m.tables();
  mark();
  stamp(Impl::kStart, st);
  // The apply reads the mailbox and the previous step's execution buffer and writes the page table and cache
  // pages: nothing the selection reads, so it runs beside it, or was issued before the step
  // (issue_apply_ahead).
  if (two_streams) {
    if (!m.applied_ahead) m.issue_apply(st, timed);
  } else if (m.applied_ahead) {
    RETROINFER_CUDA_CHECK(cudaStreamWaitEvent(st, m.ev_applied, 0));
  } else {
    if (m.override_fill) m.copy_override_ids(st);
    detail::launch_check(detail::wave_apply(m.apply_params(), st), "wave_apply", st);
  }
  m.applied_ahead = false;
  // An index update after the override's copy (issued ahead) grew C and n_r: the step's ids again, for them.
  if (m.override_fill && m.override_step != static_cast<int64_t>(m.steps)) m.copy_override_ids(st);
  mark();

  detail::ZoneDecodeArgs a;
  detail::fill_index_args(a, m, m.offsets_abs.as<int>(), q, out);
  if (m.int8_on) {
    a.centroids_q8 = m.centroids_q8.as<uint8_t>();
    a.centroid_scale = m.centroid_scale.as<float>();
  }
  // Exact attention over the execution buffer: every head reads the same identity list.
  a.k = m.exec_k.as<uint16_t>();
  a.v = m.exec_v.as<uint16_t>();
  a.kv_stride = m.list_cap;
  a.exact_list = m.identity.as<int>();
  a.exact_count = m.exec_count.as<int>();
  a.exact_list_stride = 0;
  // The same launch sequence as RetroLayer's (with the lookup and gather between the selection and the exact
  // attention), so that a cache holding everything gives the index's output bit for bit.
  a.timing = marks != nullptr;
  // Between the selection and the exact attention: lookup (+ ring), gather.
  const int* retrieval_ids = m.override_fill ? m.override_ids.as<int>() : m.ret_ids.as<int>();
  auto lookup_gather = [&] {
    mark();
    stamp(Impl::kSelected, st);
    if (two_streams) RETROINFER_CUDA_CHECK(cudaStreamWaitEvent(st, m.ev_applied, 0));
    stamp(Impl::kLookupBegin, st);
    detail::WaveLookupParams lp;
    lp.t = t;
    lp.retrieval_ids = retrieval_ids;
    lp.k = m.n_r;
    lp.steady_rows = m.steady_rows;
    lp.seg_row = m.seg_row.as<int>();
    lp.seg_hit = m.seg_hit.as<uint8_t>();
    lp.exec_count = m.exec_count.as<int>();
    lp.counts = m.counts.as<int64_t>();
    detail::launch_check(detail::wave_lookup(lp, st), "wave_lookup", st);
    detail::WaveRingParams rp;
    rp.layout = m.layout;
    rp.region = m.region.device();
    rp.state = m.state.as<detail::WaveDeviceState>();
    rp.retrieval_ids = lp.retrieval_ids;
    rp.seg_row = lp.seg_row;
    rp.seg_hit = lp.seg_hit;
    rp.k_src = m.n_r;
    // The ring only reads what the lookup wrote and writes pinned memory and the device state (read by the
    // next step's apply, after the join below): it runs beside the gather and attention.
    if (two_streams) {
      fork(m.ev_looked_up, st, m.aux);
      detail::launch_check(detail::wave_ring(rp, m.aux), "wave_ring", m.aux);
      RETROINFER_CUDA_CHECK(cudaEventRecord(m.ev_ringed, m.aux));
    } else {
      detail::launch_check(detail::wave_ring(rp, st), "wave_ring", st);
    }
    mark();
    stamp(Impl::kLookedUp, st);

    detail::WaveGatherParams gp;
    gp.t = t;
    gp.retrieval_ids = lp.retrieval_ids;
    gp.seg_row = lp.seg_row;
    gp.seg_hit = lp.seg_hit;
    gp.k = m.n_r;
    gp.steady_k = m.steady_k.as<uint16_t>();
    gp.steady_v = m.steady_v.as<uint16_t>();
    gp.steady_cap = m.steady_cap;
    gp.steady_rows = m.steady_rows;
    detail::launch_check(detail::wave_gather(gp, st), "wave_gather", st);
    mark();
    stamp(Impl::kGathered, st);
  };
  detail::launch_zone_decode(
      a, st,
      [&](const char* stage) {
        if (std::string_view(stage) == "combine") mark();
      },
      lookup_gather);
  if (two_streams) {
    stamp(Impl::kAttended, st);
    RETROINFER_CUDA_CHECK(cudaStreamWaitEvent(st, m.ev_ringed, 0));
    stamp(Impl::kEnd, st);
    m.stage_pending = timed;
  }
}

// Decode-time growth of the steady tail, then the index updates that fall due (wave_buffer_layer_update.cpp).
// The tail's capacity starts at window + update_tokens rows beyond the build's steady zone and doubles
// when full (one synchronisation, steady and execution buffers reallocated with their rows copied, the
// splits resized, a captured graph dropped).
void WaveBufferLayer::append(const uint16_t* k_new, const uint16_t* v_new, Stream s) {
  auto& m = *impl_;
  RETROINFER_CHECK(m.manager != nullptr, "WaveBufferLayer::append: build() was not called");
  RETROINFER_CHECK(k_new != nullptr && v_new != nullptr, "WaveBufferLayer::append: null k_new or v_new");
  auto st = static_cast<cudaStream_t>(s);
  const size_t row = size_t(m.D) * 2;
  if (m.steady_rows >= m.steady_cap) {
    RETROINFER_CUDA_CHECK(cudaStreamSynchronize(st));
    RETROINFER_CUDA_CHECK(cudaDeviceSynchronize());  // the steps in flight on any stream read the buffers
    const int64_t add = std::max<int64_t>(int64_t{m.cfg.window_tokens} + m.cfg.update_tokens, m.steady_cap);
    const int64_t cap = m.steady_cap + add, list = m.list_cap + add;
    auto regrow = [&](DeviceBuffer& buf, int64_t old_rows, int64_t new_rows, int64_t used_rows) {
      DeviceBuffer nb(std::max<size_t>(size_t(m.H) * new_rows * row, 16));
      if (used_rows > 0)
        RETROINFER_CUDA_CHECK(cudaMemcpy2D(nb.data(), new_rows * row, buf.data(), old_rows * row, used_rows * row,
                                           size_t(m.H), cudaMemcpyDeviceToDevice));
      buf = std::move(nb);
    };
    regrow(m.steady_k, m.steady_cap, cap, m.steady_rows);
    regrow(m.steady_v, m.steady_cap, cap, m.steady_rows);
    // The execution buffer keeps its rows: the manager's next admissions copy from the last step's rows.
    regrow(m.exec_k, m.list_cap, list, m.list_cap);
    regrow(m.exec_v, m.list_cap, list, m.list_cap);
    std::vector<int32_t> ids(static_cast<size_t>(list));
    std::iota(ids.begin(), ids.end(), 0);
    m.identity = upload_vec(ids);
    m.token_list = DeviceBuffer(size_t(m.H) * list * 4);
    m.steady_cap = cap;
    m.list_cap = list;
    m.attn_splits = detail::exact_splits(m.list_cap, m.H);
    const int total = m.attn_splits + m.est_splits;
    m.part_ml = DeviceBuffer(size_t(m.H) * total * m.G * 8);
    m.part_o = DeviceBuffer(size_t(m.H) * total * m.G * m.D * 4);
    m.drop_graph();
  }
  uint16_t* dk = m.steady_k.as<uint16_t>() + size_t(m.steady_rows) * m.D;
  uint16_t* dv = m.steady_v.as<uint16_t>() + size_t(m.steady_rows) * m.D;
  RETROINFER_CUDA_CHECK(cudaMemcpy2DAsync(dk, m.steady_cap * row, k_new, row, row, size_t(m.H), cudaMemcpyDeviceToDevice, st));
  RETROINFER_CUDA_CHECK(cudaMemcpy2DAsync(dv, m.steady_cap * row, v_new, row, row, size_t(m.H), cudaMemcpyDeviceToDevice, st));
  ++m.steady_rows;
  ++m.n;
  // CPU rule (attention/retro.cpp sync(), RetroLayer::append): while the tokens after the indexed region
  // number at least window + update_tokens, the oldest update_tokens of them become update_clusters
  // clusters.
  while (m.wcfg.index_updates && index_update_due(m.n - (m.idx_begin + m.n_idx), m.cfg)) m.index_update(st);
}

int64_t WaveBufferLayer::num_tokens() const { return impl_->n; }
int64_t WaveBufferLayer::steady_rows() const { return impl_->steady_rows; }
int WaveBufferLayer::num_clusters() const { return impl_->C; }
int WaveBufferLayer::n_retrieval() const { return impl_->n_r; }
int WaveBufferLayer::n_estimation() const { return impl_->n_e; }
int64_t WaveBufferLayer::num_updates() const { return impl_->updates; }
int64_t WaveBufferLayer::indexed_begin() const { return impl_->idx_begin; }
int64_t WaveBufferLayer::indexed_tokens() const { return impl_->n_idx; }
int64_t WaveBufferLayer::outlier_rows() const { return impl_->n_out; }
int64_t WaveBufferLayer::retrieval_capacity() const { return impl_->list_cap - impl_->steady_cap; }
int64_t WaveBufferLayer::device_bytes() const {
  const auto& m = *impl_;
  const DeviceBuffer* bufs[] = {&m.centroids_bf16, &m.centroids_q8, &m.centroid_scale, &m.value_sums_bf16, &m.sizes,
                                &m.offsets_abs, &m.members,
                                &m.offsets_head, &m.slot_begin, &m.store_at, &m.cluster_pages, &m.resident, &m.cache_k,
                                &m.cache_v, &m.exec_k, &m.exec_v, &m.steady_k, &m.steady_v, &m.identity,
                                &m.exec_count, &m.counts, &m.seg_row, &m.seg_hit, &m.state, &m.mirror,
                                &m.logits, &m.norm_partial, &m.scores, &m.ret_ids, &m.est_ids, &m.scan_scratch,
                                &m.token_list, &m.token_count, &m.part_ml, &m.part_o, &m.store_dev,
                                &m.store_base, &m.sel_ws};
  int64_t b = 0;
  for (const DeviceBuffer* x : bufs) b += static_cast<int64_t>(x->bytes());
  return b;
}
int64_t WaveBufferLayer::host_bytes() const {
  return static_cast<int64_t>(impl_->store_host.bytes() + impl_->region.bytes());
}

void WaveBufferLayer::decode(const float* q, float* out, Stream s) {
  launch_step(q, out, s, nullptr);
  ++impl_->steps;
}

std::vector<std::pair<std::string, float>> WaveBufferLayer::decode_stage_ms(const float* q, float* out) {
  std::vector<void*> marks;
  launch_step(q, out, nullptr, &marks);
  ++impl_->steps;
  static const char* kNames[] = {"apply", "select", "lookup", "gather", "attention"};
  std::vector<std::pair<std::string, float>> out_ms;
  RETROINFER_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(marks.back())));
  for (size_t i = 1; i < marks.size(); ++i) {
    float ms = 0.0f;
    RETROINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(marks[i - 1]), static_cast<cudaEvent_t>(marks[i])));
    out_ms.emplace_back(kNames[i - 1], ms);
  }
  for (void* e : marks) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  return out_ms;
}

void WaveBufferLayer::capture_graph(const float* q, float* out, Stream s) {
  auto& m = *impl_;
  RETROINFER_CHECK(!m.override_fill, "WaveBufferLayer::capture_graph: a retrieval override is set (its ids change "
                   "every step); decode eagerly");
  RETROINFER_CHECK(s != nullptr, "WaveBufferLayer::capture_graph: needs a stream other than the default (cuda::StreamHandle)");
  auto st = static_cast<cudaStream_t>(s);
  RETROINFER_CHECK(!m.applied_ahead, "WaveBufferLayer::capture_graph: an apply was issued ahead (issue_apply_ahead) ",
                   "for a step not yet decoded; the graph holds its own apply: decode once first");
  m.drop_graph();
  m.ensure_aux();  // the second stream and its events exist before the capture
  m.collect_stage_times();
  RETROINFER_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeRelaxed));
  m.capturing = true;
  try {
    launch_step(q, out, s, nullptr);
    m.capturing = false;
  } catch (...) {
    m.capturing = false;
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(st, &g);
    if (g != nullptr) cudaGraphDestroy(g);
    throw;
  }
  RETROINFER_CUDA_CHECK(cudaStreamEndCapture(st, &m.graph));
  RETROINFER_CUDA_CHECK(cudaGraphInstantiate(&m.graph_exec, m.graph, detail::kGraphInstantiateFlags));
}

void WaveBufferLayer::set_retrieval_override(RetrievalOverride fill) {
  RETROINFER_CHECK(impl_->graph_exec == nullptr || !fill, "WaveBufferLayer::set_retrieval_override: a graph is "
                   "captured (it would keep the selection's ids); set the override before capture_graph");
  impl_->override_fill = std::move(fill);
}

detail::WaveApplyParams WaveBufferLayer::Impl::apply_params() {
  detail::WaveApplyParams ap;
  ap.t = tables();
  ap.layout = layout;
  ap.region = region.device();
  ap.mirror = mirror.data();
  ap.state = state.as<detail::WaveDeviceState>();
  return ap;
}

void WaveBufferLayer::Impl::issue_apply(cudaStream_t from, bool timed) {
  RETROINFER_CUDA_CHECK(cudaEventRecord(ev_fork, from));
  RETROINFER_CUDA_CHECK(cudaStreamWaitEvent(aux, ev_fork, 0));
  if (timed) RETROINFER_CUDA_CHECK(cudaEventRecord(stage_ev[kApplyStart], aux));
  if (override_fill) copy_override_ids(aux);
  detail::launch_check(detail::wave_apply(apply_params(), aux), "wave_apply", aux);
  if (timed) RETROINFER_CUDA_CHECK(cudaEventRecord(stage_ev[kApplied], aux));
  RETROINFER_CUDA_CHECK(cudaEventRecord(ev_applied, aux));
}

bool WaveBufferLayer::issue_apply_ahead(Stream s) {
  auto& m = *impl_;
  RETROINFER_CHECK(m.manager != nullptr, "WaveBufferLayer::issue_apply_ahead: build() was not called");
  if (m.applied_ahead || m.graph_exec != nullptr || m.capturing) return false;
  m.manager->check();
  m.ensure_aux();
  const bool timed = m.wcfg.stage_times;
  if (timed) m.collect_stage_times();  // the last step's apply events are recorded again below
  m.issue_apply(static_cast<cudaStream_t>(s), timed);
  m.applied_ahead = true;
  return true;
}

void WaveBufferLayer::Impl::copy_override_ids(cudaStream_t st) {
  const size_t count = size_t(H) * size_t(n_r);
  if (count == 0) return;
  const int slot = int(steps % kOverrideSlots);
  if (override_done[slot] == nullptr) {
    RETROINFER_CUDA_CHECK(cudaEventCreateWithFlags(&override_done[slot], cudaEventDisableTiming));
  } else {
    RETROINFER_CUDA_CHECK(cudaEventSynchronize(override_done[slot]));  // its copy of 4 steps ago
  }
  if (override_host[slot].bytes() < count * 4) override_host[slot] = PinnedHost(count * 4, /*allow_register=*/false);
  auto* ids = static_cast<int32_t*>(override_host[slot].host());
  override_fill(static_cast<int64_t>(steps), C, n_r, ids);
  for (int h = 0; h < H; ++h) {  // the lookup and gather trust these: check them on the host (H * n_r ints)
    const int32_t* r = ids + size_t(h) * n_r;
    for (int j = 0; j < n_r; ++j)
      RETROINFER_CHECK(r[j] == -1 ? (j + 1 == n_r || r[j + 1] == -1)
                                  : (r[j] >= 0 && r[j] < C && (j == 0 || (r[j - 1] >= 0 && r[j] > r[j - 1]))),
                       "WaveBufferLayer: the retrieval override gave head ", h, " ids that are not ascending in [0, ",
                       C, ") followed by -1 (position ", j, ": ", r[j], ")");
  }
  if (override_ids.bytes() < count * 4) override_ids = DeviceBuffer(count * 4);
  RETROINFER_CUDA_CHECK(cudaMemcpyAsync(override_ids.data(), ids, count * 4, cudaMemcpyHostToDevice, st));
  override_step = static_cast<int64_t>(steps);
  RETROINFER_CUDA_CHECK(cudaEventRecord(override_done[slot], st));
}

void WaveBufferLayer::replay_graph(Stream s) {
  auto& m = *impl_;
  RETROINFER_CHECK(m.graph_exec != nullptr, "WaveBufferLayer::replay_graph: no captured graph (capture_graph() was not called, or an ",
                   "index update or a steady-zone growth in append() dropped it: capture again)");
  m.manager->check();
  RETROINFER_CUDA_CHECK(cudaGraphLaunch(m.graph_exec, static_cast<cudaStream_t>(s)));
  ++m.steps;
}

void WaveBufferLayer::wait_manager() {
  auto& m = *impl_;
  RETROINFER_CHECK(m.manager != nullptr, "WaveBufferLayer::wait_manager: build() was not called");
  m.manager->wait_idle(m.steps - m.steps_base);
}

void WaveBufferLayer::check() {
  if (impl_->manager) impl_->manager->check();
}

void WaveBufferLayer::set_admission(bool on) {
  RETROINFER_CHECK(impl_->manager != nullptr, "WaveBufferLayer::set_admission: build() was not called");
  impl_->manager->set_admission(on);
}

WaveBufferStats WaveBufferLayer::stats() {
  auto& m = *impl_;
  RETROINFER_CHECK(m.manager != nullptr, "WaveBufferLayer::stats: build() was not called");
  m.manager->check();
  WaveBufferStats s = m.manager->stats();
  s += m.stats_base;  // managers before a protocol rebuild
  return s;
}

WaveStageTimes WaveBufferLayer::stage_times() {
  auto& m = *impl_;
  m.collect_stage_times();
  return m.stage_sum;
}

WaveStepCounts WaveBufferLayer::last_step_counts() {
  auto& m = *impl_;
  RETROINFER_CUDA_CHECK(cudaDeviceSynchronize());
  std::vector<int64_t> c(size_t(m.H) * 4);
  m.counts.download(c.data(), c.size() * 8);
  detail::WaveDeviceState st;
  m.state.download(&st, sizeof st);
  RETROINFER_CHECK(st.error == 0, "WaveBufferLayer: the apply kernel skipped out-of-range mailbox entries (error bits ",
                   st.error, "): the manager and the device tables disagree");
  WaveStepCounts w;
  for (int h = 0; h < m.H; ++h) {
    w.hit_clusters += c[size_t(h) * 4 + 0];
    w.miss_clusters += c[size_t(h) * 4 + 1];
    w.hit_rows += c[size_t(h) * 4 + 2];
    w.miss_rows += c[size_t(h) * 4 + 3];
  }
  w.steady_rows = int64_t{m.H} * m.steady_rows;
  return w;
}

RetroLayer& WaveBufferLayer::index() { return *impl_->index; }
void WaveBufferLayer::release_index() { impl_->index->release(); }
int64_t WaveBufferLayer::cache_pages_per_head() const { return impl_->P; }
int64_t WaveBufferLayer::exec_capacity() const { return impl_->list_cap; }
int64_t WaveBufferLayer::store_bytes() const {
  return int64_t{impl_->H} * impl_->per_head * store_token_bytes(impl_->wcfg.store_dtype, impl_->D);
}
int64_t WaveBufferLayer::steps_issued() const { return static_cast<int64_t>(impl_->steps); }
bool WaveBufferLayer::store_on_host() const { return impl_->wcfg.tier == KvTier::kHost; }

std::pair<int64_t, int64_t> device_memory_info() {
  size_t free_b = 0, total_b = 0;
  RETROINFER_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return {static_cast<int64_t>(free_b), static_cast<int64_t>(total_b)};
}

void copy_device_async(void* dst, const void* src, size_t bytes, Stream s) {
  RETROINFER_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(s)));
}

}  // namespace retroinfer::cuda
