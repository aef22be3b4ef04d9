#include "retroinfer/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/dot.h"
#include "core/kv_row_widen.h"
#include "retroinfer/error.h"
#include "retroinfer/fault_injection.h"

namespace retroinfer {

void calibrate_key_row(const float* mean, const float* factor, int d, float* row) {
  for (int i = 0; i < d; ++i) row[i] = row[i] * factor[i] + mean[i];
}

void check_key_calibration(const KeyCalibration& k, int num_heads_kv, int head_dim) {
  const size_t n = size_t(num_heads_kv) * head_dim;
  RETROINFER_CHECK(k.mean.size() == n && k.factor.size() == n, "key calibration: ", k.mean.size(), " means and ",
                   k.factor.size(), " factors, not ", n, " (", num_heads_kv, " KV heads x head_dim ", head_dim, ")");
  for (size_t i = 0; i < n; ++i)
    RETROINFER_CHECK(k.factor[i] > 0.0f && std::isfinite(k.factor[i]) && std::isfinite(k.mean[i]),
                     "key calibration: factor ", k.factor[i], " and mean ", k.mean[i], " (a factor must be > 0)");
}

void key_channel_statistics(const float* rows, int64_t n, int head_dim, float* mean, float* factor) {
  RETROINFER_CHECK(n > 0 && head_dim > 0, "key_channel_statistics: ", n, " rows of ", head_dim, " channels");
  const size_t d = size_t(head_dim);
  std::vector<double> sum(d, 0.0);
  for (int64_t t = 0; t < n; ++t)
    for (size_t i = 0; i < d; ++i) sum[i] += rows[size_t(t) * d + i];
  for (size_t i = 0; i < d; ++i) mean[i] = static_cast<float>(sum[i] / static_cast<double>(n));
  std::fill(factor, factor + d, 0.0f);
  for (int64_t t = 0; t < n; ++t)
    for (size_t i = 0; i < d; ++i) factor[i] = std::max(factor[i], std::fabs(rows[size_t(t) * d + i] - mean[i]));
  for (size_t i = 0; i < d; ++i) factor[i] = factor[i] > 0.0f && std::isfinite(factor[i]) ? std::sqrt(factor[i]) : 1.0f;
}

KvCache::KvCache(int num_heads_kv, int head_dim, DType dtype, const KeyCalibration* keys)
    : num_heads_kv_(num_heads_kv), head_dim_(head_dim), dtype_(dtype), key_cal_(keys) {
  RETROINFER_CHECK(num_heads_kv > 0, "KvCache: num_heads_kv must be positive, got ", num_heads_kv);
  RETROINFER_CHECK(head_dim > 0, "KvCache: head_dim must be positive, got ", head_dim);
  RETROINFER_CHECK(dtype == DType::kF32 || dtype == DType::kBF16 || is_scaled_8bit(dtype),
                   "KvCache: storage dtype must be f32, bf16, fp8 or int8, got ", dtype_name(dtype));
  if (keys != nullptr) {
    RETROINFER_CHECK(is_scaled_8bit(dtype), "KvCache: a key calibration is for 8-bit storage, not ",
                     dtype_name(dtype));
    check_key_calibration(*keys, num_heads_kv, head_dim);
  }
  keys_.resize(num_heads_kv);
  values_.resize(num_heads_kv);
}

void KvCache::reserve(int64_t tokens) {
  for (int h = 0; h < num_heads_kv_; ++h) {
    keys_[h].reserve(tokens * row_bytes());
    values_[h].reserve(tokens * row_bytes());
  }
}

void KvCache::clear() {
  size_ = 0;
  for (int h = 0; h < num_heads_kv_; ++h) {
    keys_[h].clear();
    values_[h].clear();
  }
}

namespace {
// An 8-bit row widened to f32 for dot_key / axpy_value: on the stack up to kStack values, else on the heap.
class WidenedRow {
 public:
  // mean, factor: the key calibration of the row's head (nullptr: none).
  WidenedRow(DType t, const void* row, int d, const float* mean = nullptr, const float* factor = nullptr) {
    if (d > kStack) {
      heap_.resize(d);
      p_ = heap_.data();
    }
    widen_scaled_8bit_row(t, row, d, p_);
    if (mean != nullptr) calibrate_key_row(mean, factor, d, p_);
  }
  WidenedRow(const WidenedRow&) = delete;  // p_ may point into this object
  WidenedRow& operator=(const WidenedRow&) = delete;
  const float* data() const { return p_; }

