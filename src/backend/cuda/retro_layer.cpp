// RetroLayer: the wave index built and used on the GPU (k-means at build, score / select / estimate /
// sparse attention / merge at decode).
#include <algorithm>
#include <functional>
#include <numeric>
#include <vector>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/layer_common.h"
#include "retroinfer/cuda_backend.h"

namespace retroinfer::cuda {

namespace {
// (Re)allocates `buf` when it is smaller than `bytes` (grow only).
void ensure(DeviceBuffer& buf, size_t bytes) {
  if (buf.bytes() < bytes) buf = DeviceBuffer(bytes);
}
}  // namespace

// The estimation zone runs on a side stream, concurrently with the exact attention (both only read the
// selection): fork after select_and_expand, join before combine_states. Capturable into a graph.
struct SideStream {
  cudaStream_t stream = nullptr;
  cudaEvent_t fork = nullptr, join = nullptr;
  SideStream() {
    RETROINFER_CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    RETROINFER_CUDA_CHECK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    RETROINFER_CUDA_CHECK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
  }
  ~SideStream() {
    cudaEventDestroy(fork);
    cudaEventDestroy(join);
    cudaStreamDestroy(stream);
  }
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
};

struct RetroLayer::Impl {
  std::unique_ptr<SideStream> side;
  AttentionShape shape;
  AttentionConfig cfg;
  int num_seqs = 1, H = 0, G = 0, D = 0;
  float scale = 0.0f;
  // Current build.
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  int64_t n = 0, kv_stride = 0, idx_begin = 0, n_idx = 0;
  int C = 0, S = 0, max_seg = 0, n_r = 0, n_e = 0;
  int64_t list_cap = 0;
  int attn_splits = 0, est_splits = 0;
  bool decoded = false;
  // Index (see detail::KMeansParams for shapes).
  DeviceBuffer seg_tokens, seg_clusters, mean_partial, mean, centred, centroids, centroids_bf16, value_sums,
      value_sums_bf16, sizes, assignment, sort_keys, sort_keys_out, iota, members, offsets, sort_temp;
  // Decode workspace.
  DeviceBuffer logits, norm_partial, scores, ret_ids, est_ids, scan_scratch, token_list, token_count, part_ml, part_o;
  int64_t iota_items = -1, iota_n = -1;

