// A model's identity and a session's snapshot (include/retroinfer/snapshot.h); the file format is
// snapshot_file.cpp.
#include <algorithm>
#include <sstream>

#include "model/weights.h"
#include "retroinfer/error.h"
#include "retroinfer/prefix_cache.h"
#include "retroinfer/snapshot.h"
#include "retroinfer/tokenizer.h"

namespace retroinfer {
namespace {

uint64_t mix_bytes(uint64_t h, const void* p, size_t n) {
  return snapshot_checksum(p, n) ^ (((h << 23) | (h >> 41)) * 0x9e3779b97f4a7c15ULL);
}

}  // namespace

ModelIdentity model_identity(const Model& model, const Tokenizer* tokenizer) {
  const ModelConfig& c = model.config();
  std::ostringstream d;
  d << c.architecture << ", " << c.num_layers << " layers, hidden " << c.hidden_size << ", " << c.num_heads_q
    << " heads / " << c.num_heads_kv << " KV heads x " << c.head_dim << ", vocab " << c.vocab_size;
  std::ostringstream cfg;
  cfg << d.str() << "|" << c.intermediate_size << "|" << c.rms_norm_eps << "|" << c.rope_theta << "|"
      << c.rope_scaling.type << "|" << c.rope_scaling.factor << "|" << c.max_position_embeddings << "|"
      << c.tie_word_embeddings << c.attention_bias << "|" << c.bos_token_id;
  for (int e : c.eos_token_ids) cfg << "," << e;
  const std::string cs = cfg.str();
  uint64_t h = mix_bytes(0, cs.data(), cs.size());
  // A strided sample of the embedding (at most about 64K values) and the whole final norm.
  // The embedding's values in f32 whatever its storage (WeightMatrix::widen_rows is bit for bit the f32 load).
  const Model::Weights& w = model.weights();
  const size_t cols = static_cast<size_t>(w.embed.cols()), n = static_cast<size_t>(w.embed.rows()) * cols;
  const size_t stride = std::max<size_t>(1, n / 65536);
  std::vector<float> sample, row(cols);
  int64_t widened = -1;
  for (size_t i = 0; i < n; i += stride) {
    const auto r = static_cast<int64_t>(i / cols);
    if (r != widened) w.embed.widen_rows(r, 1, row.data());
    widened = r;
    sample.push_back(row[i % cols]);
  }
  h = mix_bytes(h, sample.data(), sample.size() * sizeof(float));
  h = mix_bytes(h, w.final_norm.data(), w.final_norm.size() * sizeof(float));
  if (tokenizer != nullptr) {
    std::string vocab;
    for (int32_t t = 0; t < tokenizer->vocab_size(); ++t) {
      vocab += tokenizer->token_text(t);
      vocab += '\0';
    }
    h = mix_bytes(h, vocab.data(), vocab.size());
  }
  return ModelIdentity{h, d.str()};
}

Snapshot make_snapshot(const SequenceSession& session, std::span<const int32_t> tokens, const ModelIdentity& model) {
  RETROINFER_CHECK(prefix_cache_applies(session.model_config()), "snapshot: this model's RoPE is `dynamic`: its K/V "
                   "depends on the prompt's length, so a saved context could not be continued");
  RETROINFER_CHECK(!tokens.empty() && static_cast<int64_t>(tokens.size()) <= session.position(),
                   "snapshot: the session holds ", session.position(), " tokens, not the ", tokens.size(), " given");
  Snapshot s;
  s.model = model;
  s.attention = session.attention_config();
  s.context.tokens.assign(tokens.begin(), tokens.end());
  s.context.blocks.push_back(std::make_shared<const KvBlock>(session.export_kv(0, s.context.size())));
  return s;
}

}  // namespace retroinfer
