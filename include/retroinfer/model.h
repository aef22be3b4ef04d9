// The CPU model runner for the Llama family (Llama 2/3/3.x, Qwen2 with QKV bias, Mistral, SmolLM2):
// embeddings, RMSNorm, RoPE (default / linear / dynamic / llama3 / yarn), GQA attention through the
// attention interface (include/retroinfer/attention.h), SwiGLU MLP, final norm, tied or untied LM head.
//
// Weights of the ggml block types (Q8_0/Q4_0/Q4_1/Q5_0/Q5_1/Q4_K/Q5_K/Q6_K) stay in their blocks by default
// (WeightStorage::kBlocks: memory and the bytes a decode step reads match the file); f32/f16/bf16 weights are
// widened to f32 at load, as are all weights with WeightStorage::kF32.
// Prefill runs in chunks through cblas_sgemm (block weights widened one tile at a time); decode runs one token
// through per-row dot products (f32 rows, or block rows against the activations quantized to 8 bits, with
// SIMD kernels chosen at run time), or one token of each of several sequences at once
// (Session::decode_batch: the weights read once for all of them).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "retroinfer/attention.h"
#include "retroinfer/dtype.h"
#include "retroinfer/kv_cache.h"
#include "retroinfer/model_config.h"
#include "retroinfer/sequence_session.h"

namespace retroinfer {

class ModelFile;

// Bytes a model and one sequence of `context_tokens` need on the CPU.
struct MemoryEstimate {
  int64_t weight_bytes = 0;      // the weights in f32 (an upper bound for WeightStorage::kBlocks)
  int64_t kv_bytes = 0;          // keys + values of every layer for context_tokens tokens
  int64_t activation_bytes = 0;  // scratch of one prefill chunk (+ logits)
  int64_t total() const { return weight_bytes + kv_bytes + activation_bytes; }
};
MemoryEstimate estimate_memory(const ModelConfig& cfg, int64_t context_tokens, DType kv_dtype, int prefill_chunk);

// Memory this process may still allocate: MemAvailable of /proc/meminfo, else sysconf(_SC_AVPHYS_PAGES)
// times the page size; the smaller of that and a cgroup limit (memory.max) when one is set.
int64_t available_memory_bytes();

// Longest context (prompt + generated tokens) the model supports: max_position_embeddings, times the
// factor for `dynamic` RoPE (which exists to extend it); 0 in the config means "no limit known".
int64_t model_max_context(const ModelConfig& cfg);

// Threads of the CPU forward pass (OpenMP loops and OpenBLAS); throws Error for n < 1.
void set_num_threads(int n);
int num_threads();
// OpenBLAS's kernels: the core type it chose when it loaded ("SkylakeX", "Haswell", ...), and the
// OPENBLAS_CORETYPE that would serve this CPU better when it fell back to its generic "Prescott" kernels (a CPU
// model newer than the library knows) on a CPU with AVX-512 or AVX2 + FMA; nullptr when its choice stands. The
// choice is made when the library loads: only a new process can take the better one (the CLI's main does).
const char* blas_core_name();
const char* better_blas_core();

// How the CPU runner keeps the weights of the ggml block types.
enum class WeightStorage : uint8_t {
  kBlocks,  // as stored; decode products quantize the activations to 8 bits per 32 (docs/model-runner.md)
  kF32,     // widened to f32 at load: 4 bytes a weight, products in f32 (the reference for kBlocks)
};
std::string_view weight_storage_name(WeightStorage s);  // "blocks" | "f32"
WeightStorage parse_weight_storage(std::string_view s);  // throws Error for anything else

struct ModelOptions {
  // Memory budget for the checks; 0 = available_memory_bytes(). Tests set it to exercise the refusal.
  int64_t memory_limit_bytes = 0;
  WeightStorage weight_storage = WeightStorage::kBlocks;
};

// A loaded model: config + weights. Immutable after load; any number of Sessions may use it at once.
class Model {
 public:
  // path: anything ModelFile::open accepts (a HF directory, a .safetensors file, a .gguf file).
  // Throws Error when the file cannot be read, a tensor is missing or has the wrong shape, or the
  // weights do not fit in memory.
  static std::unique_ptr<Model> load(const std::string& path, const ModelOptions& opt = {});
  static std::unique_ptr<Model> load(const ModelFile& file, const ModelOptions& opt = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return cfg_; }
  const std::string& path() const { return path_; }
  int64_t weight_bytes() const;  // bytes the weights take in memory, as stored
  WeightStorage weight_storage() const { return weight_storage_; }
  int64_t memory_limit_bytes() const { return memory_limit_; }  // the budget the checks use