  detail::KMeansParams kmeans_params() const {
    detail::KMeansParams p;
    p.keys = k;
    p.values = v;
    p.kv_stride = kv_stride;
    p.idx_begin = idx_begin;
    p.n_idx = n_idx;
    p.num_heads = H;
    p.head_dim = D;
    p.num_clusters = C;
    p.num_segments = S;
    p.seg_token_begin = seg_tokens.as<int>();
    p.seg_cluster_begin = seg_clusters.as<int>();
    p.max_seg_tokens = max_seg;
    p.mean_partial = mean_partial.as<float>();
    p.mean = mean.as<float>();
    p.centred = centred.as<uint16_t>();
    p.centroids = centroids.as<float>();
    p.centroids_bf16 = centroids_bf16.as<uint16_t>();
    p.value_sums = value_sums.as<float>();
    p.value_sums_bf16 = value_sums_bf16.as<uint16_t>();
    p.sizes = sizes.as<int>();
    p.assignment = assignment.as<int>();
    p.sort_keys = sort_keys.as<uint32_t>();
    p.sort_keys_out = sort_keys_out.as<uint32_t>();
    p.iota = iota.as<uint32_t>();
    p.members = members.as<uint32_t>();
    p.offsets = offsets.as<int>();
    p.sort_temp = sort_temp.data();
    p.sort_temp_bytes = sort_temp.bytes();
    return p;
  }
};

RetroLayer::RetroLayer(const AttentionShape& shape, const AttentionConfig& cfg, int num_seqs) : impl_(new Impl) {
  detail::validate_layer_shape(shape, num_seqs, "RetroLayer");
  RETROINFER_CHECK(cfg.sink_tokens >= 0 && cfg.window_tokens >= 0, "RetroLayer: negative sink (",
                   cfg.sink_tokens, ") or window (", cfg.window_tokens, ") tokens");
  RETROINFER_CHECK(cfg.tokens_per_cluster >= 1 && cfg.segment_tokens >= 1, "RetroLayer: tokens_per_cluster (",
                   cfg.tokens_per_cluster, ") and segment_tokens (", cfg.segment_tokens, ") must be >= 1");
  RETROINFER_CHECK(cfg.kmeans_segment_iters >= 0 && cfg.kmeans_global_iters >= 0,
                   "RetroLayer: negative k-means iteration counts");
  RETROINFER_CHECK(cfg.retrieval_fraction >= 0.0 && cfg.retrieval_fraction <= 1.0 &&
                       cfg.estimation_fraction >= 0.0 && cfg.estimation_fraction <= 1.0,
                   "RetroLayer: retrieval / estimation fractions must be in [0, 1], got ", cfg.retrieval_fraction,
                   " and ", cfg.estimation_fraction);
  auto& m = *impl_;
  m.shape = shape;
  m.cfg = cfg;
  m.num_seqs = num_seqs;
  m.H = num_seqs * shape.num_heads_kv;
  m.G = shape.num_heads_q / shape.num_heads_kv;
  m.D = shape.head_dim;
  m.scale = detail::effective_scale(cfg.scale, shape.head_dim);
}
RetroLayer::~RetroLayer() = default;
RetroLayer::RetroLayer(RetroLayer&&) noexcept = default;
RetroLayer& RetroLayer::operator=(RetroLayer&&) noexcept = default;

void RetroLayer::build(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride, Stream s) {
  detail::validate_kv(k, v, num_tokens, kv_stride, "RetroLayer::build");
  auto& m = *impl_;
  auto st = static_cast<cudaStream_t>(s);
  m.k = k;
  m.v = v;
  m.n = num_tokens;
  m.kv_stride = kv_stride;
  m.decoded = false;
  const int64_t s_end = std::min<int64_t>(m.cfg.sink_tokens, num_tokens);
  const int64_t w_begin = std::max<int64_t>(s_end, num_tokens - m.cfg.window_tokens);
  m.idx_begin = s_end;
  m.n_idx = w_begin - s_end;
  // As the CPU method (attention/retro.cpp): less than one cluster's worth of tokens stays steady.
  if (m.n_idx < m.cfg.tokens_per_cluster) m.n_idx = 0;
  const int64_t steady = num_tokens - m.n_idx;
  const int H = m.H, D = m.D;
  if (m.n_idx == 0) {
    m.C = m.S = m.n_r = m.n_e = 0;
    m.list_cap = steady;
  } else {
    // Segments and their cluster counts (kmeans.h: max(1, ceil(L / tokens_per_cluster)) per segment).
    std::vector<int> seg_t{0}, seg_c{0};
    for (int64_t b = 0; b < m.n_idx; b += m.cfg.segment_tokens) {
      const int64_t L = std::min<int64_t>(m.cfg.segment_tokens, m.n_idx - b);
      seg_t.push_back(static_cast<int>(b + L));
      seg_c.push_back(seg_c.back() + static_cast<int>(std::max<int64_t>(1, detail::ceil_div(L, m.cfg.tokens_per_cluster))));
      m.max_seg = std::max<int>(m.max_seg, static_cast<int>(L));
    }
    m.S = static_cast<int>(seg_t.size()) - 1;
    m.C = seg_c.back();
    // Zone budgets (index/wave_index.h: ceil with a 1e-9 slack, retrieval at least 1).
    auto share = [&](double f) {
      return static_cast<int>(std::min<double>(m.C, std::ceil(f * m.C - 1e-9)));
    };
    m.n_r = share(m.cfg.retrieval_fraction);
    if (m.cfg.retrieval_fraction > 0.0) m.n_r = std::max(m.n_r, 1);
    m.n_e = m.cfg.estimation ? std::min(share(m.cfg.estimation_fraction), m.C - m.n_r) : 0;

    const size_t items = size_t(H) * m.n_idx, flat = size_t(H) * m.C;
    ensure(m.seg_tokens, seg_t.size() * 4);
    ensure(m.seg_clusters, seg_c.size() * 4);
    m.seg_tokens.upload(seg_t.data(), seg_t.size() * 4);
    m.seg_clusters.upload(seg_c.data(), seg_c.size() * 4);
    ensure(m.mean_partial, size_t(H) * detail::kMeanChunks * D * 4);
    ensure(m.mean, size_t(H) * D * 4);
    ensure(m.centred, items * D * 2);
    ensure(m.centroids, flat * D * 4);
    ensure(m.centroids_bf16, flat * D * 2);
    ensure(m.value_sums, flat * D * 4);
    ensure(m.value_sums_bf16, flat * D * 2);
    ensure(m.sizes, flat * 4);
    ensure(m.assignment, items * 4);
    ensure(m.sort_keys, items * 4);
    ensure(m.sort_keys_out, items * 4);
    ensure(m.members, items * 4);
    ensure(m.offsets, (flat + 1) * 4);
    ensure(m.iota, items * 4);
    if (m.iota_items != int64_t(items) || m.iota_n != m.n_idx) {
      std::vector<uint32_t> io(items);
      for (size_t i = 0; i < items; ++i) io[i] = static_cast<uint32_t>(i % m.n_idx);
      m.iota.upload(io.data(), items * 4);
      m.iota_items = int64_t(items);
      m.iota_n = m.n_idx;
    }
    int bits = 1;
    while ((size_t{1} << bits) < flat) ++bits;
    ensure(m.sort_temp, std::max<size_t>(detail::kmeans_sort_temp_bytes(int64_t(items), bits), 16));

    const detail::KMeansParams p = m.kmeans_params();
    detail::launch_check(detail::kmeans_mean(p, st), "kmeans_mean", st);
    detail::launch_check(detail::kmeans_init(p, st), "kmeans_init", st);
    if (m.cfg.kmeans_segment_iters + m.cfg.kmeans_global_iters == 0) {
      detail::launch_check(detail::kmeans_assign(p, false, st), "kmeans_assign", st);
      detail::launch_check(detail::kmeans_group(p, st), "kmeans_group", st);
    }
    for (int it = 0; it < m.cfg.kmeans_segment_iters; ++it) {
      detail::launch_check(detail::kmeans_assign(p, false, st), "kmeans_assign(segment)", st);
      detail::launch_check(detail::kmeans_group(p, st), "kmeans_group", st);
      detail::launch_check(detail::kmeans_update(p, true, st), "kmeans_update(spherical)", st);
    }
    for (int it = 0; it < m.cfg.kmeans_global_iters; ++it) {
      detail::launch_check(detail::kmeans_assign(p, true, st), "kmeans_assign(global)", st);
      detail::launch_check(detail::kmeans_group(p, st), "kmeans_group", st);
      detail::launch_check(detail::kmeans_update(p, false, st), "kmeans_update(mean)", st);
    }
    detail::launch_check(detail::kmeans_finalize(p, st), "kmeans_finalize", st);

    // Token-list capacity: the steady zone plus the largest n_r clusters of any head.
    std::vector<int32_t> sz(flat);
    RETROINFER_CUDA_CHECK(cudaMemcpyAsync(sz.data(), m.sizes.data(), flat * 4, cudaMemcpyDeviceToHost, st));
    RETROINFER_CUDA_CHECK(cudaStreamSynchronize(st));
    int64_t most = 0;
    for (int h = 0; h < H; ++h) {
      std::vector<int32_t> one(sz.begin() + int64_t(h) * m.C, sz.begin() + int64_t(h + 1) * m.C);
      std::partial_sort(one.begin(), one.begin() + m.n_r, one.end(), std::greater<>());
      most = std::max<int64_t>(most, std::accumulate(one.begin(), one.begin() + m.n_r, int64_t{0}));
    }
    m.list_cap = steady + most;
    ensure(m.logits, size_t(H) * m.G * m.C * 4);
    ensure(m.norm_partial, size_t(H) * m.G * detail::score_blocks(m.C, D, H) * 8);
    ensure(m.scores, flat * 4);
    ensure(m.ret_ids, size_t(H) * std::max(m.n_r, 1) * 4);
    ensure(m.est_ids, size_t(H) * std::max(m.n_e, 1) * 4);
    ensure(m.scan_scratch, size_t(H) * (m.n_r + 1) * 4);
  }
  ensure(m.token_list, size_t(H) * m.list_cap * 4);
  ensure(m.token_count, size_t(H) * 4);
  // Splits: about one wave of CTAs for the exact part (its lists are short), a fraction for estimation.
  m.attn_splits = detail::decode_splits(m.n_idx == 0 ? num_tokens : m.list_cap, H, 1);
  m.est_splits = static_cast<int>(detail::ceil_div(m.n_e, detail::kEstimateChunk));
  const int total = m.attn_splits + m.est_splits;
  ensure(m.part_ml, size_t(H) * total * m.G * 8);
  ensure(m.part_o, size_t(H) * total * m.G * D * 4);
}

void RetroLayer::decode(const float* q, float* out, Stream s) { decode_impl(q, out, s, nullptr); }

std::vector<std::pair<std::string, float>> RetroLayer::decode_stage_ms(const float* q, float* out) {
  std::vector<std::pair<std::string, float>> stages;
  decode_impl(q, out, nullptr, &stages);
  return stages;
}

void RetroLayer::decode_impl(const float* q, float* out, Stream s,
                             std::vector<std::pair<std::string, float>>* stages) {
  auto& m = *impl_;
  // Stage timing (diagnostics): an event after each stage on the stream, read at the end.
  std::vector<std::pair<std::string, cudaEvent_t>> marks;
  auto mark = [&](const char* name) {
    if (stages == nullptr) return;
    cudaEvent_t e;
    RETROINFER_CUDA_CHECK(cudaEventCreate(&e));
    RETROINFER_CUDA_CHECK(cudaEventRecord(e, static_cast<cudaStream_t>(s)));
    marks.emplace_back(name, e);
  };
  mark("start");
  RETROINFER_CHECK(m.n > 0, "RetroLayer::decode: build() was not called");
  RETROINFER_CHECK(q != nullptr && out != nullptr, "RetroLayer::decode: null q or out");
  auto st = static_cast<cudaStream_t>(s);
  const int total = m.attn_splits + m.est_splits;
  detail::DecodeParams dp;
  dp.q = q;
  dp.k = m.k;
  dp.v = m.v;
  dp.kv_stride = m.kv_stride;
  dp.num_heads = m.H;
  dp.group = m.G;
  dp.head_dim = m.D;
  dp.scale = m.scale;
  dp.num_splits = m.attn_splits;
  dp.part_ml = m.part_ml.as<float2>();
  dp.part_o = m.part_o.as<float>();
  dp.total_splits = total;
  dp.split_offset = 0;
  if (m.n_idx == 0) {  // everything is steady zone: exact attention
    dp.num_tokens = m.n;
    dp.split_tokens = detail::split_tokens(m.n, m.attn_splits);
  } else {
    detail::ScoreParams sp;
    sp.q = q;
    sp.centroids_bf16 = m.centroids_bf16.as<uint16_t>();
    sp.sizes = m.sizes.as<int>();
    sp.logits = m.logits.as<float>();
    sp.norm_partial = m.norm_partial.as<float2>();
    sp.num_heads = m.H;
    sp.group = m.G;
    sp.head_dim = m.D;
    sp.num_clusters = m.C;
    sp.scale = m.scale;
    detail::launch_check(detail::score_clusters(sp, st), "score_clusters", st);
    mark("score");

    detail::SelectParams se;
    se.logits = sp.logits;
    se.norm_partial = sp.norm_partial;
    se.norm_parts = detail::score_blocks(m.C, m.D, m.H);
    se.scores = m.scores.as<float>();
    se.num_heads = m.H;
    se.group = m.G;
    se.num_items = m.C;
    se.k_retrieval = m.n_r;
    se.k_estimation = m.n_e;
    se.retrieval_ids = m.ret_ids.as<int>();
    se.estimation_ids = m.est_ids.as<int>();
    se.offsets = m.offsets.as<int>();
    se.members = m.members.as<uint32_t>();
    se.n_idx = m.n_idx;
    se.idx_begin = m.idx_begin;
    se.num_tokens = m.n;
    se.token_list = m.token_list.as<int>();
    se.token_count = m.token_count.as<int>();
    se.scan_scratch = m.scan_scratch.as<int>();
    se.list_stride = m.list_cap;
    detail::launch_check(detail::select_and_expand(se, st), "select_and_expand", st);
    mark("select");

    const bool fork = m.n_e > 0 && stages == nullptr;  // stage timing keeps one stream
    if (fork) {
      if (!m.side) m.side = std::make_unique<SideStream>();
      RETROINFER_CUDA_CHECK(cudaEventRecord(m.side->fork, st));
      RETROINFER_CUDA_CHECK(cudaStreamWaitEvent(m.side->stream, m.side->fork, 0));
    }
    if (m.n_e > 0) {
      cudaStream_t est_stream = fork ? m.side->stream : st;
      detail::EstimateParams ep;
      ep.logits = sp.logits;
      ep.value_sums_bf16 = m.value_sums_bf16.as<uint16_t>();
      ep.sizes = m.sizes.as<int>();
      ep.estimation_ids = se.estimation_ids;
      ep.num_heads = m.H;
      ep.group = m.G;
      ep.head_dim = m.D;
      ep.num_clusters = m.C;
      ep.k_estimation = m.n_e;
      ep.num_splits = m.est_splits;
      ep.part_ml = dp.part_ml;
      ep.part_o = dp.part_o;
      ep.total_splits = total;
      ep.split_offset = m.attn_splits;
      detail::launch_check(detail::estimate_attention(ep, est_stream), "estimate_attention", est_stream);
      if (fork) RETROINFER_CUDA_CHECK(cudaEventRecord(m.side->join, est_stream));
      mark("estimate");
    }
    dp.token_list = se.token_list;
    dp.token_count = se.token_count;
    dp.list_stride = m.list_cap;
    dp.split_tokens = detail::split_tokens(m.list_cap, m.attn_splits);
  }
  detail::launch_check(detail::decode_attention(dp, st), "decode_attention(sparse)", st);
  mark("exact_attention");
  if (m.n_idx > 0 && m.n_e > 0 && stages == nullptr)
    RETROINFER_CUDA_CHECK(cudaStreamWaitEvent(st, m.side->join, 0));
  detail::CombineParams c;
  c.part_ml = dp.part_ml;
  c.part_o = dp.part_o;
  c.num_heads = m.H;
  c.group = m.G;
  c.head_dim = m.D;
  c.total_splits = total;
  c.out = out;
  detail::launch_check(detail::combine_states(c, st), "combine_states(retro)", st);
  mark("combine");
  m.decoded = true;
  if (stages != nullptr) {
    RETROINFER_CUDA_CHECK(cudaEventSynchronize(marks.back().second));
    for (size_t i = 1; i < marks.size(); ++i) {
      float ms = 0.0f;
      RETROINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, marks[i - 1].second, marks[i].second));
      stages->emplace_back(marks[i].first, ms);
    }
    for (auto& mk : marks) cudaEventDestroy(mk.second);
  }
}

