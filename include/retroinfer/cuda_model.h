// The CUDA model runner (host-only header, no CUDA types): model weights in GPU memory, a batched
// session (prefill + decode of a batch of sequences), the per-layer decode-attention seam the session
// uses for every attention method, and the causal prefill attention kernel.
//
// Conventions (as cuda_backend.h): a layer's KV for a batch of num_seqs sequences is
//   K, V  device [num_seqs, num_heads_kv, kv_stride, head_dim] bf16 (uint16 bits), post-RoPE;
// rows [0, num_tokens) of each (sequence, KV head) valid. Activations are f32 unless a comment says bf16.
// Threading contract: every object here is used by one host thread at a time; work is asynchronous on the
// object's stream unless a comment says "synchronous". Errors throw retroinfer::Error.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "retroinfer/attention.h"
#include "retroinfer/cuda_backend.h"
#include "retroinfer/model_config.h"
#include "retroinfer/sequence_session.h"
#include "retroinfer/session_planner.h"
#include "retroinfer/wave_buffer.h"

namespace retroinfer {
class Model;
}

namespace retroinfer::cuda {

// ---------------------------------------------------------------------------------------------------
enum class WeightType : uint8_t { kBf16, kF32 };  // f32: exactness tests against the CPU runner

// A model's weights in GPU memory. Immutable after load; any number of sessions may use it.
class GpuPrefixTier;

class CudaModel {
 public:
  // From a CPU model's f32 weights (converted to `type` on upload).
  static std::unique_ptr<CudaModel> upload(const Model& model, WeightType type = WeightType::kBf16);
  // Random weights of a shape (benchmarks; no file): normal(0, 0.02) matrices, unit norms, generated on
  // the device from `seed`.
  static std::unique_ptr<CudaModel> random(const ModelConfig& cfg, uint64_t seed, WeightType type = WeightType::kBf16);
  ~CudaModel();
  CudaModel(const CudaModel&) = delete;
  CudaModel& operator=(const CudaModel&) = delete;

  const ModelConfig& config() const;
  WeightType weight_type() const;
  int64_t weight_bytes() const;  // device bytes of the weights
  struct Weights;                // defined in src/backend/cuda/model/
  const Weights& weights() const;

  // The prefix cache's GPU tier (docs/prefix-cache.md): sessions of this model give the K/V blocks they
  // export device copies within capacity_bytes (0: none, the default), load them back inside GPU memory,
  // and plan their own memory with the tier's unused capacity held back. Set before the first session;
  // throws Error for a negative capacity.
  void set_prefix_gpu_tier(int64_t capacity_bytes);
  // The tier, or null without one (defined in src/model/cuda/prefix_gpu_tier.h).
  GpuPrefixTier* prefix_gpu_tier() const;
  std::optional<PrefixGpuTierStats> prefix_gpu_tier_stats() const;  // nullopt without a tier

