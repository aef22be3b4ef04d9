// Helpers of the CUDA model runner tests: the tiny fixtures' locations and tokens, an in-memory ModelFile
// with random weights (shapes the tiny fixtures lack: head_dim 64 / 128, so that the dense decode and
// prefill kernels run), the CPU runner's prefill / decode, and the logit comparison.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "retroinfer/dtype.h"
#include "retroinfer/error.h"
#include "retroinfer/model.h"
#include "retroinfer/model_file.h"
#include "retroinfer/sampler.h"

namespace retroinfer::gputest {

// f() throws retroinfer::Error whose message contains `needle`; `what` names the case in failures.
template <typename F>
void expect_error(F&& f, const std::string& needle, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << what << ": no Error thrown";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << what << ": message '" << e.what() << "' lacks '" << needle << "'";
  }
}

inline std::filesystem::path fixture_dir(const std::string& name) {
  return std::filesystem::path(RETROINFER_TEST_DATA) / "models" / name;
}

// The fixture's 300 reference tokens (tests/data/models/<name>/reference.json); empty when absent.
inline std::vector<int32_t> fixture_tokens(const std::string& name) {
  const auto p = fixture_dir(name) / "reference.json";
  if (!std::filesystem::exists(p) || !std::filesystem::exists(fixture_dir(name) / "model.safetensors")) return {};
  std::ifstream f(p);
  return nlohmann::json::parse(f).at("tokens").get<std::vector<int32_t>>();
}

// A Llama-family model held in memory: f32 tensors under their Hugging Face names, random normal(0, std)
// values rounded to bf16 (so that bf16 weights on the GPU hold them exactly), norm weights 1 + 0.1 N(0, 1).
class MemoryModelFile final : public ModelFile {
 public:
  MemoryModelFile(const ModelConfig& c, uint64_t seed, float std_dev = 0.08f) : cfg_(c) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    auto add = [&](const std::string& name, std::vector<int64_t> shape, bool norm) {
      int64_t n = 1;
      for (int64_t s : shape) n *= s;
      std::vector<float>& v = data_[name];
      v.resize(n);
      for (auto& x : v) x = bf16_to_f32(f32_to_bf16(norm ? 1.0f + 0.1f * nd(rng) : std_dev * nd(rng)));
      TensorInfo t;
      t.name = name;
      t.type = WeightType::kF32;
      t.shape = std::move(shape);
      t.data = reinterpret_cast<const uint8_t*>(v.data());
      t.nbytes = v.size() * 4;
      info_[name] = t;
    };
    const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_heads_q, hkv = c.num_heads_kv, in = c.intermediate_size;
    add("model.embed_tokens.weight", {c.vocab_size, h}, false);
    if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, h}, false);
    add("model.norm.weight", {h}, true);
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string p = "model.layers." + std::to_string(l) + ".";
      add(p + "input_layernorm.weight", {h}, true);
      add(p + "post_attention_layernorm.weight", {h}, true);
      add(p + "self_attn.q_proj.weight", {hq * d, h}, false);
      add(p + "self_attn.k_proj.weight", {hkv * d, h}, false);
      add(p + "self_attn.v_proj.weight", {hkv * d, h}, false);
      if (c.attention_bias) {
        add(p + "self_attn.q_proj.bias", {hq * d}, false);
        add(p + "self_attn.k_proj.bias", {hkv * d}, false);
        add(p + "self_attn.v_proj.bias", {hkv * d}, false);
      }
      add(p + "self_attn.o_proj.weight", {h, hq * d}, false);
      add(p + "mlp.gate_proj.weight", {in, h}, false);
      add(p + "mlp.up_proj.weight", {in, h}, false);
      add(p + "mlp.down_proj.weight", {h, in}, false);
    }
  }
  const ModelConfig& config() const override { return cfg_; }
  const TensorInfo* find(std::string_view name) const override {
    auto it = info_.find(std::string(name));
    return it == info_.end() ? nullptr : &it->second;
  }
  std::vector<std::string> tensor_names() const override {
    std::vector<std::string> n;
    for (const auto& [k, v] : info_) n.push_back(k);
    return n;
  }
  std::string path() const override { return "memory:synthetic"; }

 private:
  ModelConfig cfg_;
  std::map<std::string, std::vector<float>> data_;
  std::map<std::string, TensorInfo> info_;
};

