// ModelFile: open() dispatch, lookups, conversion to f32, weight type properties, required-tensor checks.
#include <algorithm>
#include <filesystem>

#include "io/ggml_quants.h"
#include "io/model_file_impl.h"
#include "retroinfer/dtype.h"
#include "retroinfer/error.h"

namespace retroinfer {

std::string_view weight_type_name(WeightType t) {
  switch (t) {
    case WeightType::kF32: return "f32";
    case WeightType::kF16: return "f16";
    case WeightType::kBF16: return "bf16";
    case WeightType::kQ8_0: return "q8_0";
    case WeightType::kQ4_0: return "q4_0";
    case WeightType::kQ4_1: return "q4_1";
    case WeightType::kQ5_0: return "q5_0";
    case WeightType::kQ5_1: return "q5_1";
    case WeightType::kQ4_K: return "q4_k";
    case WeightType::kQ5_K: return "q5_k";
    case WeightType::kQ6_K: return "q6_k";
  }
  return "?";
}

// ggml block layouts (32 elements per block):
//   Q8_0: f16 d, int8 q[32]                        -> 2 + 32 = 34 bytes, x = q * d
//   Q4_0: f16 d, uint8 qs[16] (nibbles)            -> 2 + 16 = 18 bytes, x = (q - 8) * d
//   Q4_1: f16 d, f16 m, uint8 qs[16] (nibbles)     -> 4 + 16 = 20 bytes, x = q * d + m
// Nibbles: element j < 16 is the low nibble of qs[j], element j + 16 the high nibble of qs[j].
// Q5_0 / Q5_1 and the K-quants (256-element super-blocks): src/io/ggml_quants.cpp.
int weight_type_block_elems(WeightType t) {
  switch (t) {
    case WeightType::kQ8_0: case WeightType::kQ4_0: case WeightType::kQ4_1: case WeightType::kQ5_0:
    case WeightType::kQ5_1: return 32;
    case WeightType::kQ4_K: case WeightType::kQ5_K: case WeightType::kQ6_K: return 256;
    default: return 1;
  }
}

int weight_type_block_bytes(WeightType t) {
  switch (t) {
    case WeightType::kF32: return 4;
    case WeightType::kF16: case WeightType::kBF16: return 2;
    case WeightType::kQ8_0: return 34;
    case WeightType::kQ4_0: return 18;
    case WeightType::kQ4_1: return 20;
    case WeightType::kQ5_0: return 22;
    case WeightType::kQ5_1: return 24;
    case WeightType::kQ4_K: return 144;
    case WeightType::kQ5_K: return 176;
    case WeightType::kQ6_K: return 210;
  }
  return 1;
}

size_t weight_type_row_bytes(WeightType t, int64_t n) {
  const int b = weight_type_block_elems(t);
  RETROINFER_CHECK(n >= 0 && n % b == 0, "row of ", n, " elements of type ", weight_type_name(t),
                   " is not a whole number of ", b, "-element blocks");
  return static_cast<size_t>(n / b) * static_cast<size_t>(weight_type_block_bytes(t));
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

namespace {
uint16_t load_u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
}  // namespace

void dequantize(WeightType t, const uint8_t* src, int64_t n, float* dst) {
  const int64_t block = weight_type_block_elems(t);
  RETROINFER_CHECK(n >= 0 && n % block == 0, "dequantize: ", n, " elements of type ", weight_type_name(t),
                   " is not a whole number of ", block, "-element blocks");
  switch (t) {
    case WeightType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    case WeightType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_u16(src + 2 * i));
      return;
    case WeightType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return;
    case WeightType::kQ8_0:
      for (int64_t b = 0; b < n / 32; ++b, src += 34, dst += 32) {
        const float d = f16_to_f32(load_u16(src));
        for (int j = 0; j < 32; ++j) dst[j] = static_cast<float>(static_cast<int8_t>(src[2 + j])) * d;
      }
      return;
    case WeightType::kQ4_0:
      for (int64_t b = 0; b < n / 32; ++b, src += 18, dst += 32) {
        const float d = f16_to_f32(load_u16(src));
        for (int j = 0; j < 16; ++j) {
          dst[j] = static_cast<float>((src[2 + j] & 0x0f) - 8) * d;
          dst[j + 16] = static_cast<float>((src[2 + j] >> 4) - 8) * d;
        }
      }
      return;
    case WeightType::kQ4_1:
      for (int64_t b = 0; b < n / 32; ++b, src += 20, dst += 32) {
        const float d = f16_to_f32(load_u16(src));
        const float m = f16_to_f32(load_u16(src + 2));
        for (int j = 0; j < 16; ++j) {
          dst[j] = static_cast<float>(src[4 + j] & 0x0f) * d + m;
          dst[j + 16] = static_cast<float>(src[4 + j] >> 4) * d + m;
        }
      }
      return;
    case WeightType::kQ5_0: case WeightType::kQ5_1: case WeightType::kQ4_K: case WeightType::kQ5_K:
    case WeightType::kQ6_K:
      dequantize_ggml_blocks(t, src, n / block, dst);
      return;
  }
  RETROINFER_FAIL("dequantize: unknown weight type ", static_cast<int>(t));
}

ModelFile::~ModelFile() = default;

std::unique_ptr<ModelFile> ModelFile::open(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  RETROINFER_CHECK(fs::exists(st), path, ": no such file or directory (pass a .gguf file, a .safetensors file or "
                   "a Hugging Face model directory; scripts/setup.sh installs the default SmolLM2 model)");
  if (fs::is_directory(st)) return io::open_safetensors_model(path);
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".gguf") return io::open_gguf_model(path);
  if (ext == ".safetensors") return io::open_safetensors_model(path);
  RETROINFER_FAIL(path, ": unknown model file extension '", ext,
                  "': expected .gguf, .safetensors or a Hugging Face model directory");
}

