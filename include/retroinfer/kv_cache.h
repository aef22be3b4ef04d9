// KV cache of one (sequence, layer): post-RoPE keys and values per KV head, in token order.
#pragma once

#include <cstdint>
#include <vector>

#include "retroinfer/dtype.h"

namespace retroinfer {

// Per KV head, the keys of an 8-bit cache are stored relative to a per-channel mean and divided by per-channel
// factors: y = (k - mean) / factor, read back as k = y * factor + mean (docs/model-runner.md "KV cache storage").
// Without it a few channels that hold a large near-constant part (Qwen2's key bias) set every row's scale and
// leave the others a handful of the 255 steps. The CPU runner calibrates it once per model
// (Model::key_calibration()), so rows pass between sessions of a model (forks, prefix blocks, snapshots) as
// they are.
struct KeyCalibration {
  std::vector<float> mean;    // [num_heads_kv, head_dim]
  std::vector<float> factor;  // [num_heads_kv, head_dim], > 0
};
// Throws Error unless k holds num_heads_kv x head_dim finite means and factors > 0.
void check_key_calibration(const KeyCalibration& k, int num_heads_kv, int head_dim);
// One KV head's calibration from its keys, rows [n, head_dim] f32 row-major (n > 0): mean[i] the channel's mean
// (summed in double, in row order), factor[i] = sqrt(max_t |k[t][i] - mean[i]|), 1 where that maximum is 0 or
// not finite. Halfway between raw channels (factor 1) and channels of equal range, which would magnify the noise
// of quiet channels as much as it shrinks the loud ones. Model::key_calibration's statistics per head.
void key_channel_statistics(const float* rows, int64_t n, int head_dim, float* mean, float* factor);

// Threading contract: append() and reserve() need exclusive access; the const readers may run from any
// number of threads at once while nobody appends.
class KvCache {
 public:
  // dtype: storage of keys and values: kF32, kBF16, or an 8-bit storage, kI8 or kF8E4M3 (8-bit values and an
  // f32 scale per row, docs/model-runner.md "KV cache storage"); kF16 is rejected. keys: an 8-bit cache's key
  // calibration (nullptr: keys stored as they are; must outlive the cache and every copy of it); only 8-bit
  // storages take one.
  KvCache(int num_heads_kv, int head_dim, DType dtype, const KeyCalibration* keys = nullptr);

  void reserve(int64_t tokens);
  // Appends n tokens. k, v: [n, num_heads_kv, head_dim], f32, row-major (the layout the K/V projection
  // produces for n consecutive positions).
  void append(const float* k, const float* v, int64_t n);
  // Appends n tokens of head h as stored rows (k, v: [n, head_dim] in dtype(), row-major: what key_row /
  // value_row read). The caller appends the same n to every head, then calls commit_rows(n).
  void append_stored(int h, const void* k, const void* v, int64_t n);
  void commit_rows(int64_t n);
  // Drops every token (keeps the allocation).
  void clear();

  int64_t size() const { return size_; }
  int num_heads_kv() const { return num_heads_kv_; }
  int head_dim() const { return head_dim_; }
  DType dtype() const { return dtype_; }
  // Bytes of one key (or value) row in storage (an 8-bit row's scale included).
  int64_t row_bytes() const { return stored_row_bytes(dtype_, head_dim_); }

  const KeyCalibration* key_calibration() const { return key_cal_; }
  // Head h's key mean and factors ([head_dim] each), or nullptr without a calibration.
  const float* key_mean(int h) const { return key_cal_ ? key_cal_->mean.data() + size_t(h) * head_dim_ : nullptr; }
  const float* key_factor(int h) const {
    return key_cal_ ? key_cal_->factor.data() + size_t(h) * head_dim_ : nullptr;
  }

  // Raw rows in storage dtype: [head_dim] at (head h, token t); an 8-bit key row relative to the calibration.
  const void* key_row(int h, int64_t t) const { return keys_[h].data() + t * row_bytes(); }
  const void* value_row(int h, int64_t t) const { return values_[h].data() + t * row_bytes(); }

  // Converted to f32 (an 8-bit key row through the calibration). dst: [head_dim].
  void load_key(int h, int64_t t, float* dst) const;
  void load_value(int h, int64_t t, float* dst) const;
  // q · k[h, t]; q: [head_dim] f32.
  float dot_key(int h, int64_t t, const float* q) const;
  // acc += a * v[h, t]; acc: [head_dim] f32.
  void axpy_value(int h, int64_t t, float a, float* acc) const;

 private:
  int num_heads_kv_;
  int head_dim_;
  DType dtype_;
  const KeyCalibration* key_cal_ = nullptr;
  int64_t size_ = 0;
  // keys_[h]: [size_, head_dim] in dtype_, row-major; values_ likewise.
  std::vector<std::vector<uint8_t>> keys_;
  std::vector<std::vector<uint8_t>> values_;
};

}  // namespace retroinfer
