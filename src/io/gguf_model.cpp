// A GGUF file as a ModelFile: config from metadata, tensors under Hugging Face names and shapes, llama's
// q/k rows restored to Hugging Face order.
#include <algorithm>
#include <cstring>

#include "io/gguf_names.h"
#include "io/gguf_reader.h"
#include "io/model_file_impl.h"
#include "retroinfer/error.h"

namespace retroinfer::io {

namespace {

int to_int(const GgufMetadata& m, const std::string& key, int64_t v) {
  RETROINFER_CHECK(v >= 0 && v <= (int64_t{1} << 30), m.file(), ": GGUF metadata '", key, "' = ", v,
                   " is out of range [0, 2^30]");
  return static_cast<int>(v);
}

const GgufTensor* find_tensor(const GgufContents& g, std::string_view name) {
  for (const GgufTensor& t : g.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

ModelConfig config_from_gguf(const GgufContents& g, const std::string& file) {
  const GgufMetadata& m = g.metadata;
  ModelConfig c;
  c.architecture = m.get_string("general.architecture");
  RETROINFER_CHECK(c.architecture == "llama" || c.architecture == "qwen2", file,
                   ": GGUF metadata 'general.architecture' = '", c.architecture,
                   "' is not supported (supported: llama (also Mistral and SmolLM2), qwen2)");
  const std::string a = c.architecture + ".";
  auto req = [&](const std::string& key) { return to_int(m, key, m.get_int(key)); };
  auto opt = [&](const std::string& key, int dflt) { return m.has(key) ? req(key) : dflt; };
  c.num_layers = req(a + "block_count");
  c.hidden_size = req(a + "embedding_length");
  c.intermediate_size = req(a + "feed_forward_length");
  c.num_heads_q = req(a + "attention.head_count");
  c.num_heads_kv = opt(a + "attention.head_count_kv", c.num_heads_q);
  RETROINFER_CHECK(c.num_heads_q > 0, file, ": GGUF metadata '", a, "attention.head_count' must be positive");
  c.head_dim = opt(a + "attention.key_length", c.hidden_size / c.num_heads_q);
  const int value_dim = opt(a + "attention.value_length", c.head_dim);
  RETROINFER_CHECK(value_dim == c.head_dim, file, ": GGUF metadata '", a, "attention.value_length' = ", value_dim,
                   " differs from the key length ", c.head_dim, " (not supported)");
  const int rope_dim = opt(a + "rope.dimension_count", c.head_dim);
  RETROINFER_CHECK(rope_dim == c.head_dim, file, ": GGUF metadata '", a, "rope.dimension_count' = ", rope_dim,
                   ": partial rotary embeddings (rope dim != head_dim ", c.head_dim, ") are not supported");
  c.rms_norm_eps = static_cast<float>(m.get_float(a + "attention.layer_norm_rms_epsilon"));
  c.rope_theta = static_cast<float>(m.get_float_or(a + "rope.freq_base", 10000.0));
  c.max_position_embeddings = opt(a + "context_length", 0);
  if (m.has(a + "vocab_size")) {
    c.vocab_size = req(a + "vocab_size");
  } else if (const GgufValue* toks = m.find("tokenizer.ggml.tokens")) {
    c.vocab_size = static_cast<int>(m.get_string_array("tokenizer.ggml.tokens").size());
    (void)toks;
  } else if (const GgufTensor* e = find_tensor(g, "token_embd.weight")) {
    c.vocab_size = static_cast<int>(std::min<int64_t>(e->dims.back(), int64_t{1} << 30));
  }

  // RoPE scaling (llama.cpp keys). llama3-style scaling is stored as a rope_freqs tensor instead.
  RETROINFER_CHECK(find_tensor(g, "rope_freqs.weight") == nullptr, file,
                   ": tensor 'rope_freqs.weight' (llama3 rope scaling baked into per-frequency factors) is not "
                   "supported yet; use the Hugging Face safetensors checkpoint of this model");
  std::string type = m.get_string_or(a + "rope.scaling.type", "none");
  float factor = static_cast<float>(m.get_float_or(a + "rope.scaling.factor", 0.0));
  if (m.has(a + "rope.scale_linear")) {  // older files
    type = "linear";
    factor = static_cast<float>(m.get_float(a + "rope.scale_linear"));
  }
  if (type == "linear" || type == "yarn") {
    c.rope_scaling.type = type;
    c.rope_scaling.factor = factor;
    c.rope_scaling.original_max_position =
        opt(a + "rope.scaling.original_context_length", c.max_position_embeddings);
    if (type == "yarn") {
      c.rope_scaling.attention_factor = static_cast<float>(m.get_float_or(a + "rope.scaling.attn_factor", 0.0));
      c.rope_scaling.beta_fast = static_cast<float>(m.get_float_or(a + "rope.scaling.yarn_beta_fast", 32.0));
      c.rope_scaling.beta_slow = static_cast<float>(m.get_float_or(a + "rope.scaling.yarn_beta_slow", 1.0));
    }
  } else {
    RETROINFER_CHECK(type == "none", file, ": GGUF metadata '", a, "rope.scaling.type' = '", type,
                     "' is not supported (none, linear, yarn)");
  }

  c.bos_token_id = m.has("tokenizer.ggml.bos_token_id") ? req("tokenizer.ggml.bos_token_id") : -1;
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"}) {
    if (!m.has(key)) continue;
    const int id = req(key);
    if (std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
      c.eos_token_ids.push_back(id);
  }
  c.tie_word_embeddings = find_tensor(g, "output.weight") == nullptr;
  c.attention_bias = find_tensor(g, "blk.0.attn_q.bias") != nullptr;
  try {
    validate(c);
  } catch (const Error& e) {
    RETROINFER_FAIL(file, ": ", e.what());
  }
  return c;
}

}  // namespace

std::unique_ptr<ModelFile> open_gguf_model(const std::string& path) {
  auto file = std::make_shared<MappedFile>(path);
  GgufContents g = parse_gguf(file->data(), file->size(), path);
  auto model = std::make_unique<LoadedModel>(path);
  model->keep(file);
  const ModelConfig& c = model->mutable_config() = config_from_gguf(g, path);
  // llama.cpp permutes q/k rows only for the llama architecture (qwen2 uses NeoX-style RoPE as stored).
  const bool permuted = c.architecture == "llama";

  for (GgufTensor& gt : g.tensors) {
    TensorInfo t;
    t.name = gguf_to_hf_name(gt.name).value_or(gt.name);  // unmapped names stay as in the file
    t.type = gt.type;
    t.shape.assign(gt.dims.rbegin(), gt.dims.rend());  // ggml lists dims innermost first
    t.data = gt.data;
    t.nbytes = gt.nbytes;
    const bool is_q = t.name.find(".self_attn.q_proj.") != std::string::npos;
    const bool is_k = t.name.find(".self_attn.k_proj.") != std::string::npos;
    const int64_t n_head = is_q ? c.num_heads_q : c.num_heads_kv;
    // A wrong shape is reported by check_required_tensors below; reorder only what has the expected rows.
    if (permuted && (is_q || is_k) && t.shape[0] == n_head * c.head_dim &&
        (t.shape.size() == 2 || weight_type_block_elems(t.type) == 1)) {
      const int64_t rows = t.shape[0];
      const size_t row_bytes = t.nbytes / static_cast<size_t>(rows);
      const std::vector<int64_t> src = gguf_unpermute_rows(rows, n_head);
      std::vector<uint8_t> out(t.nbytes);
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(out.data() + r * row_bytes, t.data + src[static_cast<size_t>(r)] * row_bytes, row_bytes);
      t.data = model->own(std::move(out));
    }
    model->add(std::move(t), path);
  }
  model->set_gguf(std::move(g.metadata));
  check_required_tensors(*model, path);
  return model;
}

}  // namespace retroinfer::io
