// CudaSession's state, shared by the files that implement it: cuda_session.cpp (lifecycle, prefill, decode,
// fork), forward.cpp (the transformer layers), session_plan.cpp (memory plan, placements, synthetic fill).
// Host-only header.
//
// Layouts (rows = tokens of one forward; rows_cap = the most rows any forward uses):
//   k[l], v[l]  device [num_seqs, Hkv, max_context, D] bf16: layer l's KV, post-RoPE (kv_stride = max_context),
//               for the GPU-tier layers l < plan.gpu_layers only
//   stage_k, stage_v  the same layout, once, when any layer owns its KV (owns_kv: host tier, 8-bit KV cache):
//               such a layer's K/V during prefill (or fill_synthetic) until its LayerAttention::prefill_done
//               copies it to the host store or quantises it
//   activations f32 row-major [rows_cap, ...] as commented on Activations.
//
// KV placement: layer l is GPU-tier when l < plan.gpu_layers (the plan resolves kGpu / kHost / kSplit /
// kAuto), else host-tier (KvTier::kHost, retro through the wave buffer). Decode writes the current token's
// K/V into a.k_new / a.v_new for every layer and into k[l], v[l] for GPU-tier layers; host-tier layers
// append k_new / v_new to their own steady zone.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "model/cuda/gemm.h"
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
  DeviceBuffer xn;      // [rows_cap, hidden] f32: normalised (f32 weights only; empty for bf16)
  DeviceBuffer xb;      // [rows_cap, hidden] bf16 (bf16 weights only): RMSNorm's output, the input of the
                        // QKV, gate/up and LM-head products
  DeviceBuffer actb;    // [rows_cap, intermediate] bf16 (bf16 weights only): SiLU(gate) * up, the input of
                        // the down product (apart from xb: the fused gate/up GEMV reads xb while writing it)
  DeviceBuffer qkv;     // [rows_cap, (Hq + 2 Hkv) D] f32
  DeviceBuffer q;       // [rows_cap, Hq, D] f32, post-RoPE
  DeviceBuffer att;     // [rows_cap, Hq, D] f32: attention output (a prefill with bf16 weights: bf16, first half)
  DeviceBuffer gu;      // [rows_cap, 2 * intermediate] f32: gate, up
  DeviceBuffer act;     // [rows_cap, intermediate] f32: SiLU(gate) * up (f32 weights only; bf16: in xb)
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

// Device pointers to the row data of one forward (rows r in [0, rows)): what the embedding and qkv_post read.
struct RowView {
  const int32_t* tokens = nullptr;  // [rows]
  const int32_t* seq = nullptr;     // [rows]
  const int32_t* pos = nullptr;     // [rows]
  const float* cos = nullptr;       // [rows, D / 2]
  const float* sin = nullptr;       // [rows, D / 2]
};