 private:
  CudaModel();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct CudaSessionOptions {
  AttentionConfig attention;        // decode attention method and parameters
  int64_t max_context = 0;          // tokens per sequence (prompt + generated); 0 = the model's max
  int prefill_chunk = 2048;         // tokens per prefill block
  KvPlacement placement = KvPlacement::kGpu;
  int gpu_layers = -1;              // kSplit: layers on the GPU (-1: as many as fit)
  WaveBufferConfig wave;            // host-tier layers
  int64_t gpu_memory_limit = 0;     // bytes the session may use on the GPU; 0 = free memory minus a reserve
  // With gpu_memory_limit 0: GPU bytes left free beside the reserve. The session adds its model's prefix GPU
  // tier's unused capacity (CudaModel::set_prefix_gpu_tier), so that the tier's copies keep their room.
  int64_t gpu_held_back_bytes = 0;
  int64_t host_memory_limit = 0;    // pinned bytes; 0 = a share of MemAvailable
  // Decode runs the model's non-attention work (embedding, norms, products, RoPE / KV append, LM head) as
  // CUDA graphs captured once per session, one per gap between two layers' attention; the attention runs
  // eagerly between them (its launch arguments change every step). false: every kernel launched eagerly.
  // Step timing (set_step_timing) and RETROINFER_CUDA_SYNC=1 (a synchronisation after every launch, which a
  // capture forbids) always run eagerly. A CudaJoinedDecoder made by make_joined_decode() follows this too.
  bool decode_graphs = true;
  // last_stats() with the device's exact-token counts (LayerAttention::exact_stats: a synchronisation and a
  // small read-back per layer, on the first call after a decode); false: the host-side counts, where
  // retro's retrieval zone is an upper bound (no extra work on the decode path).
  bool exact_stats = false;
  // Records retro's retrieval clusters per decode step, layer and flat head (GPU-tier retro layers; the
  // host tier does not record). nullptr: none. See SessionOptions::cluster_trace.
  std::shared_ptr<ClusterTraceWriter> cluster_trace;
  // Benchmarks: the host-tier layers' retrieval clusters follow this recorded trace instead of the queries'
  // selection (LayerAttention::set_query_trace; bench decode --query-trace). nullptr: the queries select.
  std::shared_ptr<const ClusterTraceSchedule> query_trace;
  // After every decode step (the session's own or a CudaJoinedDecoder's), add the host-tier layers' missed
  // rows to wave_traffic(): a small synchronous read of the wave-buffer counters per step (off in `bench
  // decode`, whose timing must not include it; on in the engine's sessions, which report it).
  bool count_wave_traffic = false;
  // KV cache element type: kBF16, or kI8 (the 8-bit KV cache: int8 rows with an f32 scale each, 2 D + 8 bytes
  // per token and head instead of 4 D; full and retro, every layer on the GPU). With kI8 each layer's
  // attention object owns its KV (src/attention/cuda/kv_int8_cache.h) as a host-tier layer does: the prefill
  // runs layer-major through one bf16 staging layer, which each layer's prefill_done quantises.
  DType kv_dtype = DType::kBF16;
};

// Memory a session would take, computed before anything is allocated.
struct CudaSessionPlan {
  int num_seqs = 0;
  int64_t max_context = 0;
  int gpu_layers = 0, host_layers = 0;
  int64_t gpu_bytes = 0, host_bytes = 0;          // needed
  int64_t gpu_free_bytes = 0, host_free_bytes = 0;  // the limits it was checked against
};

// Wave-buffer counts of a session's host-tier layers (CudaSession::last_wave_counts).
struct CudaWaveCounts {
  int objects = 0;          // host-tier attention objects summed (host layers, times sequences when per sequence)
  WaveStepCounts step;      // the last decode step: clusters / rows from the GPU cache (hits) and the store (misses)
  WaveBufferStats totals;   // the managers' counters since prefill_done (clusters)
  WaveStageTimes stages;    // their steps' stage times since prefill_done (CudaSessionOptions wave.stage_times)
  // Retrieval clusters of the last step served from the GPU cache (hits / (hits + misses)); -1 when none.
  double step_hit_ratio() const {
    const int64_t n = step.hit_clusters + step.miss_clusters;
    return n > 0 ? double(step.hit_clusters) / double(n) : -1.0;
  }
};

// PCIe traffic of a session's host-tier misses (CudaSessionOptions::count_wave_traffic): each missed row is
// one K and one V row read from pinned host memory (store_token_bytes of the store's element type).
struct CudaWaveTraffic {
  int64_t step_bytes = 0;   // the last decode step
  int64_t total_bytes = 0;  // every step counted since prefill
  int64_t steps = 0;        // decode steps counted
};

// A batch of sequences decoded in lockstep (one token each per step). Sequences of different prompt
// lengths are allowed. Not thread-safe.
class CudaSession {
 public:
  // Plans the memory for num_seqs sequences of opt.max_context tokens and allocates it; throws Error
  // (bytes needed vs free, on which side) before allocating anything when it cannot fit.
  CudaSession(const CudaModel& model, const CudaSessionOptions& opt, int num_seqs);
  ~CudaSession();
  CudaSession(const CudaSession&) = delete;
  CudaSession& operator=(const CudaSession&) = delete;

