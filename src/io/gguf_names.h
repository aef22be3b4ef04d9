// GGUF (llama.cpp) tensor names <-> Hugging Face names, and the q/k row permutation of llama.cpp's
// converter. Internal to src/io; see docs/formats.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace retroinfer::io {

// "blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight", "token_embd.weight" ->
// "model.embed_tokens.weight", ...; nullopt for names without an HF counterpart.
std::optional<std::string> gguf_to_hf_name(std::string_view gguf_name);

// llama.cpp's converter (LlamaModel.permute) reorders the rows of q_proj (n_head = heads_q) and k_proj
// (n_head = heads_kv): within each head of head_dim = 2 * half rows, HF row (j * half + i) moves to GGUF
// row (2 * i + j), i < half, j in {0, 1}, so ggml's interleaved (GPT-J style) RoPE sees the pairs
// (x[i], x[i + half]) of HF's rotate-half RoPE as adjacent elements.
// Returns src_row with hf_row[r] = gguf_row[src_row[r]] for rows = n_head * head_dim.
std::vector<int64_t> gguf_unpermute_rows(int64_t rows, int64_t n_head);
// The forward permutation (what the converter did): gguf_row[r] = hf_row[result[r]]. For tests.
std::vector<int64_t> gguf_permute_rows(int64_t rows, int64_t n_head);

}  // namespace retroinfer::io
