// KvInt8Cache (kv_int8_cache.h).
#include "attention/cuda/kv_int8_cache.h"

#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/kv_int8_kernels.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda {

KvInt8Cache::KvInt8Cache(int num_heads, int64_t capacity, int head_dim) : H_(num_heads), D_(head_dim), capacity_(capacity) {
  RETROINFER_CHECK(num_heads >= 1 && capacity >= 1 && (head_dim == 64 || head_dim == 128),
                   "KvInt8Cache: ", num_heads, " heads of ", capacity, " tokens, head_dim ", head_dim,
                   " (the 8-bit KV cache takes head_dim 64 or 128)");
  const size_t rows = size_t(num_heads) * size_t(capacity);
  k_ = DeviceBuffer(rows * size_t(head_dim));
  v_ = DeviceBuffer(rows * size_t(head_dim));
  k_scale_ = DeviceBuffer(rows * 4);
  v_scale_ = DeviceBuffer(rows * 4);
  const size_t hd = size_t(num_heads) * size_t(head_dim);
  k_mean_ = DeviceBuffer(hd * 4);
  k_factor_ = DeviceBuffer(hd * 4);
  key_stats_ = DeviceBuffer(hd * 4 * 2 * detail::kKeyStatSplits);
  const std::vector<float> ones(hd, 1.0f);
  RETROINFER_CUDA_CHECK(cudaMemset(k_mean_.data(), 0, hd * 4));
  k_factor_.upload(ones.data(), hd * 4);
}

detail::KvInt8RowsCopy KvInt8Cache::rows_copy(const uint16_t* k, const uint16_t* v, int64_t src_head_stride,
                                              int64_t row0, int64_t rows) const {
  detail::KvInt8RowsCopy p;
  p.src_k = k;
  p.src_v = v;
  p.src_head_stride = src_head_stride;
  p.q_k = const_cast<int8_t*>(k_.as<int8_t>());
  p.q_v = const_cast<int8_t*>(v_.as<int8_t>());
  p.scale_k = const_cast<float*>(k_scale_.as<float>());
  p.scale_v = const_cast<float*>(v_scale_.as<float>());
  p.q_head_stride = capacity_;
  p.q_row0 = row0;
  p.rows = rows;
  p.num_heads = H_;
  p.head_dim = D_;
  p.k_mean = k_mean_.as<float>();
  p.k_factor = k_factor_.as<float>();
  return p;
}

void KvInt8Cache::fill(const uint16_t* k, const uint16_t* v, int64_t n, int64_t kv_stride, Stream s) {
  RETROINFER_CHECK(k != nullptr && v != nullptr && n >= 0 && n <= capacity_ && kv_stride >= n, "KvInt8Cache::fill: ",
                   n, " tokens of stride ", kv_stride, " into a cache of ", capacity_, " (or null K/V)");
  auto st = static_cast<cudaStream_t>(s);
  detail::KvKeyCalibrationParams c;
  c.k = k;
  c.head_stride = kv_stride;
  c.n = n;
  c.num_heads = H_;
  c.head_dim = D_;
  c.partials = key_stats_.as<float>();
  c.mean = k_mean_.as<float>();
  c.factor = k_factor_.as<float>();
  detail::launch_check(detail::kv_int8_key_calibration(c, st), "kv_int8_key_calibration", st);
  detail::launch_check(detail::kv_int8_quantize(rows_copy(k, v, kv_stride, 0, n), st), "kv_int8_quantize(fill)", st);
}

void KvInt8Cache::append(const uint16_t* k_new, const uint16_t* v_new, int64_t row, Stream s) {
  RETROINFER_CHECK(k_new != nullptr && v_new != nullptr && row >= 0 && row < capacity_, "KvInt8Cache::append: row ",
                   row, " of a cache of ", capacity_, " tokens (or null K/V)");
  auto st = static_cast<cudaStream_t>(s);
  detail::launch_check(detail::kv_int8_quantize(rows_copy(k_new, v_new, 1, row, 1), st), "kv_int8_quantize(append)",
                       st);
}

void KvInt8Cache::widen(int64_t row0, int64_t count, uint16_t* k_out, uint16_t* v_out, Stream s) const {
  RETROINFER_CHECK(k_out != nullptr && v_out != nullptr && row0 >= 0 && count >= 0 && row0 + count <= capacity_,
                   "KvInt8Cache::widen: rows [", row0, ", ", row0 + count, ") of a cache of ", capacity_,
                   " tokens (or null outputs)");
  auto st = static_cast<cudaStream_t>(s);
  detail::launch_check(detail::kv_int8_widen(rows_copy(k_out, v_out, count, row0, count), st), "kv_int8_widen", st);
}

detail::KvInt8Rows KvInt8Cache::rows() const {
  detail::KvInt8Rows r;
  r.k = k_.as<int8_t>();
  r.v = v_.as<int8_t>();
  r.k_scale = k_scale_.as<float>();
  r.v_scale = v_scale_.as<float>();
  r.k_mean = k_mean_.as<float>();
  r.k_factor = k_factor_.as<float>();
  return r;
}

}  // namespace retroinfer::cuda
