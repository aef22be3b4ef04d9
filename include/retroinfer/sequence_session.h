// One sequence's prefill + decode behind one interface, whatever runs it: the CPU runner (Session,
// model.h) or the CUDA runner (cuda::CudaSequenceSession, cuda_model.h). Generation (generate.h), the
// accuracy harness (`retroinfer eval`) and the benchmarks take this interface, so `--device cpu|cuda`
// chooses the implementation and nothing else changes.
//
// Threading contract: one caller at a time per object.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "retroinfer/attention.h"
#include "retroinfer/dtype.h"
#include "retroinfer/model_config.h"
#include "retroinfer/session_planner.h"
#include "retroinfer/wave_buffer.h"

namespace retroinfer {

// Called during prefill after every chunk: (tokens done, tokens total).
using PrefillProgress = std::function<void(int64_t done, int64_t total)>;

enum class Device : uint8_t { kCpu, kCuda };
std::string_view device_name(Device d);   // "cpu" | "cuda"
Device parse_device(std::string_view s);  // "cpu" | "cuda" (throws Error otherwise)

class SequenceSession;

// A copy of a KvBlock's bytes that a runner keeps in its own memory: the CUDA runner's GPU tier of the prefix
// cache (docs/prefix-cache.md) gives the blocks it exports a device copy, so that loading them again is a copy
// inside GPU memory instead of one over PCIe. Owned by the block (freed with it); the runner may drop its memory
// earlier to make room, and then loads the block from its host bytes.
class KvBlockCopy {
 public:
  virtual ~KvBlockCopy() = default;
};

// The CUDA runner's prefix GPU tier (its KvBlockCopy objects) in numbers: EngineModel::prefix_gpu_tier_stats,
// the server's /metrics.
struct PrefixGpuTierStats {
  int64_t capacity_bytes = 0, held_bytes = 0, copies = 0;  // now
  int64_t made = 0, dropped = 0;    // copies made; dropped to make room (their blocks then load from host memory)
  int64_t loaded = 0, relayed = 0;  // blocks loads took from device copies / from host memory (over PCIe)
};

// K/V rows of every layer for a run of consecutive positions, in the KV cache's storage dtype (post-RoPE, as
// the cache holds them): one block of a prefix cache (prefix_cache.h) or a snapshot's context (snapshot.h).
struct KvBlock {
  int num_layers = 0, num_heads_kv = 0, head_dim = 0;
  DType dtype = DType::kF32;  // the sessions' kv_dtype (f32, bf16, int8 or fp8)
  int64_t tokens = 0;
  // [layer][0 = keys, 1 = values][kv head][token] rows of row_bytes() (KvCache's stored rows).
  std::vector<uint8_t> bytes;
  // The same bytes in a runner's memory (KvBlockCopy), or null: `bytes` stays the block's content either way.
  std::shared_ptr<const KvBlockCopy> device_copy;
  int64_t row_bytes() const { return stored_row_bytes(dtype, head_dim); }
  // Bytes of one (layer, K or V, head) run of `tokens` rows.
  int64_t run_bytes() const { return tokens * row_bytes(); }
  const uint8_t* run(int layer, int kv, int head) const {
    return bytes.data() + ((static_cast<int64_t>(layer) * 2 + kv) * num_heads_kv + head) * run_bytes();
  }
  uint8_t* run(int layer, int kv, int head) {
    return bytes.data() + ((static_cast<int64_t>(layer) * 2 + kv) * num_heads_kv + head) * run_bytes();
  }
};

// A context prefilled before: its tokens and their K/V, as consecutive blocks from position 0. A session
// that loads it (SequenceSession::load_prefix) prefills only the prompt's tokens after it.
struct KvPrefix {
  std::vector<int32_t> tokens;                          // the prefix's tokens (sum of the blocks' tokens)
  std::vector<std::shared_ptr<const KvBlock>> blocks;   // in position order
  int64_t size() const { return static_cast<int64_t>(tokens.size()); }
};

// Where the CUDA runner keeps a session's KV (KvPlacement, session_planner.h: the plan resolves kAuto to the
// GPU when it fits, else a GPU / host split, else refuses with the numbers) and the wave buffer of its
// host-tier layers (retro only; wave-buffer.md). The CPU runner keeps its whole KV cache in host memory and
// takes kAuto only (validate_kv_placement, engine_model.h).
struct KvPlacementOptions {
  KvPlacement placement = KvPlacement::kAuto;
  int gpu_layers = -1;  // kSplit: the first gpu_layers layers on the GPU (-1: as many as fit); others: -1
  // Host-tier layers' GPU block cache: ceil(cache_fraction * tokens / page_tokens) pages per flat head.
  double cache_fraction = WaveBufferConfig{}.cache_fraction;
  // Tokens per block-cache page; 0 = the retro cluster size capped at WaveBufferConfig's 8 (a cluster takes
  // whole pages, so 8-token pages under 2-token clusters hold a quarter of the tokens the cache fraction
  // pays for: with Qwen2.5-Coder's 32K traces, 0.44 hits at 5% with 8-token pages, 0.78 with 2-token ones).
  int page_tokens = 0;
  // Host-tier layers' store: bf16, or int8 with one scale per token row (half the PCIe bytes per miss).
  StoreDtype host_store = WaveBufferConfig{}.store_dtype;
  int64_t gpu_memory_limit = 0;   // bytes the session may use on the GPU; 0 = free memory minus a reserve
  int64_t host_memory_limit = 0;  // pinned host bytes; 0 = a share of MemAvailable (kHostUsableFraction)
};

// hits / (hits + misses) of the block cache's retrieval clusters; -1 before any retrieval.
inline double block_cache_hit_ratio(uint64_t hits, uint64_t misses) {
  return hits + misses > 0 ? double(hits) / double(hits + misses) : -1.0;
}

// Where a session keeps its KV and what its host tier moved (SequenceSession::kv_placement_report).
struct KvPlacementReport {
  KvPlacement placement = KvPlacement::kGpu;  // resolved: kGpu, kSplit or kHost
  int gpu_layers = 0, host_layers = 0;
  // Host tier only (host_layers > 0). Retrieval clusters of the host-tier layers served from the GPU block
  // cache (hits) or read from the host store (misses): the cache managers' totals since prefill, summed over
  // layers and KV heads.
  uint64_t cache_hits = 0, cache_misses = 0;
  StoreDtype host_store = StoreDtype::kBf16;  // the host store's element type
  // PCIe bytes of the misses: rows read from the host store x its bytes per row (K and V: 4 x head_dim in
  // bf16, 2 x head_dim + 8 in int8), of the last decode step and summed over the decode steps since prefill.
  int64_t step_pcie_bytes = 0;
  int64_t pcie_bytes = 0;
  int64_t decode_steps = 0;  // the steps pcie_bytes sums
  double cache_hit_ratio() const { return block_cache_hit_ratio(cache_hits, cache_misses); }
};

// One decode step of several sessions in one call, every weight read once for all of them (continuous
// batching across sessions that joined at different times and hold different positions): the batch
// scheduler's path for sessions that are not CPU sessions (those batch through Session::decode_batch).
// Made by a session (SequenceSession::make_joined_decode); takes the sessions whose join_key() is key().
class JoinedDecode {
 public:
  virtual ~JoinedDecode() = default;
  virtual const void* key() const = 0;
  // tokens [n] (one per session), logits [n, vocab]: each session advances as decode(tokens[i]) advances it,
  // its logits equal to that call's up to the products' summation order. Throws Error for a session it does
  // not take, a duplicate, a full session or a token outside the vocabulary (checked before any work); a
  // failure after that fails the step of every session in it.
  virtual void decode(std::span<SequenceSession* const> sessions, std::span<const int32_t> tokens,
                      std::span<float> logits) = 0;
};

class SequenceSession {
 public:
  virtual ~SequenceSession() = default;