// Synthetic shapes for the dense GPU kernels: head_dim 64 (group 2, untied, default RoPE) and head_dim 128
// (group 4, Qwen2-style QKV bias, tied embeddings, llama3 RoPE); odd vocabularies for tails.
inline ModelConfig synthetic_config(int head_dim) {
  ModelConfig c;
  c.architecture = head_dim == 64 ? "llama" : "qwen2";
  c.head_dim = head_dim;
  c.num_heads_q = head_dim == 64 ? 4 : 8;
  c.num_heads_kv = 2;
  c.hidden_size = head_dim == 64 ? 256 : 512;
  c.intermediate_size = head_dim == 64 ? 640 : 1000;
  c.num_layers = 2;
  c.vocab_size = head_dim == 64 ? 1001 : 777;
  c.max_position_embeddings = 4096;
  c.rope_theta = head_dim == 64 ? 10000.0f : 500000.0f;
  c.attention_bias = head_dim == 128;
  c.tie_word_embeddings = head_dim == 128;
  if (head_dim == 128) {
    c.rope_scaling.type = "llama3";
    c.rope_scaling.factor = 8.0f;
    c.rope_scaling.original_max_position = 512;
  }
  return c;
}

inline std::vector<int32_t> random_tokens(int64_t n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = pick(rng);
  return t;
}

// The CPU runner's results for one prompt: all prefill logits and `steps` decode steps fed with its own
// greedy tokens.
struct CpuRun {
  std::vector<float> prefill_logits;            // [n, vocab] (all_logits) or empty
  std::vector<float> last_logits;               // [vocab]: the prompt's last position
  std::vector<int32_t> tokens;                  // [steps]: greedy token of each step (the first from prefill)
  std::vector<std::vector<float>> step_logits;  // [steps][vocab]: logits after feeding tokens[i]
};
inline CpuRun cpu_run(const Model& m, const std::vector<int32_t>& prompt, int steps, int chunk, bool all_logits = true) {
  SessionOptions so;
  so.attention.kind = AttentionKind::kFull;
  so.kv_dtype = DType::kBF16;
  so.prefill_chunk = chunk;
  so.max_context = static_cast<int64_t>(prompt.size()) + steps + 1;
  Session s(m, so);
  CpuRun r;
  r.prefill_logits = s.prefill(prompt, all_logits);
  const int64_t vocab = m.config().vocab_size;
  r.last_logits.assign(r.prefill_logits.end() - vocab, r.prefill_logits.end());
  if (!all_logits) r.prefill_logits.clear();
  std::vector<float> last = r.last_logits;
  for (int i = 0; i < steps; ++i) {
    r.tokens.push_back(argmax(last));
    s.decode(r.tokens.back(), last);
    r.step_logits.push_back(last);
  }
  return r;
}

// Max |got - want| over a row relative to the row's logit scale (max |want|).
struct RowError {
  double rel = 0.0;  // worst |got - want| / scale
  double scale = 0.0;
  int64_t where = -1;
};
inline RowError row_error(const float* got, const float* want, int64_t vocab) {
  RowError e;
  double worst = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    e.scale = std::max(e.scale, std::fabs(static_cast<double>(want[i])));
    const double d = std::fabs(static_cast<double>(got[i]) - want[i]);
    if (!(d <= worst)) {  // NaN counts as the worst
      worst = std::isnan(d) ? INFINITY : d;
      e.where = i;
    }
  }
  e.rel = e.scale > 0 ? worst / e.scale : worst;
  return e;
}

// Top-2 margin of a row relative to its scale: greedy choices of two implementations may differ only when it
// is below twice their logit tolerance.
inline double top2_margin_rel(const std::vector<float>& row) {
  float a = -INFINITY, b = -INFINITY, scale = 0.0f;
  for (float x : row) {
    scale = std::max(scale, std::fabs(x));
    if (x > a) {
      b = a;
      a = x;
    } else if (x > b) {
      b = x;
    }
  }
  return scale > 0 ? (a - b) / scale : 0.0;
}

}  // namespace retroinfer::gputest