  struct Weights;  // defined in src/model/weights.h
  const Weights& weights() const { return *w_; }

  // The key calibration of every layer's 8-bit KV caches (KeyCalibration, kv_cache.h): each KV head's mean and
  // channel factors sqrt(max |k - mean|) of the post-RoPE keys of a full-attention prefill of
  // kKeyCalibrationTokens tokens from a fixed generator (fewer when the model's context is shorter): the same
  // for every session of the model. Computed on first use (that prefill: seconds on a small model), then kept;
  // thread-safe.
  static constexpr int64_t kKeyCalibrationTokens = 2048;
  const std::vector<KeyCalibration>& key_calibration() const;
  // Installs a key calibration computed earlier (one per layer, of this model's shape; the on-disk store,
  // key_calibration_store.h) in place of computing it. false when key_calibration() already has one; throws
  // Error for another shape or a factor that is not > 0.
  bool adopt_key_calibration(std::vector<KeyCalibration> calibration) const;

 private:
  Model() = default;
  ModelConfig cfg_;
  std::string path_;
  int64_t memory_limit_ = 0;
  WeightStorage weight_storage_ = WeightStorage::kBlocks;
  std::unique_ptr<Weights> w_;
  mutable std::once_flag key_calibration_once_;
  mutable std::vector<KeyCalibration> key_calibration_;
};

struct SessionOptions {
  AttentionConfig attention;      // decode attention method and its parameters
  DType kv_dtype = DType::kF32;   // KV cache storage (f32 or bf16)
  int prefill_chunk = 512;        // tokens per prefill block (bounds activation memory)
  int64_t max_context = 0;        // tokens this session will hold (prompt + generated); 0 = the model's max
  // CUDA runner: last_stats() counts the tokens the device attended exactly (retro's per-head list lengths,
  // read back with a synchronisation per layer after each decode; eval and benchmarks) instead of the
  // host-side bound (no extra synchronisation; generation). The CPU runner always counts exactly.
  bool exact_attention_stats = false;
  // Records retro's retrieval clusters of every decode step, layer and KV head (retroinfer/cluster_trace.h;
  // `generate --record-trace`); nullptr: none. The CUDA runner reads the ids back at the next step (a small
  // device-to-host copy per retro layer and step). A fork() does not record.
  std::shared_ptr<ClusterTraceWriter> cluster_trace;
  KvPlacementOptions kv_placement;  // CUDA runner: where the KV lives (sequence_session.h); CPU: kAuto only
};

// Evaluation hook, called by Session::decode for every layer right after its attention method ran:
// kv: that layer's cache (the current token already appended); q: [num_heads_q, head_dim] f32 post-RoPE;
// out: [num_heads_q, head_dim] f32, the method's attention output. Must not keep the pointers.
using AttentionObserver = std::function<void(int layer, const KvCache& kv, const float* q, const float* out)>;

// One sequence: its KV cache and attention method per layer. Not thread-safe (one caller at a time);
// the forward passes parallelise internally (OpenMP, OpenBLAS).
class Session final : public SequenceSession {
 public:
  // Checks max_context against the model and estimate_memory against the model's budget (the weights
  // are already allocated, so only KV + activations count against what is left); throws Error otherwise.
  Session(const Model& model, const SessionOptions& opt);
  ~Session();

  // Runs the prompt through the model in chunks, writing post-RoPE K/V into the caches, then calls
  // on_prefill(kv) of every layer's attention method. Only once per session, before any decode.
  // logits: [n, vocab] for every position when all_logits, else [vocab] of the last position.
  std::vector<float> prefill(std::span<const int32_t> tokens, bool all_logits = false,
                             const PrefillProgress& progress = {}) override;
  // Stepped prefill (SequenceSession): prefill's chunks, whole chunks per step (at least one), the same
  // forward passes as prefill(tokens).
  void begin_prefill(std::span<const int32_t> tokens, const PrefillProgress& progress = {}) override;
  bool prefill_step(int64_t max_tokens) override;
  // Prefix reuse (SequenceSession): the prefix's K/V appended to the caches; prefill then runs the rest in
  // chunks aligned to the cold prefill's (the first ends where a cold prefill's chunk ends), so each chunk's
  // rows are the same forward passes as a cold prefill's.
  void load_prefix(const KvPrefix& prefix) override;
  KvBlock export_kv(int64_t from, int64_t to) const override;
  bool supports_prefix() const override { return true; }
  // One decode step: feeds `token` at position position(), appends its K/V, runs the attention method.
  // logits: [vocab] written.
  void decode(int32_t token, std::span<float> logits) override;
  // One decode step of several sequences at once (continuous batching): feeds tokens[i] to sessions[i] at
  // its own position. The matmuls (QKV, O, MLP, LM head) run once over the n rows, so every weight is read
  // once for all sequences; RoPE (each session's own table and position), the KV append, the attention
  // method (each session's own: methods may differ), last_stats() and the observer stay per session.
  // Each row's logits equal what decode() of that session alone would give (same per-row dot products).
  // logits: [n, vocab] written, row i for sessions[i]. Throws Error, before any session changes, for
  // empty spans, size mismatches, a null or repeated session, sessions of different Models, a full
  // context, an out-of-vocabulary token. The caller owns every session for the call (one caller at a time).
  static void decode_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                           std::span<float> logits);

