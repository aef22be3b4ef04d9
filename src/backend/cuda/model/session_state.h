// CudaSession's state, shared by the files that implement it: cuda_session.cpp (lifecycle, prefill, decode,
// fork), forward.cpp (the transformer layers), session_plan.cpp (memory plan, placements, synthetic fill).
// Host-only header.
//
// Layouts (rows = tokens of one forward; rows_cap = the most rows any forward uses):
//   k[l], v[l]  device [num_seqs, Hkv, max_context, D] bf16: layer l's KV, post-RoPE (kv_stride = max_context)
//   activations f32 row-major [rows_cap, ...] as commented on Activations.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/model/gemm.h"
#include "model/rope.h"
#include "retroinfer/cuda_model.h"

namespace retroinfer::cuda {

// Rows of the activation buffers: a prefill chunk (at most max_context) or one token per sequence.
int64_t session_rows(const CudaSessionOptions& opt, int64_t max_context, int num_seqs);
// Rows of the logits buffer: every sequence's token in decode; prefill's all_logits goes through it in blocks
// of up to 256 rows (a [chunk, vocab] buffer would be 1 GiB for chunk 2048 and a 128K vocabulary).
int64_t session_logit_rows(int64_t rows, int num_seqs);
// Device bytes of the activation buffers (Activations below, the bf16 GEMM workspace included).
int64_t session_activation_bytes(const ModelConfig& cfg, int64_t rows, int64_t logit_rows, int num_seqs, bool bf16);

struct Activations {
  DeviceBuffer x;       // [rows_cap, hidden] f32: residual stream
  DeviceBuffer xn;      // [rows_cap, hidden] f32: normalised
  DeviceBuffer qkv;     // [rows_cap, (Hq + 2 Hkv) D] f32
  DeviceBuffer q;       // [rows_cap, Hq, D] f32, post-RoPE
  DeviceBuffer att;     // [rows_cap, Hq, D] f32: attention output
  DeviceBuffer gu;      // [rows_cap, 2 * intermediate] f32: gate, up
  DeviceBuffer act;     // [rows_cap, intermediate] f32: SiLU(gate) * up
  DeviceBuffer k_new;   // [rows_cap, Hkv, D] bf16: this step's keys (decode)
  DeviceBuffer v_new;   // [rows_cap, Hkv, D] bf16
  DeviceBuffer rope;    // [2, rows_cap, D / 2] f32: cos, then sin
  DeviceBuffer rows;    // [3, rows_cap] int32: token, sequence, position of each row
  DeviceBuffer logits;  // [logit_rows, vocab] f32
  DeviceBuffer next;    // [num_seqs] int32: greedy tokens
};

// Page-locked host staging of one forward's row data (tokens, sequences, positions, cos / sin), so that the
// uploads are truly asynchronous; `ready` is recorded after the copies and waited for before the next fill.
struct RowStaging {
  RowStaging(int64_t rows_cap, int head_dim);
  ~RowStaging();
  RowStaging(const RowStaging&) = delete;
  RowStaging& operator=(const RowStaging&) = delete;
  void wait();  // blocks until the previous upload has read the buffer
  int32_t* tokens = nullptr;  // [rows_cap]
  int32_t* seq = nullptr;     // [rows_cap]
  int32_t* pos = nullptr;     // [rows_cap]
  float* cos = nullptr;       // [rows_cap, D / 2]
  float* sin = nullptr;       // [rows_cap, D / 2]
  void* base = nullptr;       // the cudaMallocHost block
  void* ready = nullptr;      // cudaEvent_t
  int64_t bytes = 0;
};

// The session's CUDA stream (created blocking, so it is ordered with work on the legacy default stream that
// other components may issue). Declared first in Impl so that it is destroyed last, after everything bound
// to it (the cuBLAS handle, the attention objects).
struct OwnedStream {
  OwnedStream();
  ~OwnedStream();
  OwnedStream(const OwnedStream&) = delete;
  OwnedStream& operator=(const OwnedStream&) = delete;
  Stream get() const { return stream; }
  Stream stream = nullptr;  // cudaStream_t
};

struct CudaSession::Impl {
  Impl(const CudaModel& m, const CudaSessionOptions& o, int n) : model(m), opt(o), num_seqs(n) {}
  ~Impl();

  OwnedStream owned_stream;
  const CudaModel& model;
  CudaSessionOptions opt;
  int num_seqs = 1;
  int64_t max_context = 0;
  CudaSessionPlan plan;
  AttentionShape shape;

  Stream stream = owned_stream.get();
  std::unique_ptr<model::Gemm> gemm;
  std::optional<PrefillAttention> prefill_attention;  // shapes the fast kernel takes; else the reference
  std::vector<DeviceBuffer> k, v;                     // [num_layers]
  int64_t rows_cap = 0, logit_rows = 0;
  Activations a;
  std::unique_ptr<RowStaging> staging;

  std::vector<int64_t> pos;  // [num_seqs]: tokens held
  bool prefilled = false;
  // Decode attention: one object per layer over the whole batch (attn_per_seq false: every sequence holds
  // the same number of tokens), or one per (sequence, layer), index s * num_layers + l, with num_seqs = 1.
  std::vector<std::unique_ptr<LayerAttention>> attn;
  bool attn_per_seq = false;
  AttentionStats last_stats;

  ::retroinfer::model::RopeFrequencies freqs;  // for freqs_len (only `dynamic` depends on it)
  int64_t freqs_len = -1;

  bool timing = false;     // set_step_timing
  bool recording = false;  // timing and inside decode: forward() records the attention events
  std::vector<void*> events;  // cudaEvent_t: [0] step start, [1] step end, [2 + 2l] / [3 + 2l] layer l attention
  std::vector<std::pair<std::string, float>> last_ms;

  int64_t seq_elems() const { return int64_t{shape.num_heads_kv} * max_context * shape.head_dim; }
  const ::retroinfer::model::RopeFrequencies& frequencies(int64_t seq_len);
  // Copies the staged rows [0, rows) to the device (asynchronous on `stream`).
  void upload_rows(int64_t rows);
  // Embedding + every layer for the staged rows. Prefill: all rows belong to sequence `seq` at positions
  // [pos0, pos0 + rows). Decode: row s is sequence s at pos[s], attention through `attn`.
  void forward(int64_t rows, bool decode, int seq, int64_t pos0);
  // Final norm + LM head of rows [row0, row0 + count) into a.logits rows [0, count).
  void lm_head(int64_t row0, int64_t count);
  // Creates the decode attention objects and runs prefill_done on each (after prefill or a fork).
  void build_attention();
  // One decode step of every sequence up to the logits (a.logits rows [0, num_seqs)); not synchronised.
  void decode_step(std::span<const int32_t> tokens);
  // Fills last_ms from the step's events (after the step's results were downloaded).
  void collect_timing();
  void record_event(int i);
};

}  // namespace retroinfer::cuda
