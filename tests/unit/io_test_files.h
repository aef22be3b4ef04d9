// Test helpers for the model-file readers: a temp directory, and writers that build small GGUF and
// safetensors files byte by byte (independent of the readers under test).
#pragma once

#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "retroinfer/dtype.h"

namespace retroinfer::testing {

// A fresh directory under $TMPDIR (or /tmp), removed with everything in it at destruction.
class TempDir {
 public:
  TempDir() {
    const char* base = std::getenv("TMPDIR");
    std::string tmpl = std::string(base && *base ? base : "/tmp") + "/retroinfer_io_XXXXXX";
    char* p = ::mkdtemp(tmpl.data());
    if (p == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = p;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

inline void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}
inline void write_text(const std::string& path, const std::string& s) {
  std::ofstream out(path, std::ios::binary);
  out << s;
}

// Little-endian byte appenders.
template <typename T>
void put(std::vector<uint8_t>& b, T v) {
  uint8_t tmp[sizeof(T)];
  std::memcpy(tmp, &v, sizeof(T));
  b.insert(b.end(), tmp, tmp + sizeof(T));
}
inline void put_str(std::vector<uint8_t>& b, const std::string& s) {
  put<uint64_t>(b, s.size());
  b.insert(b.end(), s.begin(), s.end());
}
inline std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b;
  for (float x : v) put(b, x);
  return b;
}

// ggml type codes (gguf spec), written independently of the reader's enum.
enum : uint32_t {
  kGgmlF32 = 0, kGgmlF16 = 1, kGgmlQ4_0 = 2, kGgmlQ4_1 = 3, kGgmlQ5_0 = 6, kGgmlQ5_1 = 7, kGgmlQ8_0 = 8,
  kGgmlQ4_K = 12, kGgmlQ5_K = 13, kGgmlQ6_K = 14, kGgmlBF16 = 30
};
// GGUF value type codes.
enum : uint32_t { kGU8 = 0, kGI8, kGU16, kGI16, kGU32, kGI32, kGF32, kGBool, kGStr, kGArr, kGU64, kGI64, kGF64 };

// Builds a GGUF file: metadata KVs, then tensor infos, then the aligned data section.
class GgufWriter {
 public:
  explicit GgufWriter(uint32_t version = 3) : version_(version) {}

  // Raw KV: the value bytes already encoded (type code included by the caller through `type`).
  void kv_raw(const std::string& key, uint32_t type, const std::vector<uint8_t>& value) {
    put_str(kv_, key);
    put<uint32_t>(kv_, type);
    kv_.insert(kv_.end(), value.begin(), value.end());
    ++n_kv_;
  }
  void kv_u32(const std::string& k, uint32_t v) { std::vector<uint8_t> b; put(b, v); kv_raw(k, kGU32, b); }
  void kv_i32(const std::string& k, int32_t v) { std::vector<uint8_t> b; put(b, v); kv_raw(k, kGI32, b); }
  void kv_u64(const std::string& k, uint64_t v) { std::vector<uint8_t> b; put(b, v); kv_raw(k, kGU64, b); }
  void kv_f32(const std::string& k, float v) { std::vector<uint8_t> b; put(b, v); kv_raw(k, kGF32, b); }
  void kv_bool(const std::string& k, bool v) { kv_raw(k, kGBool, {static_cast<uint8_t>(v)}); }
  void kv_str(const std::string& k, const std::string& v) { std::vector<uint8_t> b; put_str(b, v); kv_raw(k, kGStr, b); }
  void kv_str_array(const std::string& k, const std::vector<std::string>& v) {
    std::vector<uint8_t> b;
    put<uint32_t>(b, kGStr);
    put<uint64_t>(b, v.size());
    for (const auto& s : v) put_str(b, s);
    kv_raw(k, kGArr, b);
  }
  void kv_i32_array(const std::string& k, const std::vector<int32_t>& v) {
    std::vector<uint8_t> b;
    put<uint32_t>(b, kGI32);
    put<uint64_t>(b, v.size());
    for (int32_t x : v) put(b, x);
    kv_raw(k, kGArr, b);
  }
  void kv_f32_array(const std::string& k, const std::vector<float>& v) {
    std::vector<uint8_t> b;
    put<uint32_t>(b, kGF32);
    put<uint64_t>(b, v.size());
    for (float x : v) put(b, x);
    kv_raw(k, kGArr, b);
  }
  void set_alignment(uint32_t a) {
    alignment_ = a;
    kv_u32("general.alignment", a);
  }

