// Writes seed corpora for the fuzz targets: make_seeds <dir> creates <dir>/gguf, <dir>/safetensors and
// <dir>/config with small valid files (built by the same writers as the unit tests).
#include <filesystem>
#include <iostream>

#include "io_test_files.h"

using namespace retroinfer::testing;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_make_seeds <corpus-dir>\n";
    return 2;
  }
  const std::filesystem::path root = argv[1];
  for (const char* sub : {"gguf", "safetensors", "config"}) std::filesystem::create_directories(root / sub);

  // A 1-layer tiny llama, with q8_0 and q4_1 matrices, as GGUF (llama and qwen2) and safetensors.
  TinyLlama m;
  m.layers = 1;
  m.vocab = 8;
  m.hidden = 32;
  m.ffn = 32;
  m.heads_q = 2;
  m.heads_kv = 1;
  for (int variant = 0; variant < 3; ++variant) {
    TinyLlama v = m;
    v.qwen2 = variant == 2;
    v.tie = variant == 1;
    GgufWriter w;
    const std::string a = v.qwen2 ? "qwen2" : "llama";
    w.kv_str("general.architecture", a);
    w.kv_u32(a + ".block_count", v.layers);
    w.kv_u32(a + ".context_length", 64);
    w.kv_u32(a + ".embedding_length", v.hidden);
    w.kv_u32(a + ".feed_forward_length", v.ffn);
    w.kv_u32(a + ".attention.head_count", v.heads_q);
    w.kv_u32(a + ".attention.head_count_kv", v.heads_kv);
    w.kv_f32(a + ".attention.layer_norm_rms_epsilon", 1e-5f);
    w.kv_u32(a + ".vocab_size", v.vocab);
    w.kv_str_array("tokenizer.ggml.tokens", {"a", "b", "c", "d", "e", "f", "g", "h"});
    SafetensorsWriter s;
    const std::vector<std::pair<std::string, std::string>> names = {
        {"model.embed_tokens.weight", "token_embd.weight"}, {"model.norm.weight", "output_norm.weight"},
        {"lm_head.weight", "output.weight"}};
    for (const auto& [name, sv] : v.weights()) {
      std::string g = name;
      for (const auto& [h, gg] : names)
        if (name == h) g = gg;
      const std::pair<const char*, const char*> layer_names[] = {
          {"self_attn.q_proj", "attn_q"}, {"self_attn.k_proj", "attn_k"}, {"self_attn.v_proj", "attn_v"},
          {"self_attn.o_proj", "attn_output"}, {"mlp.gate_proj", "ffn_gate"}, {"mlp.up_proj", "ffn_up"},
          {"mlp.down_proj", "ffn_down"}, {"input_layernorm", "attn_norm"},
          {"post_attention_layernorm", "ffn_norm"}};
      for (const auto& [h, gg] : layer_names) {
        const std::string pre = "model.layers.0." + std::string(h);
        if (name.rfind(pre, 0) == 0) g = "blk.0." + std::string(gg) + name.substr(pre.size());
      }
      const std::vector<uint64_t> dims(sv.first.rbegin(), sv.first.rend());
      if (sv.first.size() == 2)
        w.tensor(g, dims, variant == 0 ? kGgmlQ8_0 : kGgmlQ4_1, variant == 0 ? quantize_q8_0(sv.second) : quantize_q4_1(sv.second));
      else
        w.tensor(g, dims, kGgmlF32, f32_bytes(sv.second));
      s.tensor(name, "F32", sv.first, f32_bytes(sv.second));
    }
    write_file((root / "gguf" / ("tiny" + std::to_string(variant) + ".gguf")).string(), w.bytes());
    write_file((root / "safetensors" / ("tiny" + std::to_string(variant) + ".safetensors")).string(), s.bytes());
    write_text((root / "config" / ("config" + std::to_string(variant) + ".json")).string(), v.config_json());
  }
  std::cout << "seeds written under " << root << "\n";
  return 0;
}