  // A new session over a copy of this one's KV caches with another attention config, its methods'
  // on_prefill already called (so one dense prefill can serve several decode methods). Needs a prefilled
  // session; checks memory like the constructor.
  std::unique_ptr<Session> fork(const AttentionConfig& attention) const;
  std::unique_ptr<SequenceSession> fork_session(const AttentionConfig& attention) const override {
    return fork(attention);
  }
  // Evaluation hook (additive): observer of every layer's decode attention (empty: none).
  void set_attention_observer(AttentionObserver observer) { observer_ = std::move(observer); }

  int64_t position() const override { return pos_; }  // tokens in the cache
  // Attention statistics of the last decode step, summed over layers.
  const AttentionStats& last_stats() const override { return last_stats_; }
  const Model& model() const { return model_; }
  const SessionOptions& options() const { return opt_; }
  int64_t max_context() const override { return max_context_; }
  const ModelConfig& model_config() const override;
  const AttentionConfig& attention_config() const override { return opt_.attention; }
  Device device() const override { return Device::kCpu; }
  const KvCache& kv(int layer) const;
  // Empty also for a method other than retro, a prompt too short to index, or a fork after decode steps (the
  // kept queries are then not the cache's last).
  std::vector<double> layer_budget_multipliers() const override { return layer_multipliers_; }

 private:
  struct Scratch;
  // Forward of n tokens at positions [pos_, pos_ + n): appends their K/V to every layer's cache and writes
  // the logits of rows [keep_from, n) to logits ([n - keep_from, vocab]). rope_seq_len: the sequence length
  // the RoPE frequencies are computed for (only `dynamic` uses it). decode: attention through the method.
  void forward(const int32_t* tokens, int64_t n, int64_t rope_seq_len, bool decode, int64_t keep_from,
               float* logits);
  // A new prompt of these tokens may start (no stepped prefill in progress, not prefilled, non-empty, within
  // max_context; throws Error otherwise), and the caches are reserved for it.
  void ready_for_prompt(std::span<const int32_t> tokens);
  // (Re)computes the RoPE frequencies for rope_seq_len when they depend on it (`dynamic`) or are unset.
  void ensure_rope(int64_t rope_seq_len);
  // Decode attention of one layer for this session's token (q [hq, d] post-RoPE -> out [hq, d]), its K/V
  // already appended: the method, last_stats_, the observer.
  void decode_attention(int layer, const float* q, float* out);
  // Keeps the last rows of a prefill chunk's queries of layer l (q: [n, hq, d]) for the budget calibration.
  void keep_prompt_queries(int layer, const float* q, int64_t n);
  // The prompt is in the caches: every method's on_prefill, then the retrieval budgets by layer.
  void index_prompt();

  const Model& model_;
  SessionOptions opt_;
  int64_t pos_ = 0;
  int64_t max_context_ = 0;
  bool prefilled_ = false;
  std::vector<int32_t> prefix_tokens_;  // tokens of a loaded prefix (load_prefix) not yet prefilled past
  AttentionStats last_stats_;
  std::vector<KvCache> kv_;                              // [num_layers]
  std::vector<std::unique_ptr<AttentionMethod>> attn_;   // [num_layers]
  // The queries of the prompt's last tokens per layer ([rows, hq, d] each, rows <= max(layer_budget_queries,
  // kPromptQueriesKept)), ending at position prompt_queries_end_; a fork calibrates its budgets from them.
  std::vector<std::vector<float>> prompt_queries_;
  int64_t prompt_queries_end_ = -1;
  std::vector<double> layer_multipliers_;
  std::unique_ptr<Scratch> s_;
  AttentionObserver observer_;
};

}  // namespace retroinfer