 private:
  static constexpr int kStack = 256;
  float stack_[kStack];
  std::vector<float> heap_;
  float* p_ = stack_;
};

// Appends head h's rows of src [n, num_heads, d] to dst in dtype; mean / factor (8-bit keys with a
// calibration, else nullptr): rows stored as (row - mean) / factor.
void store_rows(std::vector<uint8_t>& dst, const float* src, int64_t n, int num_heads, int h, int d,
                DType dtype, const float* mean = nullptr, const float* factor = nullptr) {
  const int64_t old = dst.size(), rb = stored_row_bytes(dtype, d);
  dst.resize(old + n * rb);
  uint8_t* out = dst.data() + old;
  std::vector<float> centred(mean != nullptr ? d : 0);
  for (int64_t t = 0; t < n; ++t) {
    const float* row = src + (t * num_heads + h) * d;
    if (mean != nullptr) {
      for (int i = 0; i < d; ++i) centred[i] = (row[i] - mean[i]) / factor[i];
      row = centred.data();
    }
    if (dtype == DType::kF32) {
      std::memcpy(out + t * d * 4, row, d * 4);
    } else if (dtype == DType::kF8E4M3) {
      fp8_quantize_row(row, d, out + t * rb);
    } else if (dtype == DType::kI8) {
      int8_quantize_kv_row(row, d, out + t * rb);
    } else {
      auto* o = reinterpret_cast<uint16_t*>(out) + t * d;
      for (int i = 0; i < d; ++i) o[i] = f32_to_bf16(row[i]);
    }
  }
}
}  // namespace

void KvCache::append(const float* k, const float* v, int64_t n) {
  RETROINFER_CHECK(n >= 0, "KvCache::append: negative token count ", n);
  // Exhausted host memory as the growing vectors would meet it (std::bad_alloc), said as an Error.
  if (fault::should_fail(fault::Point::kHostKvAppend))
    RETROINFER_FAIL("KvCache::append: out of host memory growing the KV cache by ", n,
                    " tokens (injected fault host_kv_append)");
  for (int h = 0; h < num_heads_kv_; ++h) {
    store_rows(keys_[h], k, n, num_heads_kv_, h, head_dim_, dtype_, key_mean(h), key_factor(h));
    store_rows(values_[h], v, n, num_heads_kv_, h, head_dim_, dtype_);
  }
  size_ += n;
}

void KvCache::append_stored(int h, const void* k, const void* v, int64_t n) {
  RETROINFER_CHECK(h >= 0 && h < num_heads_kv_ && n >= 0, "KvCache::append_stored: head ", h, " or count ", n,
                   " out of range");
  RETROINFER_CHECK(static_cast<int64_t>(keys_[h].size()) == size_ * row_bytes(),
                   "KvCache::append_stored: head ", h, " already has rows not committed");
  const auto* kb = static_cast<const uint8_t*>(k);
  const auto* vb = static_cast<const uint8_t*>(v);
  keys_[h].insert(keys_[h].end(), kb, kb + n * row_bytes());
  values_[h].insert(values_[h].end(), vb, vb + n * row_bytes());
}

void KvCache::commit_rows(int64_t n) {
  for (int h = 0; h < num_heads_kv_; ++h)
    RETROINFER_CHECK(static_cast<int64_t>(keys_[h].size()) == (size_ + n) * row_bytes(),
                     "KvCache::commit_rows: head ", h, " did not get ", n, " stored rows");
  size_ += n;
}

void KvCache::load_key(int h, int64_t t, float* dst) const {
  if (dtype_ == DType::kF32) {
    std::memcpy(dst, key_row(h, t), head_dim_ * 4);
  } else if (is_scaled_8bit(dtype_)) {
    widen_scaled_8bit_row(dtype_, key_row(h, t), head_dim_, dst);
    if (key_cal_ != nullptr) calibrate_key_row(key_mean(h), key_factor(h), head_dim_, dst);
  } else {
    const auto* r = static_cast<const uint16_t*>(key_row(h, t));
    for (int i = 0; i < head_dim_; ++i) dst[i] = bf16_to_f32(r[i]);
  }
}

void KvCache::load_value(int h, int64_t t, float* dst) const {
  if (dtype_ == DType::kF32) {
    std::memcpy(dst, value_row(h, t), head_dim_ * 4);
  } else if (is_scaled_8bit(dtype_)) {
    widen_scaled_8bit_row(dtype_, value_row(h, t), head_dim_, dst);
  } else {
    const auto* r = static_cast<const uint16_t*>(value_row(h, t));
    for (int i = 0; i < head_dim_; ++i) dst[i] = bf16_to_f32(r[i]);
  }
}


float KvCache::dot_key(int h, int64_t t, const float* q) const {
  if (dtype_ == DType::kF32) return core::dot_f32(q, static_cast<const float*>(key_row(h, t)), head_dim_);
  if (is_scaled_8bit(dtype_))
    return core::dot_f32(q, WidenedRow(dtype_, key_row(h, t), head_dim_, key_mean(h), key_factor(h)).data(), head_dim_);
  return core::dot_bf16(q, static_cast<const uint16_t*>(key_row(h, t)), head_dim_);
}

void KvCache::axpy_value(int h, int64_t t, float a, float* acc) const {
  if (dtype_ == DType::kF32) {
    const auto* r = static_cast<const float*>(value_row(h, t));
    for (int i = 0; i < head_dim_; ++i) acc[i] += a * r[i];
  } else if (is_scaled_8bit(dtype_)) {
    // a * (v_i * s) as load_value's rows would give it: v_i * s is one rounding (exact for fp8), then a times it.
    const WidenedRow w(dtype_, value_row(h, t), head_dim_);
    for (int i = 0; i < head_dim_; ++i) acc[i] += a * w.data()[i];
  } else {
    const auto* r = static_cast<const uint16_t*>(value_row(h, t));
    for (int i = 0; i < head_dim_; ++i) acc[i] += a * bf16_to_f32(r[i]);
  }
}

}  // namespace retroinfer