int64_t RetroLayer::num_tokens() const { return impl_->n; }
int64_t RetroLayer::indexed_begin() const { return impl_->idx_begin; }
int64_t RetroLayer::indexed_tokens() const { return impl_->n_idx; }
int RetroLayer::num_clusters() const { return impl_->C; }
int RetroLayer::n_retrieval() const { return impl_->n_r; }
int RetroLayer::n_estimation() const { return impl_->n_e; }
int64_t RetroLayer::token_list_capacity() const { return impl_->list_cap; }

double RetroLayer::decode_bytes_required() {
  auto& m = *impl_;
  const double H = m.H, D = m.D, io = 2.0 * H * m.G * D * 4;  // q and out
  if (m.n_idx == 0) return H * m.n * D * 4 + io;
  RETROINFER_CHECK(m.decoded, "RetroLayer::decode_bytes_required: call decode() first");
  std::vector<int32_t> cnt(m.H);
  m.token_count.download(cnt.data(), cnt.size() * 4);
  const double exact = std::accumulate(cnt.begin(), cnt.end(), 0.0);
  return H * m.C * (D * 2 + 4) + H * m.n_e * D * 2 + exact * (D * 2 * 2 + 4) + io;
}

double RetroLayer::decode_bytes_moved() {
  auto& m = *impl_;
  double b = decode_bytes_required();
  if (m.n_idx == 0) return b;
  const double H = m.H, C = m.C, G = m.G, D = m.D;
  const int total = m.attn_splits + m.est_splits;
  b += H * G * C * 4 * 2;  // logits: written, read once for the scores
  b += H * C * 4 * 11;     // scores: written, read by the count, up to 8 radix passes and the compaction
  b += H * (m.n_r + m.n_e) * 4 * 2 + H * G * m.n_e * 4;  // ids written and read, estimation logits
  b += H * m.n_r * 8 * 2;                                  // CSR offsets and scan scratch
  b += 2.0 * H * total * G * (D + 2) * 4;                  // partial states written and merged
  return b;
}

