// QuestLayer: the quest baseline (page bounds, top pages, exact attention over them + the steady zone).
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cuda_check.h"
#include "attention/cuda/layer_common.h"
#include "retroinfer/cuda_backend.h"

namespace retroinfer::cuda {

namespace {
void ensure(DeviceBuffer& buf, size_t bytes) {
  if (buf.bytes() < bytes) buf = DeviceBuffer(bytes);
}
}  // namespace

struct QuestLayer::Impl {
  AttentionShape shape;
  AttentionConfig cfg;
  int num_seqs = 1, H = 0, G = 0, D = 0, P = 0, k_pages = 0, splits = 0;
  float scale = 0.0f;
  const uint16_t* k = nullptr;
  const uint16_t* v = nullptr;
  int64_t n = 0, kv_stride = 0, idx_begin = 0, n_idx = 0, list_cap = 0;
  DeviceBuffer page_min, page_max, scores, page_ids, scan_scratch, token_list, token_count, part_ml, part_o;
};

QuestLayer::QuestLayer(const AttentionShape& shape, const AttentionConfig& cfg, int num_seqs) : impl_(new Impl) {
  detail::validate_layer_shape(shape, num_seqs, "QuestLayer");
  validate(cfg);
  auto& m = *impl_;
  m.shape = shape;
  m.cfg = cfg;
  m.num_seqs = num_seqs;
  m.H = num_seqs * shape.num_heads_kv;
  m.G = shape.num_heads_q / shape.num_heads_kv;
  m.D = shape.head_dim;
  m.scale = detail::effective_scale(cfg.scale, shape.head_dim);
}
QuestLayer::~QuestLayer() = default;
QuestLayer::QuestLayer(QuestLayer&&) noexcept = default;
QuestLayer& QuestLayer::operator=(QuestLayer&&) noexcept = default;

void QuestLayer::build(const uint16_t* k, const uint16_t* v, int64_t num_tokens, int64_t kv_stride, Stream s) {
  detail::validate_kv(k, v, num_tokens, kv_stride, "QuestLayer::build");
  auto& m = *impl_;
  auto st = static_cast<cudaStream_t>(s);
  m.k = k;
  m.v = v;
  m.n = num_tokens;
  m.kv_stride = kv_stride;
  const SteadySplit split = steady_split(num_tokens, m.cfg);
  m.idx_begin = split.sink_end;
  m.n_idx = split.indexed();
  const int pt = m.cfg.quest_page_tokens;
  m.P = static_cast<int>(detail::ceil_div(m.n_idx, pt));
  const int64_t budget = baseline_budget(m.cfg, m.n_idx);
  m.k_pages = static_cast<int>(std::min<int64_t>(m.P, detail::ceil_div(budget, pt)));
  m.list_cap = (num_tokens - m.n_idx) + int64_t{m.k_pages} * pt;
  const size_t H = m.H;
  if (m.P > 0) {
    ensure(m.page_min, H * m.P * m.D * 2);
    ensure(m.page_max, H * m.P * m.D * 2);
    ensure(m.scores, H * m.P * 4);
    ensure(m.page_ids, H * std::max(m.k_pages, 1) * 4);
    ensure(m.scan_scratch, H * (m.k_pages + 1) * 4);
    detail::QuestParams qp;
    qp.keys = k;
    qp.kv_stride = kv_stride;
    qp.idx_begin = m.idx_begin;
    qp.n_idx = m.n_idx;
    qp.num_heads = m.H;
    qp.group = m.G;
    qp.head_dim = m.D;
    qp.page_tokens = pt;
    qp.num_pages = m.P;
    qp.page_min = m.page_min.as<uint16_t>();
    qp.page_max = m.page_max.as<uint16_t>();
    detail::launch_check(detail::quest_pages(qp, st), "quest_pages", st);
  }
  ensure(m.token_list, H * m.list_cap * 4);
  ensure(m.token_count, H * 4);
  m.splits = detail::decode_splits(m.list_cap, m.H, 1);
  ensure(m.part_ml, H * m.splits * m.G * 8);
  ensure(m.part_o, H * m.splits * m.G * m.D * 4);
}

void QuestLayer::decode(const float* q, float* out, Stream s) {
  auto& m = *impl_;
  RETROINFER_CHECK(m.n > 0, "QuestLayer::decode: build() was not called");
  RETROINFER_CHECK(q != nullptr && out != nullptr, "QuestLayer::decode: null q or out");
  auto st = static_cast<cudaStream_t>(s);
  detail::DecodeParams dp;
  dp.q = q;
  dp.k = m.k;
  dp.v = m.v;
  dp.kv_stride = m.kv_stride;
  dp.num_heads = m.H;
  dp.group = m.G;
  dp.head_dim = m.D;
  dp.scale = m.scale;
  dp.num_splits = m.splits;
  dp.part_ml = m.part_ml.as<float2>();
  dp.part_o = m.part_o.as<float>();
  dp.total_splits = m.splits;
  if (m.P == 0) {
    dp.num_tokens = m.n;
    dp.split_tokens = detail::split_tokens(m.n, m.splits);
  } else {
    detail::QuestParams qp;
    qp.num_heads = m.H;
    qp.group = m.G;
    qp.head_dim = m.D;
    qp.num_pages = m.P;
    qp.page_min = m.page_min.as<uint16_t>();
    qp.page_max = m.page_max.as<uint16_t>();
    qp.q = q;
    qp.scores = m.scores.as<float>();
    detail::launch_check(detail::quest_score(qp, st), "quest_score", st);
    detail::SelectParams se;
    se.scores = qp.scores;
    se.num_heads = m.H;
    se.group = 0;
    se.num_items = m.P;
    se.k_retrieval = m.k_pages;
    se.k_estimation = 0;
    se.retrieval_ids = m.page_ids.as<int>();
    se.page_tokens = m.cfg.quest_page_tokens;
    se.n_idx = m.n_idx;
    se.idx_begin = m.idx_begin;
    se.num_tokens = m.n;
    se.token_list = m.token_list.as<int>();
    se.token_count = m.token_count.as<int>();
    se.scan_scratch = m.scan_scratch.as<int>();
    se.list_stride = m.list_cap;
    detail::launch_check(detail::select_and_expand(se, st), "select_and_expand(quest)", st);
    dp.token_list = se.token_list;
    dp.token_count = se.token_count;
    dp.list_stride = m.list_cap;
    dp.split_tokens = detail::split_tokens(m.list_cap, m.splits);
  }
  detail::launch_check(detail::decode_attention(dp, st), "decode_attention(quest)", st);
  detail::CombineParams c;
  c.part_ml = dp.part_ml;
  c.part_o = dp.part_o;
  c.num_heads = m.H;
  c.group = m.G;
  c.head_dim = m.D;
  c.total_splits = m.splits;
  c.out = out;
  detail::launch_check(detail::combine_states(c, st), "combine_states(quest)", st);
}

int QuestLayer::num_pages() const { return impl_->P; }
int QuestLayer::selected_pages() const { return impl_->k_pages; }

double QuestLayer::decode_bytes_required() const {
  const auto& m = *impl_;
  const double H = m.H, D = m.D;
  const double exact = double(m.list_cap);  // steady + selected pages (a partial last page counts whole)
  return H * m.P * D * 2 * 2 + H * exact * (D * 2 * 2 + 4) + 2.0 * H * m.G * D * 4;
}

std::vector<int32_t> QuestLayer::token_list(int flat_head) const {
  const auto& m = *impl_;
  RETROINFER_CHECK(flat_head >= 0 && flat_head < m.H, "QuestLayer::token_list: bad flat head ", flat_head);
  synchronize();
  if (m.P == 0) {
    std::vector<int32_t> all(m.n);
    for (int64_t i = 0; i < m.n; ++i) all[i] = static_cast<int32_t>(i);
    return all;
  }
  int32_t cnt = 0;
  m.token_count.download(&cnt, 4, size_t(flat_head) * 4);
  std::vector<int32_t> out(cnt);
  m.token_list.download(out.data(), size_t(cnt) * 4, size_t(flat_head) * m.list_cap * 4);
  return out;
}

std::vector<float> QuestLayer::page_scores(int flat_head) const {
  const auto& m = *impl_;
  RETROINFER_CHECK(flat_head >= 0 && flat_head < m.H, "QuestLayer::page_scores: bad flat head ", flat_head);
  synchronize();
  std::vector<float> out(m.P);
  if (m.P > 0) m.scores.download(out.data(), size_t(m.P) * 4, size_t(flat_head) * m.P * 4);
  return out;
}

}  // namespace retroinfer::cuda