  // Runs the prompt (once, before any decode) and builds the attention method's index.
  // Returns logits [n, vocab] for every position when all_logits, else [vocab] of the last position.
  virtual std::vector<float> prefill(std::span<const int32_t> tokens, bool all_logits = false,
                                     const PrefillProgress& progress = {}) = 0;
  // One decode step at position(): appends `token`, writes logits [vocab].
  virtual void decode(int32_t token, std::span<float> logits) = 0;
  // A new session over a copy of this prefilled one's KV with another attention config (index built).
  virtual std::unique_ptr<SequenceSession> fork_session(const AttentionConfig& attention) const = 0;

  virtual int64_t position() const = 0;      // tokens in the cache
  virtual int64_t max_context() const = 0;   // tokens this session may hold
  virtual const ModelConfig& model_config() const = 0;
  virtual const AttentionConfig& attention_config() const = 0;
  // Attention statistics of the last decode step, summed over layers.
  virtual const AttentionStats& last_stats() const = 0;
  virtual Device device() const = 0;
  // Where the KV lives and, with a host tier, the block cache's hits and the PCIe bytes of its misses.
  // Default: nullopt (the CPU runner: the KV cache is in host memory, no tiers). The CUDA session reports its
  // plan's placement; reading the host tier's counters synchronises with the device.
  virtual std::optional<KvPlacementReport> kv_placement_report() { return std::nullopt; }
  // The retrieval multiple of each layer the last prefill's budget calibration chose
  // (AttentionConfig::layer_budget_queries; docs/wave-index.md, "Retrieval budgets by layer"); empty when every
  // layer keeps the nominal budget.
  virtual std::vector<double> layer_budget_multipliers() const { return {}; }