// Captures count CUDA graphs on `stream`, graph i of what segment(i) launches, instantiated into `out`
// (cudaGraphExec_t). Returns "" on success, else why it failed (out then holds the graphs made before, for the
// caller to destroy; the sticky error of a failed capture is cleared).
std::string capture_graphs(Stream stream, int count, const std::function<void(int)>& segment, std::vector<void*>& out);

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
  std::optional<PrefillAttention> prefill_attention;  // shapes the tensor-core kernel takes; else the reference
  std::vector<DeviceBuffer> k, v;                     // [plan.gpu_layers]: the GPU-tier layers' K/V
  DeviceBuffer stage_k, stage_v;                      // host-tier layers' staging (empty when none)
  int64_t rows_cap = 0, logit_rows = 0;
  Activations a;
  std::unique_ptr<RowStaging> staging;

  std::vector<int64_t> pos;  // [num_seqs]: tokens held
  bool prefilled = false;
  // Tokens of a prefix loaded by load_prefix (one-sequence sessions) whose K/V are in k / v and that the next
  // prefill does not run again; cleared when that prefill ends.
  std::vector<int32_t> prefix_tokens;
  // The rows of a CudaJoinedDecoder (joined_decode.cpp): no KV and no attention objects of its own; row s is
  // another session's token. qkv_post then writes k_new / v_new only (the decoder appends them to each
  // session's cache).
  bool joint = false;
  // Decode attention: one object per layer over the whole batch (attn_per_seq false: every sequence holds
  // the same number of tokens), or one per (sequence, layer), index s * num_layers + l, with num_seqs = 1.
  std::vector<std::unique_ptr<LayerAttention>> attn;
  bool attn_per_seq = false;
  AttentionStats last_stats;  // host-side sums of the last decode (retro: retrieval at capacity)
  AttentionStats exact_last_stats;  // with the device's counts, filled on demand (CudaSession::last_stats)
  bool exact_stats_pending = false;  // a decode ran since exact_last_stats was filled
  bool exact_stats_valid = false;

  ::retroinfer::model::RopeFrequencies freqs;  // for freqs_len (only `dynamic` depends on it)
  int64_t freqs_len = -1;

  // Decode graphs (CudaSessionOptions::decode_graphs): graph_exec[i] (cudaGraphExec_t), i = 0: embedding +
  // layer 0 up to its attention; i = l (1 .. L - 1): layer l - 1 after its attention + layer l up to its
  // attention; i = L: layer L - 1 after its attention + the LM head of every sequence. Captured at the second
  // decode step after a (re)fill (the first, eager, settles lazily tuned products); dropped by a prefill.
  std::vector<void*> graph_exec;
  bool graphs_wanted = false;  // options and environment allow them
  bool graphs_failed = false;  // a capture failed: eager for the rest of the session
  int eager_decode_steps = 0;  // decode steps since the last (re)fill
  void drop_decode_graphs();
  bool capture_decode_graphs();                 // false (graphs_failed set) when the capture fails
  void decode_forward_graphs();                 // one decode step's forward + LM head through graph_exec
  // RMSNorm of x [rows, hidden] into the next product's input: bf16 a.xb (bf16 weights) or f32 a.xn.
  void norm_rows(const float* x, const float* weight, int64_t rows);
  // y [rows, out] (+)= input [rows, in] @ W^T, the input xb16 (bf16 weights) or x32 (f32 weights).
  void product(const void* wt, int64_t rows, int64_t in, int64_t out, float* y, float beta, const uint16_t* xb16,
               const float* x32);
  uint16_t* prefill_q_bf16();  // the Hopper prefill kernel's bf16 q (forward.cpp), or nullptr
  void layer_pre_attention(int l, int64_t rows, const RowView& rv, float* x, bool decode);
  void layer_attention_decode(int l);
  void layer_post_attention(int l, int64_t rows, float* x, bool att_bf16 = false);

  // Retrieval budgets by layer (AttentionConfig::layer_budget_queries, budget_calibration.cpp): per layer the
  // queries of the prompt's last tokens (device [rows, hq, d] f32; prompt_q_swap is the second buffer of the
  // shift), how many rows each holds and the position after the last. One-sequence sessions only.
  std::vector<DeviceBuffer> prompt_q, prompt_q_swap;
  std::vector<int64_t> prompt_q_rows, prompt_q_end;
  std::vector<double> layer_multipliers;  // layer_budget_multipliers()
  // Rows kept per layer: 0 when this session's queries serve no calibration (its own or a fork's).
  int64_t prompt_queries_kept() const;
  // Prefill of layer l, rows at positions [pos0, pos0 + rows) in a.q: keeps the last prompt_queries_kept().
  void keep_prompt_queries(int l, int64_t rows, int64_t pos0);
  // After the index builds: measures each GPU-tier retro layer's missed mass and sets the multiples.
  void calibrate_layer_budgets();
  // A fork's copy of the parent's kept queries (device to device on `stream`).
  void copy_prompt_queries(const Impl& parent);

  double issue_s = 0.0;    // host_issue_seconds
  bool timing = false;     // set_step_timing
  bool recording = false;  // timing and inside decode: forward() records the attention events
  std::vector<void*> events;  // cudaEvent_t: [0] step start, [1] step end, [2 + 2l] / [3 + 2l] layer l attention
  std::vector<std::pair<std::string, float>> last_ms;
  // Prefill timeline (set_prefill_timing): while a chunk-major prefill runs with it on, mark_prefill() records
  // an event at each chunk's start and end and before / after each layer's attention, in that order.
  bool prefill_timing = false;
  bool prefill_marking = false;
  std::vector<void*> prefill_marks;  // cudaEvent_t
  std::vector<std::pair<std::string, float>> prefill_ms;
  void mark_prefill();
  // Sums the marks of a finished prefill into prefill_ms and destroys them (after the stream's synchronisation).
  void collect_prefill_timing();
  void drop_prefill_marks();

  int64_t seq_elems() const { return int64_t{shape.num_heads_kv} * max_context * shape.head_dim; }
  int num_layers() const { return model.config().num_layers; }
  bool host_tier(int l) const { return l >= plan.gpu_layers; }
  bool any_host_tier() const { return plan.gpu_layers < num_layers(); }
  // Layer l's attention object keeps the layer's KV itself (host tier, or the 8-bit KV cache): the runner
  // holds no k[l] / v[l], the prefill stages the layer's bf16 K/V for its prefill_done, and decode hands the
  // step's K/V to the object (k_new / v_new) instead of writing a cache row.
  bool owns_kv(int l) const { return host_tier(l) || opt.kv_dtype == DType::kI8; }
  bool any_owned_kv() const { return any_host_tier() || opt.kv_dtype == DType::kI8; }
  // Throws Error unless a host-tier layer can index a sequence of n tokens (the wave buffer needs tokens
  // beyond the steady zone: n - sink - window >= tokens_per_cluster). No-op without host-tier layers.
  void check_host_tier_length(int64_t n, const char* where) const;
  // Layer l's K/V during prefill: k[l] / v[l] (the runner's), or the staging buffers (owns_kv).
  uint16_t* prefill_k(int l);
  uint16_t* prefill_v(int l);
  const ::retroinfer::model::RopeFrequencies& frequencies(int64_t seq_len);
  // The activation buffers (a.*), the row staging and the Gemm for rows_cap / logit_rows rows.
  void allocate_activations();
  // Copies the staged rows [0, rows) to the device (asynchronous on `stream`): into a.rows / a.rope, or
  // with dst_rows / dst_rope into buffers of `stride` rows ([3, stride] int32, [2, stride, D / 2] f32) at
  // row `offset`.
  void upload_rows(int64_t rows);
  void upload_rows_to(int32_t* dst_rows, float* dst_rope, int64_t stride, int64_t offset, int64_t rows);
  RowView staged_rows() const;  // a.rows / a.rope (stride rows_cap)
  // Embedding + every layer for the staged rows. Prefill: all rows belong to sequence `seq` at positions
  // [pos0, pos0 + rows). Decode: row s is sequence s at pos[s], attention through `attn`.
  void forward(int64_t rows, bool decode, int seq, int64_t pos0);
  // x [rows, hidden] f32 = the embeddings of rv.tokens.
  void embed(int64_t rows, const RowView& rv, float* x);
  // Layer l over rows [0, rows) of the residual stream x [rows, hidden] f32 (updated in place), row data rv;
  // prefill / decode as forward(). Uses the activation buffers a.* (rows <= rows_cap).
  void layer_forward(int l, int64_t rows, const RowView& rv, float* x, bool decode, int seq, int64_t pos0);
  // Final norm + LM head of rows [row0, row0 + count) of x (default a.x) into a.logits rows [0, count).
  void lm_head(int64_t row0, int64_t count, const float* x = nullptr);
  // Autotunes the decode products (num_seqs rows, bf16 weights; see gemm.h) on every layer's weights, so
  // that the first decode step runs tuned. Clobbers the activation buffers (call before any forward).
  void tune_decode_gemms();
  // The same for the prefill products at rows_cap rows (the prefill chunk), when rows_cap > kGemmTuneMaxRows.
  void tune_prefill_gemms();
  // What both tune: QKV, O, gate/up + SwiGLU and down at n rows (forward.cpp); false when O was not tuned.
  bool tune_layer_gemms(int64_t n);
  // Creates the decode attention objects for the token counts in pos (no prefill_done yet): one per layer
  // over the batch when every sequence holds the same count, else one per (sequence, layer).
  void make_attention();
  // prefill_done of layer l's attention object(s) over prefill_k(l), prefill_v(l). Synchronises.
  void attention_prefill_done(int l);
  // The same on stream `on` (build_attention's second thread builds alternate layers on its own stream).
  void attention_prefill_done_on(int l, Stream on);
  // make_attention + attention_prefill_done for every layer (after a GPU-only prefill or a fork) and the budget
  // calibration, timed into index_build_s (the stream synchronised on both sides).
  void build_attention();
  void build_attention_layers();  // build_attention's work, untimed
  // attention_prefill_done(l), timed into index_build_s (as timed_build).
  void timed_prefill_done(int l);
  // Runs `work` with the stream synchronised before it (earlier work is not counted) and after it (its
  // asynchronous work is), adding its seconds to index_build_s.
  void timed_build(const std::function<void()>& work);
  // index_build_seconds(): the last prefill's, fill's or fork's seconds in the attention objects' prefill_done
  // (index builds, host-tier store fills) and the budget calibration.
  double index_build_s = 0.0;
  // Prefill when any layer is host-tier (cuda_prefill_layers.cpp): layer-major over every prompt token.
  std::vector<float> prefill_layer_major(const std::vector<std::vector<int32_t>>& prompts, bool all_logits,
                                         const PrefillProgress& progress);
  // One decode step of every sequence up to the logits (a.logits rows [0, num_seqs)); not synchronised.
  void decode_step(std::span<const int32_t> tokens);
  // Fills last_ms from the step's events (after the step's results were downloaded).
  void collect_timing();
  void record_event(int i);
  // After a decode step whose work has finished (the caller synchronised): adds the host-tier layers'
  // missed rows to traffic when opt.count_wave_traffic is on.
  void count_wave_traffic();
  CudaWaveTraffic traffic;
};

}  // namespace retroinfer::cuda
