// Kernel parameter structs and raw launchers of the CUDA kernels layer (src/kernels), split by family:
// kmeans_kernels.h, select_kernels.h, decode_kernels.h, layer_kernels.h; this header holds what they share.
//
// Every launcher takes a plain Params struct of device pointers and sizes plus a stream, launches, and
// returns the launch status; it validates nothing. The host API (retro_layer.cpp, dense_decode.cpp)
// validates shapes, throws retroinfer::Error and checks each status through detail::launch_check.
//
// Shared notation:
//   H     flat head count = num_seqs * num_heads_kv; flat head h is (sequence h / Hkv, KV head h % Hkv)
//   G     GQA group (query heads per KV head), 1..8; query head of flat head h and member g is h * G + g,
//         so q / out of shape [num_seqs, num_heads_q, D] are [H, G, D]
//   D     head_dim, 64 or 128
//   K, V  [H, kv_stride, D] bf16 (uint16 bits), row-major; token t of head h at (h * kv_stride + t) * D
//   C     clusters per head (the same for every head: all heads of a layer index the same tokens)
//   n_idx indexed tokens per head; index token i is KV token idx_begin + i
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "retroinfer/attention_config.h"

namespace retroinfer::cuda::detail {

inline constexpr int kMaxGroup = 8;  // largest GQA group the decode kernels support (register arrays)


// Host-side helpers of every launcher (device_buffer.cpp).
int sm_count();  // multiprocessors of the current device (read once)
// Throws Error unless num_seqs >= 1, the GQA grouping divides, group <= kMaxGroup, head_dim in {64, 128}.
void validate_layer_shape(const AttentionShape& s, int num_seqs, const char* who);
// Throws Error on null K/V, num_tokens < 1 or >= 2^31, or kv_stride < num_tokens.
void validate_kv(const void* k, const void* v, int64_t num_tokens, int64_t kv_stride, const char* who);
float effective_scale(float scale, int head_dim);

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace retroinfer::cuda::detail