const TensorInfo& ModelFile::get(std::string_view hf_name) const {
  const TensorInfo* t = find(hf_name);
  RETROINFER_CHECK(t != nullptr, path(), ": tensor '", hf_name, "' is not in the model");
  return *t;
}

std::vector<float> ModelFile::to_f32(const TensorInfo& t) const {
  const int64_t n = t.numel();
  RETROINFER_CHECK(weight_type_row_bytes(t.type, n) == t.nbytes, path(), ": tensor '", t.name, "' holds ",
                   t.nbytes, " bytes, inconsistent with its shape and type ", weight_type_name(t.type));
  check_files_unchanged();
  std::vector<float> out(static_cast<size_t>(n));
  dequantize(t.type, t.data, n, out.data());
  return out;
}

namespace io {

const TensorInfo* LoadedModel::find(std::string_view hf_name) const {
  auto it = tensors_.find(hf_name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> LoadedModel::tensor_names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [k, v] : tensors_) names.push_back(k);
  return names;
}

const uint8_t* LoadedModel::own(std::vector<uint8_t> bytes) {
  owned_.push_back(std::move(bytes));
  return owned_.back().data();
}

void LoadedModel::add(TensorInfo t, const std::string& source) {
  std::string name = t.name;
  RETROINFER_CHECK(!tensors_.count(name), source, ": tensor '", name, "' appears twice");
  tensors_.emplace(std::move(name), std::move(t));
}

namespace {
std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}
}  // namespace

void check_required_tensors(const ModelFile& m, const std::string& file) {
  const ModelConfig& c = m.config();
  const int64_t h = c.hidden_size, q = int64_t{c.num_heads_q} * c.head_dim, kv = int64_t{c.num_heads_kv} * c.head_dim;
  const int64_t ff = c.intermediate_size, vocab = c.vocab_size;
  auto need = [&](const std::string& name, std::vector<int64_t> shape) {
    const TensorInfo* t = m.find(name);
    RETROINFER_CHECK(t != nullptr, file, ": required tensor '", name, "' is missing (architecture ",
                     c.architecture, ", ", c.num_layers, " layers)");
    RETROINFER_CHECK(t->shape == shape, file, ": tensor '", name, "' has shape ", shape_str(t->shape),
                     ", the config implies ", shape_str(shape));
  };
  need("model.embed_tokens.weight", {vocab, h});
  need("model.norm.weight", {h});
  if (!c.tie_word_embeddings) need("lm_head.weight", {vocab, h});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    need(p + "input_layernorm.weight", {h});
    need(p + "post_attention_layernorm.weight", {h});
    need(p + "self_attn.q_proj.weight", {q, h});
    need(p + "self_attn.k_proj.weight", {kv, h});
    need(p + "self_attn.v_proj.weight", {kv, h});
    need(p + "self_attn.o_proj.weight", {h, q});
    if (c.attention_bias) {
      need(p + "self_attn.q_proj.bias", {q});
      need(p + "self_attn.k_proj.bias", {kv});
      need(p + "self_attn.v_proj.bias", {kv});
    }
    need(p + "mlp.gate_proj.weight", {ff, h});
    need(p + "mlp.up_proj.weight", {ff, h});
    need(p + "mlp.down_proj.weight", {h, ff});
  }
}

}  // namespace io
}  // namespace retroinfer