  // The plan alone (no allocation): what the constructor would check.
  static CudaSessionPlan plan(const ModelConfig& cfg, const CudaSessionOptions& opt, int num_seqs,
                              int64_t weight_bytes);

  // Runs every prompt (prompts.size() == num_seqs), then builds each layer's attention index.
  // Returns logits: [num_seqs, vocab] of each prompt's last position, or with all_logits (num_seqs == 1
  // only) [n, vocab] of every position. Once per session.
  // With every layer GPU-tier the prompts run chunk-major (each chunk through every layer). With any
  // host-tier layer they run layer-major: the residual stream of every prompt token is kept (sum of prompt
  // lengths x hidden x 4 bytes: on the GPU when the plan leaves room in the session's GPU limit, else in
  // pinned host memory within the host limit) with D x 4 + 12 bytes per token of row data on the GPU,
  // allocated here and freed on return (an Error before any work when they do not fit); each layer
  // processes every chunk of every sequence (the same chunks and kernels as chunk-major, so the results
  // are the same), and a host-tier layer's K/V goes through the staging buffer to its prefill_done.
  std::vector<float> prefill(const std::vector<std::vector<int32_t>>& prompts, bool all_logits = false,
                             const PrefillProgress& progress = {});
  // Instead of prefill (benchmarks): every sequence gets `tokens` tokens (>= 268) of synthetic K/V at every
  // layer (src/eval/synthetic.h generator, cuda_synthetic.h), layer by layer into the layer's GPU K/V or the
  // staging buffer, each followed by that layer's prefill_done (index build) and a progress call
  // (done = tokens * (l + 1) / layers). One layer is generated on the host; the other layers are device
  // copies of the first filled one. No logits.
  void fill_synthetic(int64_t tokens, uint64_t seed, const PrefillProgress& progress = {});

  // One decode step of every sequence: tokens [num_seqs]; logits [num_seqs, vocab] written (host).
  void decode(std::span<const int32_t> tokens, std::span<float> logits);
  // One decode step with greedy selection on the GPU: next [num_seqs] written (host).
  void decode_greedy(std::span<const int32_t> tokens, std::span<int32_t> next);

  // Prefix reuse (SequenceSession::load_prefix, docs/prefix-cache.md) for a one-sequence session whose every
  // layer keeps its KV on the GPU (supports_prefix): load_prefix copies the prefix's K/V (bf16 blocks) into
  // positions [0, prefix.size()) of a fresh session; the next prefill({tokens}) needs tokens to start with the
  // prefix's and to be longer, runs the model over the rest only (its chunks end where a cold prefill's do) and
  // builds every layer's index over the whole context. export_kv copies positions [from, to) of the K/V out.
  // Both throw Error for a session they do not serve (several sequences, host-tier layers) and for K/V of
  // another shape or dtype, before any work.
  bool supports_prefix() const;
  void load_prefix(const KvPrefix& prefix);
  KvBlock export_kv(int64_t from, int64_t to) const;
  // A new session over a device copy of this prefilled session's KV with another attention config.
  // Every layer must be GPU-tier (host-tier layers' KV lives in their wave buffers: Error).
  std::unique_ptr<CudaSession> fork(const AttentionConfig& attention) const;

