// One layer's 8-bit KV cache on the GPU (--kv-dtype int8 on the CUDA runner): every token's K and V rows of
// every flat head as D int8 values and an f32 scale (kernels/kv_int8_kernels.h: s = absmax / 127, x = q * s),
// 2 D + 8 bytes per token and head against bf16's 4 D. The attention layers that take an 8-bit KV (full and
// retro, layer_attention.cpp) own one: prefill_done quantises the runner's bf16 staging into it, each decode
// step appends the step's bf16 row, and the decode kernels read the int8 rows (kernels/decode_kernels.h
// KvInt8Rows). Host-only header.
//
// Keys are stored relative to a key calibration of each flat head: fill() first takes, per channel, the mean of
// the prompt's keys and a factor sqrt(max |k - mean|) (kv_int8_kernels.h kv_int8_key_calibration), then stores
// (k - mean) / factor; decode scores q * factor against the stored rows and adds q . mean. A few channels
// of some models' keys (Qwen2.5's k_proj bias) are large and nearly constant; as raw rows they set every row's
// scale and the other channels keep ~3 significant bits. The CPU runner does the same with the model's
// calibration (Model::key_calibration), which its forks, prefix blocks and snapshots share; the CUDA runner's
// 8-bit rows never leave their session (fork and prefix reuse refuse an 8-bit KV), so each sequence is calibrated
// by its own prompt, which needs no extra prefill and covers the prompt's positions.
#pragma once

#include <cstdint>

#include "kernels/decode_kernels.h"
#include "kernels/kv_int8_kernels.h"
#include "retroinfer/cuda_backend.h"

namespace retroinfer::cuda {

class KvInt8Cache {
 public:
  // num_heads flat heads (sequences x KV heads) of `capacity` tokens each, head_dim 64 or 128.
  KvInt8Cache(int num_heads, int64_t capacity, int head_dim);

  // Device bytes of a cache of this shape: a K and a V row per token and head of stored_row_bytes(kI8, D)
  // (D values and a scale; the scales live in their own arrays here), and per head the key calibration's mean
  // and factor and its statistics' scratch.
  static int64_t bytes(int num_heads, int64_t capacity, int head_dim) {
    return int64_t{num_heads} * capacity * 2 * stored_row_bytes(DType::kI8, head_dim) +
           int64_t{num_heads} * head_dim * 4 * (2 + 2 * detail::kKeyStatSplits);
  }
  // Calibrates the keys by tokens [0, n) of k (see above), then quantises tokens [0, n) of k, v (bf16
  // [H, kv_stride, D]) into rows [0, n).
  void fill(const uint16_t* k, const uint16_t* v, int64_t n, int64_t kv_stride, Stream s);
  // Quantises one token per flat head (k_new, v_new: bf16 [H, D]) into row `row` (relative to fill's key
  // calibration).
  void append(const uint16_t* k_new, const uint16_t* v_new, int64_t row, Stream s);
  // Widens rows [row0, row0 + count) of every flat head into k_out, v_out (bf16 [H, count, D]; keys back in
  // the model's frame: bf16(y * factor + mean)).
  void widen(int64_t row0, int64_t count, uint16_t* k_out, uint16_t* v_out, Stream s) const;

  detail::KvInt8Rows rows() const;
  int64_t capacity() const { return capacity_; }
  int64_t device_bytes() const { return bytes(H_, capacity_, D_); }

 private:
  // The kernels' parameters: bf16 rows k, v (src_head_stride rows apart per head, from row 0) and this cache's
  // rows [row0, row0 + rows).
  detail::KvInt8RowsCopy rows_copy(const uint16_t* k, const uint16_t* v, int64_t src_head_stride, int64_t row0,
                                   int64_t rows) const;
  int H_ = 0, D_ = 0;
  int64_t capacity_ = 0;
  DeviceBuffer k_, v_, k_scale_, v_scale_;
  DeviceBuffer k_mean_, k_factor_;  // [H, D] f32: the key calibration (mean 0, factor 1 until fill)
  DeviceBuffer key_stats_;          // [2, H, kKeyStatSplits, D] f32: kv_int8_key_calibration's scratch
};

}  // namespace retroinfer::cuda
