// A prefix cache across requests (docs/prefix-cache.md): the K/V of prompts already prefilled, kept in
// fixed-size token blocks keyed by a hash chain (block i's key hashes block i-1's key and block i's tokens,
// as vLLM's automatic prefix caching does), so that a request whose prompt starts with cached blocks copies
// their K/V into its session and prefills only the rest. The session then builds its attention method's index
// over the whole context (SequenceSession::load_prefix), so a hit generates the tokens a cold prefill does.
//
// Capacity: host bytes of K/V; least recently used blocks go first, the deepest blocks of a chain before their
// parents (a lookup touches a chain from its end to its start). A block is referenced by every lookup that
// returned it until that lease ends (shared ownership); eviction skips referenced and pinned blocks (a
// preloaded snapshot's), so a request never loses the blocks it is loading.
//
// Threading contract: every member may be called from any number of threads at once (one mutex).
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <span>
#include <unordered_map>
#include <vector>

#include "retroinfer/dtype.h"
#include "retroinfer/model_config.h"
#include "retroinfer/sequence_session.h"

namespace retroinfer {

struct PrefixCacheOptions {
  int block_tokens = 256;      // tokens per block (>= 1); a prompt reuses whole blocks only
  int64_t capacity_bytes = 0;  // host bytes of K/V the cache may hold (> 0)
};

struct PrefixCacheStats {
  int64_t lookups = 0;        // prompts looked up
  int64_t hits = 0;           // of those, prompts that reused at least one block
  int64_t lookup_tokens = 0;  // tokens of the prompts looked up
  int64_t hit_tokens = 0;     // tokens reused (not prefilled)
  int64_t inserted_blocks = 0, evicted_blocks = 0;
  int64_t blocks = 0, bytes = 0, pinned_blocks = 0;  // held now
  // hit_tokens / lookup_tokens: the share of prompt tokens that were not prefilled; -1 before any lookup.
  double hit_ratio() const { return lookup_tokens > 0 ? double(hit_tokens) / double(lookup_tokens) : -1.0; }
};

// The part of the cache key that is not the tokens: the K/V a session writes for given tokens depends on the
// model (one cache per model) and on the KV storage dtype. `dynamic` RoPE makes every key depend on the prompt's
// length, so no prefix of such a model is reusable: prefix_cache_applies is false for it.
bool prefix_cache_applies(const ModelConfig& cfg);
uint64_t prefix_cache_salt(DType kv_dtype);

class PrefixCache {
 public:
  // Throws Error for block_tokens < 1 or capacity_bytes < 1.
  explicit PrefixCache(const PrefixCacheOptions& opt);
  const PrefixCacheOptions& options() const { return opt_; }

  // The longest run of cached blocks that starts `tokens`, at most tokens.size() - 1 tokens (the prompt's last
  // token is always prefilled: it gives the first token's logits). Holding the returned prefix references its
  // blocks (never evicted while held). Counts a lookup (and a hit when the prefix is not empty).
  KvPrefix lookup(std::span<const int32_t> tokens, uint64_t salt);
  // Adds the whole blocks of `tokens` not cached yet; K/V of position range [i * block, (i + 1) * block) comes
  // from block(i_start, i_end) (a session's export_kv). Least recently used unreferenced blocks are evicted
  // to make room; a block that does not fit even then is not added (nor any after it). pinned: never evicted.
  using BlockSource = std::function<KvBlock(int64_t from, int64_t to)>;
  void insert(std::span<const int32_t> tokens, uint64_t salt, const BlockSource& source, bool pinned = false);
  PrefixCacheStats stats() const;

 private:
  struct Entry {
    std::shared_ptr<const KvBlock> block;
    std::vector<int32_t> tokens;  // the block's tokens (a hash collision is then a miss, not wrong K/V)
    uint64_t parent = 0;
    bool pinned = false;
    std::list<uint64_t>::iterator lru;
  };
  int64_t block_bytes(const KvBlock& b) const { return static_cast<int64_t>(b.bytes.size()); }
  bool make_room(int64_t bytes);  // evicts from the LRU end; false when it cannot free enough
  const PrefixCacheOptions opt_;
  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Entry> map_;
  std::list<uint64_t> lru_;  // most recent first
  PrefixCacheStats stats_;
};

// Positions [from, to) of a block, as a block of their own (a snapshot's context cut into cache blocks).
KvBlock slice_kv(const KvBlock& b, int64_t from, int64_t to);
// The part of `context` that a session prefilling `prompt` may load: the whole context when the prompt continues
// it (starts with its tokens and is longer), its first prompt.size() - 1 tokens when the prompt is the context
// itself (the last token is prefilled for its logits). Throws Error otherwise, saying where the prompt differs.
KvPrefix context_prefix_for(const KvPrefix& context, std::span<const int32_t> prompt);
// The part of `prefix` a session with attention `attention` may load before prefilling a prompt of
// prompt_tokens tokens: all of it, except for retro with retrieval budgets by layer (layer_budget_queries = Q > 0)
// when fewer than Q prompt tokens would be left to prefill. The budgets calibrate from the queries of the prompt's
// last Q tokens, which only a prefill computes: the prefix is then cut to at most prompt_tokens - Q tokens,
// rounded down to a multiple of prefill_chunk (when > 0) so that the prefill's chunks, and with them its K/V and
// queries, are a cold prefill's; the cut tokens are prefilled again. A session loading the result calibrates to
// the multiples of a cold prefill.
KvPrefix calibration_safe_prefix(const KvPrefix& prefix, int64_t prompt_tokens, const AttentionConfig& attention,
                                 int prefill_chunk);
// Adds a context's whole blocks to the cache, pinned (never evicted: `serve --preload`). Throws Error when the
// cache has no room for them.
void preload_context(PrefixCache& cache, const KvPrefix& context, DType kv_dtype);

// The engine's use of a cache for one request on a fresh session (generate, the batch scheduler, the CLI):
// reuse_prefix loads the longest cached prefix of `prompt` into `session` (load_prefix) and returns its length
// (0: none, or the model's RoPE is `dynamic`); remember_prefix adds the prompt's blocks from the session once
// it is prefilled, those within the prefill's whole chunks of prefill_chunk tokens (the rows of the last,
// partial chunk attend to fewer keys than a longer prompt's prefill does there, so their K/V differs in the
// last bits): a hit then gives the logits of a cold prefill bit for bit. reuse_prefix loads the hit through
// calibration_safe_prefix (prefill_chunk: the session's prefill chunk, 0 when unknown). Both throw the session's
// Error on a runner without prefix reuse.
int64_t reuse_prefix(PrefixCache& cache, SequenceSession& session, std::span<const int32_t> prompt, DType kv_dtype,
                     int prefill_chunk);
void remember_prefix(PrefixCache& cache, const SequenceSession& session, std::span<const int32_t> prompt,
                     DType kv_dtype, int prefill_chunk);

}  // namespace retroinfer