  int num_seqs() const;
  std::vector<int64_t> positions() const;  // tokens held per sequence
  int64_t max_context() const;
  const CudaSessionPlan& memory_plan() const;
  const CudaSessionOptions& options() const;
  const CudaModel& model() const;
  // Last decode step: attention stats summed over layers and sequences; with CudaSessionOptions::exact_stats
  // the exact tokens the device attended (LayerAttention::exact_stats: the first call after a decode
  // synchronises and reads retro's per-head counts back; later calls return the cached sum), else the
  // host-side counts; time split (ms, CUDA events) into "attention" and "other" when timing is on (it adds
  // a synchronisation per layer).
  const AttentionStats& last_stats() const;
  void set_step_timing(bool on);
  // True once decode replays captured CUDA graphs (CudaSessionOptions::decode_graphs; captured at the
  // second decode step after a prefill or fill). False before, when off, or when capture failed (the
  // session then launches eagerly; the reason is printed once to stderr).
  bool decode_graphs_active() const;
  std::vector<std::pair<std::string, float>> last_step_ms() const;
  // Prefill timeline (set_prefill_timing(true) before prefill; every layer on the GPU, the chunk-major path):
  // CUDA events at each chunk's start and end and around each layer's attention, read once the prefill is done
  // (no synchronisation inside it). last_prefill_ms: milliseconds summed over the chunks, in this order:
  // "attention" (the layers' prefill attention), "layers" (from one layer's attention to the next's: O, MLP,
  // norms, QKV, RoPE and the K/V append), "chunk_start" (embedding and the first layer's work before its
  // attention), "chunk_end" (the last layer's work after its attention), "between_chunks" (from a chunk's end
  // to the next one's start: the row upload, all_logits' LM head, and the GPU idle if the host was late),
  // "gpu_total" (the first chunk's start to the last one's end). Empty when timing was off or the prefill ran
  // layer-major.
  void set_prefill_timing(bool on);
  std::vector<std::pair<std::string, float>> last_prefill_ms() const;
  // Host seconds spent issuing decode steps (decode / decode_greedy from entry to the wait for the step's
  // results), summed since construction: against the steps' wall time it says whether the host's launches
  // (and, in benchmarks, a query trace's replay) or the device bound the step.
  double host_issue_seconds() const;
  // The retrieval multiple of each layer the last prefill's budget calibration chose (AttentionConfig::
  // layer_budget_queries; docs/wave-index.md, "Retrieval budgets by layer"); empty when every layer keeps the
  // nominal budget (calibration off, a method other than retro, several sequences, fewer than two GPU-tier retro
  // layers with an index). Host-tier layers keep 1.
  const std::vector<double>& layer_budget_multipliers() const;
  // Seconds the last prefill, fill_synthetic or fork spent building the layers' attention: the wave index's
  // k-means and copies, the host-tier stores' fills and the budget calibration (the stream synchronised before
  // and after each, so no prefill work is counted). Part of the time to first token.
  double index_build_seconds() const;
  // The host-tier layers' wave-buffer counts, summed over layers and sequences: the last decode step's
  // hits and misses (device counters) and the managers' totals since prefill_done. Synchronous (waits for
  // the session's stream, reads device memory). All zero (objects 0) without host-tier layers; before the
  // first decode the hit / miss counts are zero (steady_rows is the steady zone's size). PCIe bytes of the
  // last step's misses: step.miss_rows * 2 * head_dim * 2 (K and V, bf16).
  CudaWaveCounts last_wave_counts();
  // Host-tier PCIe traffic since prefill (all zero unless count_wave_traffic is on and a layer is host-tier).
  const CudaWaveTraffic& wave_traffic() const;