  // Prefix reuse (prefix_cache.h, snapshot.h; docs/prefix-cache.md). load_prefix, on a fresh session (nothing
  // prefilled, no stepped prefill): its KV caches take the prefix's K/V and position() becomes prefix.size();
  // the next prefill(tokens) / begin_prefill(tokens) then needs tokens to start with prefix.tokens and to be
  // longer, runs the model over the rest only, and builds every layer's index over the whole context (the
  // methods' on_prefill), so the session ends in the state a cold prefill of `tokens` leaves (prefill with
  // all_logits is refused after a prefix). Throws Error when the prefix does not fit the session (layers,
  // heads, head_dim, KV dtype, max_context). export_kv copies positions [from, to) of a prefilled session's
  // KV into one block. Default: both throw Error (a runner without prefix reuse).
  virtual void load_prefix(const KvPrefix& prefix);
  virtual KvBlock export_kv(int64_t from, int64_t to) const;
  // Whether this runner implements load_prefix / export_kv (the CPU runner).
  virtual bool supports_prefix() const { return false; }

  // Continuous batching (JoinedDecode above): sessions with the same non-null join_key() can decode one
  // token each in one make_joined_decode()->decode() call. Default: null (decode alone). The CUDA session: its
  // model when it holds one sequence and is prefilled, whatever its KV placement (host-tier layers join).
  virtual const void* join_key() const { return nullptr; }
  virtual std::unique_ptr<JoinedDecode> make_joined_decode() const { return nullptr; }

  // Prefill in steps, so that a caller can interleave a long prompt with other work (the batch scheduler's
  // prefill_step_tokens):
  //   begin_prefill(tokens, progress)  checks the prompt (non-empty, nothing prefilled or stepping yet) and
  //                                    keeps a copy;
  //   prefill_step(max_tokens)         runs at least one more part of it, at most about max_tokens tokens
  //                                    (>= 1) when the prompt goes on, and returns true once it is done;
  //   take_prefill_logits()            then returns what prefill(tokens) returns ([vocab] of the last
  //                                    position) and ends the stepping.
  // The session is then in the state prefill(tokens) leaves; progress is called as prefill's. The default runs
  // the whole prompt through prefill() in the first step (the CUDA session). The CPU session (Session) runs
  // prefill's own chunks (SessionOptions::prefill_chunk) a few per step: bit-identical to one prefill call.
  // Misuse (a step without begin, a take before the last step, begin twice) throws Error. A step that throws
  // (e.g. a token outside the vocabulary) ends the stepping, as a failed prefill() ends.
  virtual void begin_prefill(std::span<const int32_t> tokens, const PrefillProgress& progress = {});
  virtual bool prefill_step(int64_t max_tokens);
  std::vector<float> take_prefill_logits();
  bool prefill_stepping() const { return steps_.active; }  // between begin_prefill and take_prefill_logits

 protected:
  struct PrefillSteps {
    std::vector<int32_t> tokens;
    PrefillProgress progress;
    std::vector<float> logits;  // [vocab] once done
    int64_t done = 0;           // tokens prefilled so far
    bool active = false, finished = false;
  };
  PrefillSteps steps_;
  // prefill_step's preconditions (a stepping begun and not done, max_tokens >= 1); throws Error.
  void check_prefill_step(int64_t max_tokens) const;
};

}  // namespace retroinfer