  // dims in ggml order (innermost first); bytes as stored.
  void tensor(const std::string& name, std::vector<uint64_t> dims, uint32_t ggml_type, std::vector<uint8_t> bytes) {
    tensors_.push_back({name, std::move(dims), ggml_type, std::move(bytes)});
  }

  std::vector<uint8_t> bytes() const {
    std::vector<uint8_t> b;
    put<uint32_t>(b, 0x46554747u);  // "GGUF"
    put<uint32_t>(b, version_);
    put<uint64_t>(b, tensors_.size());
    put<uint64_t>(b, n_kv_);
    b.insert(b.end(), kv_.begin(), kv_.end());
    uint64_t offset = 0;
    std::vector<uint64_t> offsets;
    for (const auto& t : tensors_) {
      put_str(b, t.name);
      put<uint32_t>(b, static_cast<uint32_t>(t.dims.size()));
      for (uint64_t d : t.dims) put<uint64_t>(b, d);
      put<uint32_t>(b, t.type);
      put<uint64_t>(b, offset);
      offsets.push_back(offset);
      offset += (t.bytes.size() + alignment_ - 1) / alignment_ * alignment_;
    }
    while (b.size() % alignment_) b.push_back(0);
    const size_t data_start = b.size();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      b.resize(data_start + offsets[i], 0);
      b.insert(b.end(), tensors_[i].bytes.begin(), tensors_[i].bytes.end());
    }
    return b;
  }

 private:
  struct T {
    std::string name;
    std::vector<uint64_t> dims;
    uint32_t type;
    std::vector<uint8_t> bytes;
  };
  uint32_t version_;
  uint32_t alignment_ = 32;
  uint64_t n_kv_ = 0;
  std::vector<uint8_t> kv_;
  std::vector<T> tensors_;
};

// Builds a safetensors file (tensors laid out in insertion order).
class SafetensorsWriter {
 public:
  void tensor(const std::string& name, const std::string& dtype, std::vector<int64_t> shape,
              const std::vector<uint8_t>& bytes) {
    header_[name] = {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {data_.size(), data_.size() + bytes.size()}}};
    data_.insert(data_.end(), bytes.begin(), bytes.end());
  }
  void metadata(const std::string& k, const std::string& v) { header_["__metadata__"][k] = v; }
  nlohmann::json& header() { return header_; }
  std::vector<uint8_t> bytes() const { return bytes_with_header(header_.dump()); }
  std::vector<uint8_t> bytes_with_header(const std::string& h) const {
    std::vector<uint8_t> b;
    put<uint64_t>(b, h.size());
    b.insert(b.end(), h.begin(), h.end());
    b.insert(b.end(), data_.begin(), data_.end());
    return b;
  }

 private:
  nlohmann::json header_ = nlohmann::json::object();
  std::vector<uint8_t> data_;
};

// Test-side quantizers (ggml block layouts, rounding chosen here; the tests compare against this
// side's own dequantization formula, which is the format definition).
inline void put_f16(std::vector<uint8_t>& b, float x) { put<uint16_t>(b, f32_to_f16(x)); }
inline std::vector<uint8_t> quantize_q8_0(const std::vector<float>& x) {
  std::vector<uint8_t> b;
  for (size_t i = 0; i < x.size(); i += 32) {
    float amax = 0;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[i + j]));
    const float d = f16_to_f32(f32_to_f16(amax / 127.0f));
    put_f16(b, d);
    for (int j = 0; j < 32; ++j)
      b.push_back(static_cast<uint8_t>(static_cast<int8_t>(d == 0 ? 0 : std::lround(x[i + j] / d))));
  }
  return b;
}
inline std::vector<uint8_t> quantize_q4_1(const std::vector<float>& x) {
  std::vector<uint8_t> b;
  for (size_t i = 0; i < x.size(); i += 32) {
    float lo = x[i], hi = x[i];
    for (int j = 0; j < 32; ++j) lo = std::min(lo, x[i + j]), hi = std::max(hi, x[i + j]);
    const float d = f16_to_f32(f32_to_f16((hi - lo) / 15.0f)), m = f16_to_f32(f32_to_f16(lo));
    put_f16(b, d);
    put_f16(b, m);
    auto q = [&](float v) { return d == 0 ? 0 : std::clamp<int>(static_cast<int>(std::lround((v - m) / d)), 0, 15); };
    for (int j = 0; j < 16; ++j) b.push_back(static_cast<uint8_t>(q(x[i + j]) | (q(x[i + j + 16]) << 4)));
  }
  return b;
}
// Reference dequantization straight from the format definition.
inline std::vector<float> dequant_q4_1_ref(const std::vector<uint8_t>& b) {
  std::vector<float> out;
  for (size_t o = 0; o < b.size(); o += 20) {
    const float d = f16_to_f32(static_cast<uint16_t>(b[o] | b[o + 1] << 8));
    const float m = f16_to_f32(static_cast<uint16_t>(b[o + 2] | b[o + 3] << 8));
    std::vector<float> blk(32);
    for (int j = 0; j < 16; ++j) {
      blk[j] = (b[o + 4 + j] & 15) * d + m;
      blk[j + 16] = (b[o + 4 + j] >> 4) * d + m;
    }
    out.insert(out.end(), blk.begin(), blk.end());
  }
  return out;
}

