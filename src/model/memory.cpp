// Memory estimates and the memory this process may still use.
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <string>

#include "model/linear.h"
#include "model/prefill_attention.h"
#include "retroinfer/model.h"

namespace retroinfer {

MemoryEstimate estimate_memory(const ModelConfig& c, int64_t context_tokens, DType kv_dtype, int prefill_chunk) {
  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_heads_q, hkv = c.num_heads_kv;
  const int64_t inter = c.intermediate_size, vocab = c.vocab_size, layers = c.num_layers;
  const int64_t qkv = (hq + 2 * hkv) * d;
  const int64_t per_layer = 2 * h + qkv * h + (c.attention_bias ? qkv : 0) + h * hq * d + 3 * inter * h;
  const int64_t params = vocab * h * (c.tie_word_embeddings ? 1 : 2) + h + layers * per_layer;
  MemoryEstimate e;
  e.weight_bytes = params * 4;
  e.kv_bytes = 2 * layers * hkv * stored_row_bytes(kv_dtype, static_cast<int>(d)) * context_tokens;
  const int64_t chunk = std::max<int64_t>(std::min<int64_t>(prefill_chunk, context_tokens), 1);
  // Scratch of one chunk: x, xn, qkv, q, k, v, attention out, gate/up, activation, cos/sin; plus logits.
  // Prefill attention (prefill_attention.h): the group's queries and outputs, their running maxima and sums,
  // a tile of scores per thread (at most one per tile of rows), and f32 copies of a head's keys and values (the
  // BLAS kernel's when the cache stores another type, the fused kernel's packed panels always). Products: one
  // widened tile of block weights (linear.h).
  const int64_t group = hkv > 0 ? hq / hkv : 1;
  const int64_t key_block = std::min<int64_t>(context_tokens, model::kKeyBlock);
  const int64_t row_tile = model::kRowTile;
  const int64_t tile_rows = chunk <= row_tile ? chunk : (chunk + row_tile - 1) / row_tile * row_tile;
  const int64_t widened_kv = 2 * context_tokens * d;
  const int64_t largest_matrix = std::max({qkv * h, h * hq * d, inter * h});
  e.activation_bytes = 4 * (chunk * (2 * h + 2 * qkv + hq * d + 3 * inter + d) + vocab +
                            group * chunk * (2 * d + 2) + group * tile_rows * key_block + widened_kv +
                            std::min(largest_matrix, model::kWidenTileFloats));
  return e;
}

int64_t available_memory_bytes() {
  int64_t avail = -1;
  {
    std::ifstream f("/proc/meminfo");
    std::string key;
    int64_t kb = 0;
    std::string unit;
    while (f >> key >> kb) {
      std::getline(f, unit);
      if (key == "MemAvailable:") {
        avail = kb * 1024;
        break;
      }
    }
  }
  if (avail < 0) {
    const long pages = sysconf(_SC_AVPHYS_PAGES);
    const long page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0) avail = static_cast<int64_t>(pages) * page;
  }
  // cgroup v2 limit, if any ("max" means none).
  std::ifstream cg_max("/sys/fs/cgroup/memory.max"), cg_cur("/sys/fs/cgroup/memory.current");
  std::string lim;
  int64_t cur = 0;
  if (cg_max >> lim && lim != "max" && !lim.empty() &&
      lim.find_first_not_of("0123456789") == std::string::npos && cg_cur >> cur) {
    const int64_t left = std::stoll(lim) - cur;
    if (avail < 0 || left < avail) avail = std::max<int64_t>(left, 0);
  }
  return avail < 0 ? (int64_t{1} << 40) : avail;  // unknown: do not refuse
}

int64_t model_max_context(const ModelConfig& c) {
  if (c.max_position_embeddings <= 0) return INT64_MAX;
  if (c.rope_scaling.type == "dynamic" && c.rope_scaling.factor > 1.0f)
    return static_cast<int64_t>(static_cast<double>(c.max_position_embeddings) * c.rope_scaling.factor);
  return c.max_position_embeddings;
}

}  // namespace retroinfer
