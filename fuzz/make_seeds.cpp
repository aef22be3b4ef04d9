// Writes seed corpora for the fuzz targets: make_seeds <dir> creates <dir>/gguf, <dir>/safetensors and
// <dir>/config with small valid files (built by the same writers as the unit tests), and <dir>/tokenizer,
// <dir>/chat_template and <dir>/openai_request with inputs in the layouts those targets read (see each
// target's header comment).
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>

#include "io_test_files.h"
#include "retroinfer/snapshot.h"

using namespace retroinfer::testing;
using namespace std::string_literals;

namespace {

// The ggml block layouts of the types with no test-side quantizer: bytes per block, elements per block and the
// byte offsets of the block's f16 scale fields (d, and dmin / m where the type has one).
struct BlockLayout {
  uint32_t type;
  size_t bytes, elems;
  std::vector<size_t> f16_fields;
};
// The first two are the tiny models' variants 3 and 4; all of them go into block_types.gguf.
const BlockLayout kRandomBlockTypes[] = {
    {kGgmlQ5_0, 22, 32, {0}},      {kGgmlQ5_1, 24, 32, {0, 2}}, {kGgmlQ4_K, 144, 256, {0, 2}},
    {kGgmlQ5_K, 176, 256, {0, 2}}, {kGgmlQ6_K, 210, 256, {208}}, {kGgmlQ4_0, 18, 32, {0}},
    {kGgmlF16, 2, 1, {}},          {kGgmlBF16, 2, 1, {}},
};

// n blocks of random bytes (seeded) with every f16 scale field set to a small finite value, so the seed
// dequantizes to finite numbers and mutations start from a valid block (as scripts/make_quant_fixtures.py).
std::vector<uint8_t> random_blocks(const BlockLayout& t, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> b(n * t.bytes);
  for (uint8_t& x : b) x = static_cast<uint8_t>(rng());
  const uint16_t scale = retroinfer::f32_to_f16(0.01f);
  for (size_t i = 0; i < n; ++i)
    for (size_t off : t.f16_fields) std::memcpy(b.data() + i * t.bytes + off, &scale, 2);
  return b;
}

std::string read_test_data(const std::string& name) {
  std::ifstream f(std::string(RETROINFER_TEST_DATA) + "/" + name, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// fuzz_tokenizer: texts for both fixed tokenizers (byte 0 even) and the two committed tokenizer.json files
// (byte 0 odd).
void write_tokenizer_seeds(const std::filesystem::path& dir) {
  const std::string texts[] = {
      "Hello, world! The quick brown fox jumps over the lazy dog.",
      "int main() {\n  return 0;\n}\n\t\t  1234567890 3.14159",
      "caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 e\xcc\x81 \xef\xbc\xa1",
      "<|im_start|>user\nhi<|im_end|> <think>ok</think> it's I'M we'll",
      "bytes \xff\xfe\x80 \0 \x01 end"s};
  int n = 0;
  for (const std::string& t : texts)
    for (char mode : {'\x00', '\x02'}) write_text((dir / ("text" + std::to_string(n++))).string(), mode + t);
  write_text((dir / "tiny_bpe.json").string(), "\x01" + read_test_data("tokenizer/tiny_bpe.tokenizer.json"));
  write_text((dir / "tiny_split.json").string(), "\x01" + read_test_data("tokenizer/tiny_split.tokenizer.json"));
}

// fuzz_chat_template: byte 0 = format index (+ 0x80: add_generation_prompt), then role NUL content NUL ...
void write_chat_seeds(const std::filesystem::path& dir) {
  const std::string conversation = "system\0Be brief.\0user\0  Hi there \n\0assistant\0\n\nHello!\0user\0Why?"s;
  for (int format = 0; format < 6; ++format) {
    write_text((dir / ("conv" + std::to_string(format))).string(), static_cast<char>(format | 0x80) + conversation);
    write_text((dir / ("final_assistant" + std::to_string(format))).string(),
               static_cast<char>(format) + "user\0q\0assistant\0\n<think>a</think>b"s);
  }
  // The detector reads the raw text: a Jinja template of each family.
  write_text((dir / "jinja_chatml").string(),
             std::string("\x01{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n{% endfor %}"));
  write_text((dir / "jinja_llama3").string(),
             "\x00{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}"s);
  write_text((dir / "name").string(), std::string("\x02qwen2.5"));
}

// fuzz_openai_request: byte 0 bit 0 = chat, then the request body.
void write_openai_seeds(const std::filesystem::path& dir) {
  const std::pair<const char*, std::string> seeds[] = {
      {"completion", "\x00{\"model\":\"smollm2\",\"prompt\":\"Once upon a time\",\"max_tokens\":16,\"temperature\":0.7,"
                     "\"top_p\":0.9,\"seed\":42,\"stop\":[\"\\n\",\"END\"],\"stream\":true,\"n\":1}"s},
      {"completion_min", "\x00{\"prompt\":\"x\"}"s},
      {"chat", "\x01{\"messages\":[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":"
               "[{\"type\":\"text\",\"text\":\"Hi \\u00e9\"},{\"type\":\"text\",\"text\":\"!\"}]}],"
               "\"max_completion_tokens\":8,\"stop\":\"\\n\",\"temperature\":0,\"stream\":false,\"user\":\"u\"}"s},
      {"chat_null", "\x01{\"messages\":[{\"role\":\"assistant\",\"content\":\"a\"}],\"max_tokens\":null,\"seed\":-1}"s},
      {"bad_utf8", "\x00{\"prompt\":\"\xc3\x28\"}"s},
      {"not_object", "\x01[1,2,3]"s}};
  for (const auto& [name, body] : seeds) write_text((dir / name).string(), body);
}

// Small valid snapshots: f32 and bf16 K/V, 1-2 layers, a few tokens.
void write_snapshot_seeds(const std::filesystem::path& dir) {
  for (int variant = 0; variant < 3; ++variant) {
    auto kv = std::make_shared<retroinfer::KvBlock>();
    kv->num_layers = 1 + variant % 2;
    kv->num_heads_kv = 1 + variant;
    kv->head_dim = 4;
    kv->dtype = variant == 1 ? retroinfer::DType::kBF16 : retroinfer::DType::kF32;
    kv->tokens = 2 + variant;
    kv->bytes.resize(2 * kv->num_layers * kv->num_heads_kv * kv->run_bytes());
    for (size_t i = 0; i < kv->bytes.size(); ++i) kv->bytes[i] = static_cast<uint8_t>(i * 7 + variant);
    retroinfer::Snapshot s;
    s.model = {0x1234567890abcdefULL + variant, "llama, seed " + std::to_string(variant)};
    s.attention.kind = variant == 2 ? retroinfer::AttentionKind::kFull : retroinfer::AttentionKind::kRetro;
    for (int t = 0; t < kv->tokens; ++t) s.context.tokens.push_back(t * 3 + variant);
    s.context.blocks.push_back(kv);
    retroinfer::save_snapshot((dir / ("seed" + std::to_string(variant) + ".snapshot")).string(), s);
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: fuzz_make_seeds <corpus-dir>\n";
    return 2;
  }
  const std::filesystem::path root = argv[1];
  for (const char* sub : {"gguf", "safetensors", "config", "tokenizer", "chat_template", "openai_request", "snapshot"})
    std::filesystem::create_directories(root / sub);
  write_snapshot_seeds(root / "snapshot");
  write_tokenizer_seeds(root / "tokenizer");
  write_chat_seeds(root / "chat_template");
  write_openai_seeds(root / "openai_request");

  // A 1-layer tiny llama, with q8_0 and q4_1 matrices, as GGUF (llama and qwen2) and safetensors.
  TinyLlama m;
  m.layers = 1;
  m.vocab = 8;
  m.hidden = 32;
  m.ffn = 32;
  m.heads_q = 2;
  m.heads_kv = 1;
  // Variants: 0 llama q8_0, 1 llama tied q4_1, 2 qwen2 q4_1, 3 llama q5_0, 4 llama q5_1 (matrices; the rest f32).
  for (int variant = 0; variant < 5; ++variant) {
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
      if (sv.first.size() == 2 && variant >= 3) {
        const BlockLayout& t = kRandomBlockTypes[variant - 3];
        w.tensor(g, dims, t.type, random_blocks(t, sv.second.size() / t.elems, static_cast<uint32_t>(sv.second.size())));
      } else if (sv.first.size() == 2) {
        w.tensor(g, dims, variant == 0 ? kGgmlQ8_0 : kGgmlQ4_1, variant == 0 ? quantize_q8_0(sv.second) : quantize_q4_1(sv.second));
      } else {
        w.tensor(g, dims, kGgmlF32, f32_bytes(sv.second));
      }
      s.tensor(name, "F32", sv.first, f32_bytes(sv.second));
    }
    write_file((root / "gguf" / ("tiny" + std::to_string(variant) + ".gguf")).string(), w.bytes());
    if (variant >= 3) continue;  // their safetensors and config equal variant 0's
    write_file((root / "safetensors" / ("tiny" + std::to_string(variant) + ".safetensors")).string(), s.bytes());
    write_text((root / "config" / ("config" + std::to_string(variant) + ".json")).string(), v.config_json());
  }
  // Every type without a tiny-model seed above, and Q5_0 / Q5_1 again, as bare tensors (no model metadata): two
  // rows each, which fuzz_gguf's first stage (parse + dequantize every tensor) decodes.
  {
    GgufWriter w;
    uint32_t seed = 1;
    for (const BlockLayout& t : kRandomBlockTypes) {
      const size_t blocks_per_row = t.elems == 256 ? 1 : 64 / t.elems;  // rows of 64 or 256 elements
      w.tensor("t" + std::to_string(t.type), {t.elems * blocks_per_row, 2}, t.type, random_blocks(t, 2 * blocks_per_row, seed++));
    }
    write_file((root / "gguf" / "block_types.gguf").string(), w.bytes());
  }
  std::cout << "seeds written under " << root << "\n";
  return 0;
}