// The llama.cpp converter's q/k permutation written with plain loops (independent of the reader):
// per head, output row 2*i + j = input row j*half + i.
inline std::vector<float> converter_permute(const std::vector<float>& w, int64_t rows, int64_t cols, int64_t n_head) {
  const int64_t hd = rows / n_head, half = hd / 2;
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < n_head; ++h)
    for (int64_t i = 0; i < half; ++i)
      for (int64_t j = 0; j < 2; ++j)
        std::memcpy(&out[static_cast<size_t>((h * hd + 2 * i + j) * cols)], &w[static_cast<size_t>((h * hd + j * half + i) * cols)],
                    static_cast<size_t>(cols) * sizeof(float));
  return out;
}

inline std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = nd(rng);
  return v;
}

// A tiny llama: hidden 64, 4 query heads / 2 KV heads of head_dim 16, ffn 96, 2 layers, vocab 32.
struct TinyLlama {
  int vocab = 32, hidden = 64, ffn = 96, layers = 2, heads_q = 4, heads_kv = 2, head_dim = 16;
  bool tie = false;
  bool qwen2 = false;  // qwen2 architecture: QKV biases, no permutation
  // HF name -> (HF shape, f32 values in HF order)
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> weights() const {
    std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> w;
    uint32_t seed = 1;
    auto add = [&](const std::string& n, std::vector<int64_t> shape) {
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      w[n] = {shape, random_floats(static_cast<size_t>(numel), seed++)};
    };
    const int64_t q = heads_q * head_dim, kv = heads_kv * head_dim;
    add("model.embed_tokens.weight", {vocab, hidden});
    add("model.norm.weight", {hidden});
    if (!tie) add("lm_head.weight", {vocab, hidden});
    for (int l = 0; l < layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {hidden});
      add(p + "post_attention_layernorm.weight", {hidden});
      add(p + "self_attn.q_proj.weight", {q, hidden});
      add(p + "self_attn.k_proj.weight", {kv, hidden});
      add(p + "self_attn.v_proj.weight", {kv, hidden});
      add(p + "self_attn.o_proj.weight", {hidden, q});
      if (qwen2) {
        add(p + "self_attn.q_proj.bias", {q});
        add(p + "self_attn.k_proj.bias", {kv});
        add(p + "self_attn.v_proj.bias", {kv});
      }
      add(p + "mlp.gate_proj.weight", {ffn, hidden});
      add(p + "mlp.up_proj.weight", {ffn, hidden});
      add(p + "mlp.down_proj.weight", {hidden, ffn});
    }
    return w;
  }
  std::string config_json() const {
    nlohmann::json j = {{"model_type", qwen2 ? "qwen2" : "llama"},
                        {"vocab_size", vocab},
                        {"hidden_size", hidden},
                        {"intermediate_size", ffn},
                        {"num_hidden_layers", layers},
                        {"num_attention_heads", heads_q},
                        {"num_key_value_heads", heads_kv},
                        {"rms_norm_eps", 1e-5},
                        {"rope_theta", 10000.0},
                        {"max_position_embeddings", 256},
                        {"tie_word_embeddings", tie},
                        {"bos_token_id", 1},
                        {"eos_token_id", 2},
                        {"hidden_act", "silu"}};
    return j.dump(2);
  }
};

}  // namespace retroinfer::testing