 private:
  friend class CudaJoinedDecoder;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Continuous batching on the GPU: one decode step of several one-sequence sessions of one model, prefilled
// apart and holding different positions, in one call. The embedding, the norms, every product and the LM head
// run once over all their rows (each weight read once per step, instead of once per session); each session's
// RoPE position, KV append and decode attention stay its own (its LayerAttention objects, its K/V), whatever
// its placement: a host-tier layer (wave buffer) appends the row's K/V to its own steady zone as in the
// session's own decode. Logits equal each session's own decode() up to the products' summation order (the
// tuned kernels depend on the row count). Runs on the decoder's own stream, after each session's pending work:
// the non-attention work from CUDA graphs per batch size (captured at that size's second step; decode_graphs
// false: eager), each session's attention launched eagerly between them: a host-tier layer's on the session's
// own stream, ordered by events, so that its gather over PCIe overlaps the GPU-tier layers' attention on the
// decoder's stream (no host synchronisation inside a layer). It grows
// its row buffers (~(hidden + qkv + 3 intermediate + vocab) x 4 bytes per row, plus a Gemm workspace) to the
// largest batch seen. One caller at a time.
class CudaJoinedDecoder {
 public:
  // decode_graphs: as CudaSessionOptions::decode_graphs, for the decoder's own non-attention work.
  explicit CudaJoinedDecoder(const CudaModel& model, bool decode_graphs = true);
  ~CudaJoinedDecoder();
  CudaJoinedDecoder(const CudaJoinedDecoder&) = delete;
  CudaJoinedDecoder& operator=(const CudaJoinedDecoder&) = delete;

  // Whether `s` can join: of this decoder's model (takes) or of any model (joinable), one sequence,
  // prefilled (any KV placement).
  bool takes(const CudaSession& s) const;
  static bool joinable(const CudaSession& s);
  // tokens [n], logits [n, vocab] (host); sessions distinct. Throws Error (before any work) for a session it
  // does not take, a duplicate, a full session or a token outside the vocabulary.
  void decode(std::span<CudaSession* const> sessions, std::span<const int32_t> tokens, std::span<float> logits);
  // The same step with greedy selection on the GPU: next [n] written (host), 4 bytes per session back.
  void decode_greedy(std::span<CudaSession* const> sessions, std::span<const int32_t> tokens, std::span<int32_t> next);
  const CudaModel& model() const;

 private:
  // One step up to the logits (the decoder's a.logits rows [0, n)), on the decoder's stream; not synchronised,
  // positions not advanced. Throws Error before any work for what decode refuses.
  void step(std::span<CudaSession* const> sessions, std::span<const int32_t> tokens);
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// SequenceSession (sequence_session.h) over a CudaSession of one sequence.
class CudaSequenceSession final : public SequenceSession {
 public:
  CudaSequenceSession(const CudaModel& model, const CudaSessionOptions& opt);
  explicit CudaSequenceSession(std::unique_ptr<CudaSession> session);
  ~CudaSequenceSession() override;
  std::vector<float> prefill(std::span<const int32_t> tokens, bool all_logits = false,
                             const PrefillProgress& progress = {}) override;
  void decode(int32_t token, std::span<float> logits) override;
  std::unique_ptr<SequenceSession> fork_session(const AttentionConfig& attention) const override;
  // Prefix reuse (CudaSession::load_prefix): a session whose every layer is on the GPU.
  void load_prefix(const KvPrefix& prefix) override;
  KvBlock export_kv(int64_t from, int64_t to) const override;
  bool supports_prefix() const override;
  int64_t position() const override;
  int64_t max_context() const override;
  const ModelConfig& model_config() const override;
  const AttentionConfig& attention_config() const override;
  const AttentionStats& last_stats() const override;
  Device device() const override { return Device::kCuda; }
  // The model when session() can join a CudaJoinedDecoder (CudaJoinedDecoder::takes), else null.
  const void* join_key() const override;
  std::unique_ptr<JoinedDecode> make_joined_decode() const override;
  // The plan's placement and layer split; with host-tier layers the managers' hit / miss totals
  // (last_wave_counts, synchronous) and the PCIe bytes of the misses summed over this object's decode calls.
  std::optional<KvPlacementReport> kv_placement_report() override;
  std::vector<double> layer_budget_multipliers() const override { return session_->layer_budget_multipliers(); }
  CudaSession& session() { return *session_; }

 private:
  std::unique_ptr<CudaSession> session_;
  // Host tier only: miss bytes of the last decode step and their sum (decode reads the step's counts after
  // its logits are back, so the read adds no wait of its own).
};

}  // namespace retroinfer::cuda
