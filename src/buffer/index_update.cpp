#include "buffer/index_update.h"

#include <algorithm>

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

}  // namespace retroinfer::buffer
