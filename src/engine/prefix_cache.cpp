// The prefix cache's hash chain, LRU and reference counts (include/retroinfer/prefix_cache.h).
#include "retroinfer/prefix_cache.h"

#include <algorithm>

#include "retroinfer/error.h"

namespace retroinfer {
namespace {

// splitmix64's finaliser: mixes one 64-bit word into the chain.
uint64_t mix(uint64_t h, uint64_t x) {
  uint64_t z = h ^ (x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t block_key(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = mix(parent, tokens.size());
  for (int32_t t : tokens) h = mix(h, static_cast<uint32_t>(t));
  return h;
}

}  // namespace

bool prefix_cache_applies(const ModelConfig& cfg) { return cfg.rope_scaling.type != "dynamic"; }

uint64_t prefix_cache_salt(DType kv_dtype) { return mix(0x7265747270726678ULL, static_cast<uint64_t>(kv_dtype)); }

PrefixCache::PrefixCache(const PrefixCacheOptions& opt) : opt_(opt) {
  RETROINFER_CHECK(opt.block_tokens >= 1, "prefix cache: block_tokens must be >= 1, got ", opt.block_tokens,
                   " (--prefix-cache-block)");
  RETROINFER_CHECK(opt.capacity_bytes >= 1, "prefix cache: the capacity must be > 0 bytes, got ",
                   opt.capacity_bytes, " (--prefix-cache-mb)");
}

KvPrefix PrefixCache::lookup(std::span<const int32_t> tokens, uint64_t salt) {
  std::lock_guard<std::mutex> lk(mu_);
  KvPrefix out;
  std::vector<uint64_t> chain;
  const auto n = static_cast<int64_t>(tokens.size()), b = static_cast<int64_t>(opt_.block_tokens);
  uint64_t parent = salt;
  for (int64_t start = 0; start + b <= n - 1; start += b) {
    const auto blk = tokens.subspan(start, b);
    const uint64_t key = block_key(parent, blk);
    const auto it = map_.find(key);
    if (it == map_.end() || it->second.parent != parent || !std::equal(blk.begin(), blk.end(), it->second.tokens.begin()))
      break;
    out.blocks.push_back(it->second.block);
    out.tokens.insert(out.tokens.end(), blk.begin(), blk.end());
    chain.push_back(key);
    parent = key;
  }
  // Touch from the chain's end to its start: the start ends most recent, so the deepest blocks go first.
  for (auto k = chain.rbegin(); k != chain.rend(); ++k) {
    Entry& e = map_.at(*k);
    lru_.splice(lru_.begin(), lru_, e.lru);
  }
  ++stats_.lookups;
  stats_.lookup_tokens += n;
  if (!out.blocks.empty()) {
    ++stats_.hits;
    stats_.hit_tokens += out.size();
  }
  return out;
}

bool PrefixCache::make_room(int64_t bytes) {
  if (bytes > opt_.capacity_bytes) return false;
  auto it = lru_.end();
  while (stats_.bytes + bytes > opt_.capacity_bytes && it != lru_.begin()) {
    --it;
    Entry& e = map_.at(*it);
    if (e.pinned || e.block.use_count() > 1) continue;  // referenced by a lookup in progress, or preloaded
    stats_.bytes -= block_bytes(*e.block);
    --stats_.blocks;
    ++stats_.evicted_blocks;
    map_.erase(*it);
    it = lru_.erase(it);
  }
  return stats_.bytes + bytes <= opt_.capacity_bytes;
}

void PrefixCache::insert(std::span<const int32_t> tokens, uint64_t salt, const BlockSource& source, bool pinned) {
  const auto n = static_cast<int64_t>(tokens.size()), b = static_cast<int64_t>(opt_.block_tokens);
  uint64_t parent = salt;
  std::vector<std::shared_ptr<const KvBlock>> chain;  // referenced: making room never evicts the chain's parents
  std::unique_lock<std::mutex> lk(mu_);
  for (int64_t start = 0; start + b <= n; start += b) {
    const auto blk = tokens.subspan(start, b);
    const uint64_t key = block_key(parent, blk);
    const auto it = map_.find(key);
    if (it != map_.end()) {
      if (it->second.parent != parent || !std::equal(blk.begin(), blk.end(), it->second.tokens.begin()))
        return;  // a hash collision holds the key: the rest of this chain stays uncached
      it->second.pinned = it->second.pinned || pinned;
      chain.push_back(it->second.block);
      parent = key;
      continue;
    }
    // The copy runs outside the lock (it reads the caller's session, not the cache).
    lk.unlock();
    auto block = std::make_shared<const KvBlock>(source(start, start + b));
    lk.lock();
    RETROINFER_CHECK(block->tokens == b, "prefix cache: a block source gave ", block->tokens, " tokens for ", b);
    if (map_.count(key) == 0) {
      if (!make_room(block_bytes(*block))) return;
      chain.push_back(block);
      lru_.push_front(key);
      Entry e{std::move(block), std::vector<int32_t>(blk.begin(), blk.end()), parent, pinned, lru_.begin()};
      stats_.bytes += block_bytes(*e.block);
      ++stats_.blocks;
      ++stats_.inserted_blocks;
      map_.emplace(key, std::move(e));
    }
    parent = key;
  }
}

PrefixCacheStats PrefixCache::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  PrefixCacheStats s = stats_;
  s.pinned_blocks = std::count_if(map_.begin(), map_.end(), [](const auto& kv) { return kv.second.pinned; });
  return s;
}

int64_t reuse_prefix(PrefixCache& cache, SequenceSession& session, std::span<const int32_t> prompt, DType kv_dtype,
                     int prefill_chunk) {
  if (!prefix_cache_applies(session.model_config())) return 0;
  if (!session.supports_prefix()) session.load_prefix(KvPrefix{});  // the runner's Error
  const KvPrefix prefix = calibration_safe_prefix(cache.lookup(prompt, prefix_cache_salt(kv_dtype)),
                                                  static_cast<int64_t>(prompt.size()), session.attention_config(),
                                                  prefill_chunk);
  if (prefix.tokens.empty()) return 0;
  session.load_prefix(prefix);  // copies the K/V: the blocks' references end with `prefix`
  return prefix.size();
}

void remember_prefix(PrefixCache& cache, const SequenceSession& session, std::span<const int32_t> prompt,
                     DType kv_dtype, int prefill_chunk) {
  if (!prefix_cache_applies(session.model_config())) return;
  RETROINFER_CHECK(prefill_chunk >= 1, "prefix cache: prefill_chunk must be >= 1, got ", prefill_chunk);
  // Only positions the prefill ran in whole chunks: their K/V is what any longer prompt's prefill computes
  // there (same chunk, same keys), so a hit is bit for bit a cold prefill. The last partial chunk's rows
  // attend to fewer keys and round differently.
  const size_t whole = prompt.size() / prefill_chunk * prefill_chunk;
  cache.insert(prompt.first(whole), prefix_cache_salt(kv_dtype),
               [&session](int64_t from, int64_t to) { return session.export_kv(from, to); });
}

KvBlock slice_kv(const KvBlock& b, int64_t from, int64_t to) {
  RETROINFER_CHECK(0 <= from && from < to && to <= b.tokens, "prefix cache: slice [", from, ", ", to,
                   ") of a block of ", b.tokens, " tokens");
  KvBlock out = b;
  out.device_copy.reset();  // a runner's copy holds the whole block, not the slice
  out.tokens = to - from;
  out.bytes.assign(2 * static_cast<size_t>(b.num_layers) * b.num_heads_kv * out.run_bytes(), 0);
  for (int l = 0; l < b.num_layers; ++l)
    for (int kv = 0; kv < 2; ++kv)
      for (int h = 0; h < b.num_heads_kv; ++h)
        std::copy_n(b.run(l, kv, h) + from * b.row_bytes(), out.run_bytes(), out.run(l, kv, h));
  return out;
}

namespace {
// The context's K/V as one block (a snapshot's is one already).
std::shared_ptr<const KvBlock> whole_block(const KvPrefix& context) {
  RETROINFER_CHECK(context.blocks.size() == 1 && context.blocks[0] && context.blocks[0]->tokens == context.size(),
                   "prefix cache: a context of one K/V block covering its tokens is needed (a snapshot's)");
  return context.blocks[0];
}
}  // namespace

KvPrefix context_prefix_for(const KvPrefix& context, std::span<const int32_t> prompt) {
  const auto n = context.size(), p = static_cast<int64_t>(prompt.size());
  const auto [ends, _] = std::mismatch(context.tokens.begin(), context.tokens.end(), prompt.begin(), prompt.end());
  const int64_t same = ends - context.tokens.begin();
  RETROINFER_CHECK(same == n, "the prompt does not continue the snapshot's context: they differ at token ", same,
                   " (the context has ", n, " tokens, the prompt ", p, ")");
  if (p > n) return context;
  RETROINFER_CHECK(n >= 2, "the snapshot's context is a single token: nothing to reuse before the last");
  KvPrefix out;
  out.tokens.assign(context.tokens.begin(), context.tokens.end() - 1);
  out.blocks.push_back(std::make_shared<const KvBlock>(slice_kv(*whole_block(context), 0, n - 1)));
  return out;
}

KvPrefix calibration_safe_prefix(const KvPrefix& prefix, int64_t prompt_tokens, const AttentionConfig& attention,
                                 int prefill_chunk) {
  const int64_t q = attention.kind == AttentionKind::kRetro ? attention.layer_budget_queries : 0;
  if (q <= 0 || prefix.size() + q <= prompt_tokens) return prefix;
  int64_t keep = std::max<int64_t>(0, prompt_tokens - q);
  if (prefill_chunk > 0) keep = keep / prefill_chunk * prefill_chunk;
  KvPrefix out;
  if (keep == 0) return out;
  out.tokens.assign(prefix.tokens.begin(), prefix.tokens.begin() + keep);
  int64_t at = 0;
  for (const auto& b : prefix.blocks) {
    if (at >= keep) break;
    out.blocks.push_back(at + b->tokens <= keep ? b : std::make_shared<const KvBlock>(slice_kv(*b, 0, keep - at)));
    at += b->tokens;
  }
  return out;
}

void preload_context(PrefixCache& cache, const KvPrefix& context, DType kv_dtype) {
  const std::shared_ptr<const KvBlock> all = whole_block(context);
  const PrefixCacheStats before = cache.stats();
  cache.insert(context.tokens, prefix_cache_salt(kv_dtype),
               [&all](int64_t from, int64_t to) { return slice_kv(*all, from, to); }, /*pinned=*/true);
  const int64_t whole = context.size() / cache.options().block_tokens;
  const PrefixCacheStats after = cache.stats();
  RETROINFER_CHECK(after.pinned_blocks - before.pinned_blocks >= whole || after.pinned_blocks >= whole,
                   "prefix cache: no room for the ", whole, " blocks (", context.size(), " tokens) of a preloaded "
                   "context in ", cache.options().capacity_bytes >> 20, " MiB (", after.bytes >> 20,
                   " MiB held); raise --prefix-cache-mb");
}

}  // namespace retroinfer