RetroDebugState RetroLayer::debug_state(int flat_head) const {
  const auto& m = *impl_;
  RETROINFER_CHECK(flat_head >= 0 && flat_head < m.H, "RetroLayer::debug_state: flat head ", flat_head,
                   " outside [0, ", m.H, ")");
  RetroDebugState d;
  d.num_clusters = m.C;
  if (m.n_idx == 0) {  // decode attends densely to every (steady) token
    if (m.decoded) {
      d.token_list.resize(m.n);
      std::iota(d.token_list.begin(), d.token_list.end(), 0);
    }
    return d;
  }
  const size_t C = m.C, D = m.D, h = flat_head;
  auto get = [](auto& vec, const DeviceBuffer& buf, size_t count, size_t offset_elems) {
    vec.resize(count);
    buf.download(vec.data(), count * sizeof(vec[0]), offset_elems * sizeof(vec[0]));
  };
  synchronize();
  get(d.mean, m.mean, D, h * D);
  get(d.centroids, m.centroids, C * D, h * C * D);
  get(d.centroids_bf16, m.centroids_bf16, C * D, h * C * D);
  get(d.value_sums, m.value_sums, C * D, h * C * D);
  get(d.value_sums_bf16, m.value_sums_bf16, C * D, h * C * D);
  get(d.sizes, m.sizes, C, h * C);
  get(d.assignment, m.assignment, m.n_idx, h * m.n_idx);
  get(d.offsets, m.offsets, C + 1, h * C);
  for (auto& o : d.offsets) o -= static_cast<int32_t>(h * m.n_idx);
  std::vector<uint32_t> mem;
  get(mem, m.members, m.n_idx, h * m.n_idx);
  d.members.assign(mem.begin(), mem.end());
  if (!m.decoded) return d;
  get(d.logits, m.logits, size_t(m.G) * C, h * m.G * C);
  get(d.scores, m.scores, C, h * C);
  get(d.retrieval_ids, m.ret_ids, m.n_r, h * m.n_r);
  std::erase(d.retrieval_ids, -1);
  if (m.n_e > 0) {
    get(d.estimation_ids, m.est_ids, m.n_e, h * m.n_e);
    std::erase(d.estimation_ids, -1);
  }
  int32_t cnt = 0;
  m.token_count.download(&cnt, 4, h * 4);
  get(d.token_list, m.token_list, cnt, h * m.list_cap);
  return d;
}

}  // namespace retroinfer::cuda
