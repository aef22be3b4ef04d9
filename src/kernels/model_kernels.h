// Kernels of the CUDA model runner's forward pass (model_kernels.cu): raw launchers over plain Params
// structs that validate nothing and return the launch status. The callers (forward.cpp, cuda_model.cpp)
// validate shapes and check each status through detail::launch_check. Included only from src/backend/cuda.
//
// Notation: rows = tokens of one forward (a prefill chunk of one sequence, or one token of every sequence in
// decode); h = hidden size; D = head_dim; Hq / Hkv = query / KV heads; activations f32 row-major unless a
// comment says bf16. "wt" is the weight storage type: bf16 (uint16 bits) or f32.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace retroinfer::cuda::model {

// x[r, :] = embed[tokens[r], :] (converted to f32).
struct EmbedParams {
  const void* embed = nullptr;    // [vocab, h] wt
  bool bf16 = true;               // weight storage type
  const int32_t* tokens = nullptr;  // [rows], each in [0, vocab) (checked on the host)
  float* x = nullptr;             // [rows, h] f32
  int64_t rows = 0, hidden = 0;
};
cudaError_t embed_gather(const EmbedParams& p, cudaStream_t s);

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w (Hugging Face LlamaRMSNorm; the mean of squares in f64 as the
// CPU runner does), written in f32 (y) and / or rounded to bf16 (y_bf16: the input of a bf16 GEMM; the same
// f32 value rounded to nearest even, so bit-identical to converting y). One CTA per row, one pass over x:
// when hidden % 4 == 0, hidden <= kRmsNormMaxVecHidden, x / w / y 16-byte aligned, y_bf16 8-byte aligned and
// x_stride % 4 == 0, each thread keeps up to 8 float4 of its row in registers (up to 1024 threads per row, so
// that a few decode rows still spread over many threads); otherwise a scalar fallback (any width, two
// passes over x).
constexpr int64_t kRmsNormMaxVecHidden = 4 * 1024 * 8;
struct RmsNormParams {
  const float* x = nullptr;     // [rows, h], row stride x_stride floats
  const float* w = nullptr;     // [h] f32
  float* y = nullptr;           // [rows, h] f32, contiguous, or nullptr
  uint16_t* y_bf16 = nullptr;   // [rows, h] bf16, contiguous, or nullptr (at least one of y, y_bf16)
  int64_t rows = 0, hidden = 0, x_stride = 0;
  float eps = 1e-5f;
};
cudaError_t rms_norm(const RmsNormParams& p, cudaStream_t s);
// True when rms_norm(p) takes the vectorised one-pass kernel (for the tests and the benchmark).
bool rms_norm_vectorised(const RmsNormParams& p);

// After the fused QKV product: adds the bias, applies RoPE to q and k, writes q (f32, and bf16 for the Hopper
// prefill kernel) and the token's K/V (bf16) into the KV cache at (row_seq[r], kv head, row_pos[r]), and
// optionally into k_new / v_new.
struct QkvPostParams {
  const float* qkv = nullptr;    // [rows, (Hq + 2 Hkv) D]: q heads, then k heads, then v heads
  const float* bias = nullptr;   // [(Hq + 2 Hkv) D] or nullptr
  const float* cos = nullptr;    // [rows, D / 2] (already times the attention factor)
  const float* sin = nullptr;    // [rows, D / 2]
  const int32_t* row_seq = nullptr;  // [rows]: sequence of each row (index into the KV cache)
  const int32_t* row_pos = nullptr;  // [rows]: position of each row (< kv_stride)
  float* q = nullptr;            // [rows, Hq, D] f32 out, post-RoPE
  uint16_t* q_bf16 = nullptr;    // [rows, Hq, D] bf16 out (q rounded to nearest even), or nullptr
  uint16_t* k_cache = nullptr;   // [num_seqs, Hkv, kv_stride, D] bf16: row r's key written at row_pos[r];
                                 // nullptr: not written (then k_new / v_new carry the K/V)
  uint16_t* v_cache = nullptr;   // same layout (null with k_cache)
  uint16_t* k_new = nullptr;     // [rows, Hkv, D] bf16 out, or nullptr
  uint16_t* v_new = nullptr;     // [rows, Hkv, D] bf16 out, or nullptr
  int64_t rows = 0, kv_stride = 0;
  int num_heads_q = 0, num_heads_kv = 0, head_dim = 0;
};
cudaError_t qkv_post(const QkvPostParams& p, cudaStream_t s);

// Row r's K/V (k_new / v_new [rows, Hkv, D] bf16, as qkv_post writes them) into its own cache: dst[r].k / .v
// [Hkv, kv_stride, D] at position dst[r].pos (the joined decode of several sessions, whose caches are separate
// allocations: CudaJoinedDecoder). The same bits qkv_post writes into a cache. A row whose dst[r].k is null is
// skipped: its session keeps that layer on the host tier, whose attention appends k_new / v_new itself.
struct KvAppendRow {
  uint16_t* k = nullptr;  // null: skip the row
  uint16_t* v = nullptr;
  int64_t kv_stride = 0, pos = 0;
};
struct KvAppendParams {
  const uint16_t* k_new = nullptr;
  const uint16_t* v_new = nullptr;
  const KvAppendRow* dst = nullptr;  // [rows] device
  int64_t rows = 0;
  int num_heads_kv = 0, head_dim = 0;
};
cudaError_t kv_append_rows(const KvAppendParams& p, cudaStream_t s);

// act[r, i] = silu(gu[r, i]) * gu[r, inter + i], in f32 (act) and / or rounded to bf16 (act_bf16: the input
// of the bf16 down projection; bit-identical to converting act). Four elements per thread when inter % 4 ==
// 0 and gu is 16-byte aligned, act 16-byte and act_bf16 8-byte aligned; else one.
struct SwiGluParams {
  const float* gu = nullptr;        // [rows, 2 * inter] f32: gate, then up; or
  const uint16_t* gu_bf16 = nullptr;  // the same in bf16 (exactly one of gu, gu_bf16)
  float* act = nullptr;          // [rows, inter] f32, or nullptr
  uint16_t* act_bf16 = nullptr;  // [rows, inter] bf16, or nullptr (at least one of act, act_bf16)
  int64_t rows = 0, inter = 0;
};
cudaError_t swiglu(const SwiGluParams& p, cudaStream_t s);

// dst[i] = bf16(src[i]) (round to nearest even), i < count.
cudaError_t f32_to_bf16_array(const float* src, uint16_t* dst, size_t count, cudaStream_t s);
// dst[i] = value, i < count.
cudaError_t fill_f32(float* dst, size_t count, float value, cudaStream_t s);

// next[r] = the lowest index of the largest non-NaN logit of row r (sampler.h argmax), -1 if all are NaN.
// One CTA per row.
struct ArgmaxParams {
  const float* logits = nullptr;  // [rows, vocab]
  int32_t* next = nullptr;        // [rows]
  int64_t rows = 0, vocab = 0;
};
cudaError_t argmax_rows(const ArgmaxParams& p, cudaStream_t s);

}  // namespace retroinfer::cuda::model
