#include "io/gguf_names.h"

#include <charconv>

#include "retroinfer/error.h"

namespace retroinfer::io {

namespace {

struct NamePair {
  std::string_view gguf, hf;
};
// Per-block names ("blk.N." + gguf -> "model.layers.N." + hf); the suffix (.weight / .bias) is kept.
constexpr NamePair kBlockNames[] = {
    {"attn_q", "self_attn.q_proj"},        {"attn_k", "self_attn.k_proj"},
    {"attn_v", "self_attn.v_proj"},        {"attn_output", "self_attn.o_proj"},
    {"ffn_gate", "mlp.gate_proj"},         {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},         {"attn_norm", "input_layernorm"},
    {"ffn_norm", "post_attention_layernorm"},
};
constexpr NamePair kGlobalNames[] = {
    {"token_embd", "model.embed_tokens"},
    {"output_norm", "model.norm"},
    {"output", "lm_head"},
};

}  // namespace

std::optional<std::string> gguf_to_hf_name(std::string_view name) {
  std::string_view suffix;
  for (std::string_view s : {std::string_view(".weight"), std::string_view(".bias")}) {
    if (name.size() > s.size() && name.substr(name.size() - s.size()) == s) suffix = s;
  }
  if (suffix.empty()) return std::nullopt;
  std::string_view stem = name.substr(0, name.size() - suffix.size());
  if (stem.substr(0, 4) == "blk.") {
    stem.remove_prefix(4);
    const size_t dot = stem.find('.');
    if (dot == std::string_view::npos || dot == 0 || dot > 6) return std::nullopt;
    int layer = 0;
    const auto [p, ec] = std::from_chars(stem.data(), stem.data() + dot, layer);
    if (ec != std::errc() || p != stem.data() + dot || layer < 0) return std::nullopt;
    const std::string_view rest = stem.substr(dot + 1);
    for (const NamePair& n : kBlockNames)
      if (rest == n.gguf)
        return "model.layers." + std::to_string(layer) + "." + std::string(n.hf) + std::string(suffix);
    return std::nullopt;
  }
  for (const NamePair& n : kGlobalNames)
    if (stem == n.gguf) return std::string(n.hf) + std::string(suffix);
  return std::nullopt;
}

std::vector<int64_t> gguf_permute_rows(int64_t rows, int64_t n_head) {
  RETROINFER_CHECK(n_head > 0 && rows % (2 * n_head) == 0, "q/k permutation: ", rows,
                   " rows do not split into ", n_head, " heads of an even head_dim");
  const int64_t head_dim = rows / n_head, half = head_dim / 2;
  std::vector<int64_t> src(static_cast<size_t>(rows));
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j) src[h * head_dim + 2 * i + j] = h * head_dim + j * half + i;
  return src;
}

std::vector<int64_t> gguf_unpermute_rows(int64_t rows, int64_t n_head) {
  const std::vector<int64_t> fwd = gguf_permute_rows(rows, n_head);  // gguf[r] = hf[fwd[r]]
  std::vector<int64_t> inv(fwd.size());                              // hf[r] = gguf[inv[r]]
  for (size_t r = 0; r < fwd.size(); ++r) inv[static_cast<size_t>(fwd[r])] = static_cast<int64_t>(r);
  return inv;
}

}  // namespace retroinfer::io
