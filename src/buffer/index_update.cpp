#include "buffer/index_update.h"

#include <algorithm>
#include <functional>

#include "retroinfer/error.h"

namespace retroinfer::buffer {

IndexUpdatePlan::IndexUpdatePlan(int64_t prompt_tokens, int sinks, int window, int interval, int layers)
    : sinks_(sinks), window_(window), interval_(interval), layers_(layers) {
  RETROINFER_CHECK(prompt_tokens >= 0 && sinks >= 0 && window >= 0, "IndexUpdatePlan: prompt (", prompt_tokens,
                   "), sinks (", sinks, ") and window (", window, ") must be >= 0");
  RETROINFER_CHECK(interval > 0 && layers > 0, "IndexUpdatePlan: interval (", interval, ") and layers (", layers,
                   ") must be > 0");
  // A prompt no longer than sinks + window has no index: everything after the sinks is steady.
  index_end0_ = std::max<int64_t>(sinks, prompt_tokens - window);
}

int64_t IndexUpdatePlan::index_end(int layer, int64_t total) const {
  RETROINFER_CHECK(layer >= 0 && layer < layers_, "IndexUpdatePlan: layer ", layer, " outside [0, ", layers_, ")");
  // Block b is folded in at total >= index_end0 + (b + 1) * interval + window + layer.
  const int64_t t = total - index_end0_ - window_ - layer;
  const int64_t blocks = t < interval_ ? 0 : t / interval_;
  return index_end0_ + blocks * interval_;
}

int64_t IndexUpdatePlan::update_due(int layer, int64_t total) const {
  const int64_t t = total - index_end0_ - window_ - layer;
  if (t < interval_ || t % interval_ != 0) return -1;
  return index_end0_ + (t / interval_ - 1) * interval_;
}

int64_t IndexUpdatePlan::max_steady_rows() const {
  // The last layer holds the most: just before its update, `interval` due tokens + the window + the
  // (layers - 1) tokens generated while the earlier layers updated.
  return int64_t{sinks_} + window_ + interval_ + layers_ - 2;
}

WaveIndexTables WaveIndexTables::from_sizes(int heads, int clusters, int page_tokens, std::span<const int32_t> sizes) {
  RETROINFER_CHECK(heads >= 1 && clusters >= 0 && page_tokens >= 1, "WaveIndexTables: need heads >= 1 (", heads,
                   "), clusters >= 0 (", clusters, "), page_tokens >= 1 (", page_tokens, ")");
  RETROINFER_CHECK(sizes.size() == size_t(heads) * size_t(clusters), "WaveIndexTables: ", sizes.size(),
                   " sizes for ", heads, " heads x ", clusters, " clusters");
  WaveIndexTables t;
  t.heads = heads;
  t.page_tokens = page_tokens;
  t.offsets.assign(size_t(heads), 0);  // [H, 0 + 1]: append_block fills the rest
  t.slot_begin.assign(size_t(heads), 0);
  t.append_block(clusters, sizes);
  return t;
}

void WaveIndexTables::append_block(int blk_clusters, std::span<const int32_t> blk_sizes) {
  const size_t H = size_t(heads), C = size_t(clusters), B = size_t(blk_clusters < 0 ? 0 : blk_clusters);
  RETROINFER_CHECK(blk_clusters >= 0 && blk_sizes.size() == H * B, "WaveIndexTables::append_block: ",
                   blk_sizes.size(), " sizes for ", heads, " heads x ", blk_clusters, " clusters");
  int64_t blk_tokens = -1;
  for (size_t h = 0; h < H; ++h) {
    int64_t sum = 0;
    for (size_t j = 0; j < B; ++j) {
      const int32_t s = blk_sizes[h * B + j];
      RETROINFER_CHECK(s >= 0, "WaveIndexTables::append_block: head ", h, " cluster ", j, " has size ", s);
      sum += s;
    }
    RETROINFER_CHECK(blk_tokens < 0 || sum == blk_tokens, "WaveIndexTables::append_block: head ", h, " clusters ",
                     sum, " tokens, head 0 ", blk_tokens, "; every head must cluster equally many tokens (the ",
                     "members stride); the outlier zone must pick the same count in every head");
    blk_tokens = sum;
  }
  if (H > 0 && blk_tokens < 0) blk_tokens = 0;
  std::vector<int32_t> sz(H * (C + B)), off(H * (C + B + 1)), slot(H * (C + B + 1));
  std::vector<int64_t> at(H * (C + B));
  int64_t row = store_rows, stride = slot_stride;
  for (size_t h = 0; h < H; ++h) {
    for (size_t c = 0; c < C; ++c) {
      sz[h * (C + B) + c] = sizes[h * C + c];
      at[h * (C + B) + c] = store_at[h * C + c];
    }
    for (size_t c = 0; c <= C; ++c) {
      off[h * (C + B + 1) + c] = offsets[h * (C + 1) + c];
      slot[h * (C + B + 1) + c] = slot_begin[h * (C + 1) + c];
    }
    for (size_t j = 0; j < B; ++j) {
      const int32_t s = blk_sizes[h * B + j];
      const size_t c = C + j;
      sz[h * (C + B) + c] = s;
      at[h * (C + B) + c] = row;
      row += s;
      off[h * (C + B + 1) + c + 1] = off[h * (C + B + 1) + c] + s;
      slot[h * (C + B + 1) + c + 1] = slot[h * (C + B + 1) + c] + (s + page_tokens - 1) / page_tokens;
    }
    stride = std::max<int64_t>(stride, slot[h * (C + B + 1) + C + B]);
  }
  sizes = std::move(sz);
  offsets = std::move(off);
  slot_begin = std::move(slot);
  store_at = std::move(at);
  store_rows = row;
  slot_stride = stride;
  clusters += blk_clusters;
  per_head += blk_tokens;
}

std::vector<int32_t> WaveIndexTables::offsets_abs() const {
  const size_t H = size_t(heads), C = size_t(clusters);
  std::vector<int32_t> o(H * C + 1);
  for (size_t h = 0; h < H; ++h)
    for (size_t c = 0; c < C; ++c) o[h * C + c] = static_cast<int32_t>(int64_t(h) * per_head + offsets[h * (C + 1) + c]);
  o[H * C] = static_cast<int32_t>(int64_t(H) * per_head);
  return o;
}

int64_t WaveIndexTables::retrieval_capacity(int n_r) const {
  const size_t C = size_t(clusters);
  const size_t k = std::min<size_t>(size_t(std::max(n_r, 0)), C);
  int64_t most = 0;
  std::vector<int32_t> one(C);
  for (int h = 0; h < heads; ++h) {
    std::copy(sizes.begin() + int64_t(h) * int64_t(C), sizes.begin() + int64_t(h + 1) * int64_t(C), one.begin());
    std::partial_sort(one.begin(), one.begin() + int64_t(k), one.end(), std::greater<>());
    int64_t s = 0;
    for (size_t j = 0; j < k; ++j) s += one[j];
    most = std::max(most, s);
  }
  return most;
}

std::vector<int32_t> steady_rows_after_update(int heads, int64_t sinks, int64_t outliers, int64_t rows,
                                              int64_t block, int64_t blk_out,
                                              std::span<const int32_t> blk_outliers) {
  RETROINFER_CHECK(heads >= 1 && sinks >= 0 && outliers >= 0 && block >= 1 && blk_out >= 0 && blk_out <= block &&
                       rows >= sinks + outliers + block,
                   "steady_rows_after_update: need heads >= 1, sinks, outliers >= 0, 0 <= block outliers (", blk_out,
                   ") <= block (", block, ") and rows (", rows, ") >= sinks (", sinks, ") + outliers (", outliers,
                   ") + block");
  RETROINFER_CHECK(blk_outliers.size() == size_t(heads) * size_t(blk_out), "steady_rows_after_update: ",
                   blk_outliers.size(), " block outliers for ", heads, " heads x ", blk_out);
  const int64_t row0 = sinks + outliers, after = rows - block + blk_out;
  std::vector<int32_t> map(size_t(heads) * size_t(after));
  for (int h = 0; h < heads; ++h) {
    int32_t* m = map.data() + size_t(h) * size_t(after);
    int64_t r = 0;
    for (; r < row0; ++r) m[r] = static_cast<int32_t>(r);
    for (int64_t i = 0; i < blk_out; ++i) {
      const int32_t t = blk_outliers[size_t(h) * size_t(blk_out) + size_t(i)];
      RETROINFER_CHECK(t >= 0 && t < block && (i == 0 || t > blk_outliers[size_t(h) * size_t(blk_out) + size_t(i) - 1]),
                       "steady_rows_after_update: head ", h, " block outlier ", i, " = ", t,
                       " (must be ascending in [0, ", block, "))");
      m[r++] = static_cast<int32_t>(row0 + t);
    }
    for (int64_t j = row0 + block; j < rows; ++j) m[r++] = static_cast<int32_t>(j);
  }
  return map;
}

}  // namespace retroinfer::buffer
