// Loading: ModelFile tensors (any stored type) -> f32 Model::Weights, with shape checks and the memory
// estimate made before anything large is allocated.
#include "model/weights.h"

#include <cstring>
#include <sstream>
#include <string>

#include "retroinfer/error.h"
#include "retroinfer/model_file.h"

namespace retroinfer {
namespace {

std::string shape_str(const std::vector<int64_t>& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << "]";
  return os.str();
}

const TensorInfo& require(const ModelFile& f, const std::string& name, std::vector<int64_t> shape) {
  const TensorInfo* t = f.find(name);
  RETROINFER_CHECK(t != nullptr, "model ", f.path(), ": tensor '", name,
                   "' is missing; the file is incomplete or not a Llama-family model");
  RETROINFER_CHECK(t->shape == shape, "model ", f.path(), ": tensor '", name, "' has shape ", shape_str(t->shape),
                   ", expected ", shape_str(shape), " from the config");
  return *t;
}

// Appends the f32 values of a tensor to dst.
void append_f32(const ModelFile& f, const TensorInfo& t, std::vector<float>& dst) {
  std::vector<float> v = f.to_f32(t);
  dst.insert(dst.end(), v.begin(), v.end());
}

std::vector<float> load_f32(const ModelFile& f, const std::string& name, std::vector<int64_t> shape) {
  return f.to_f32(require(f, name, std::move(shape)));
}

}  // namespace

int64_t Model::Weights::bytes() const {
  int64_t n = static_cast<int64_t>(embed.size() + final_norm.size() + lm_head.size());
  for (const auto& l : layers)
    n += static_cast<int64_t>(l.attn_norm.size() + l.wqkv.size() + l.bqkv.size() + l.wo.size() + l.mlp_norm.size() +
                              l.wgate_up.size() + l.wdown.size());
  return n * 4;
}

int64_t Model::weight_bytes() const { return w_->bytes(); }
Model::~Model() = default;

std::unique_ptr<Model> Model::load(const std::string& path, const ModelOptions& opt) {
  auto file = ModelFile::open(path);
  return load(*file, opt);
}

std::unique_ptr<Model> Model::load(const ModelFile& f, const ModelOptions& opt) {
  const ModelConfig& c = f.config();
  validate(c);
  std::unique_ptr<Model> m(new Model());
  m->cfg_ = c;
  m->path_ = f.path();
  m->memory_limit_ = opt.memory_limit_bytes > 0 ? opt.memory_limit_bytes : available_memory_bytes();

  const bool tied = c.tie_word_embeddings;
  RETROINFER_CHECK(tied || f.find("lm_head.weight") != nullptr, "model ", f.path(),
                   ": tensor 'lm_head.weight' is missing and tie_word_embeddings is false");
  // Weights alone (KV for a minimal context of one token): refuse before converting anything.
  const MemoryEstimate est = estimate_memory(m->cfg_, 1, DType::kF32, 1);
  RETROINFER_CHECK(est.weight_bytes <= m->memory_limit_, "model ", f.path(), ": the f32 weights need ",
                   est.weight_bytes >> 20, " MiB but only ", m->memory_limit_ >> 20,
                   " MiB of memory are available; free memory or use a smaller model");

  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_heads_q, hkv = c.num_heads_kv;
  const int64_t inter = c.intermediate_size, vocab = c.vocab_size;
  auto w = std::make_unique<Weights>();
  w->embed = load_f32(f, "model.embed_tokens.weight", {vocab, h});
  if (!tied) w->lm_head = load_f32(f, "lm_head.weight", {vocab, h});
  w->final_norm = load_f32(f, "model.norm.weight", {h});
  w->layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Weights::Layer& L = w->layers[i];
    L.attn_norm = load_f32(f, p + "input_layernorm.weight", {h});
    L.mlp_norm = load_f32(f, p + "post_attention_layernorm.weight", {h});
    L.wqkv.reserve((hq + 2 * hkv) * d * h);
    append_f32(f, require(f, p + "self_attn.q_proj.weight", {hq * d, h}), L.wqkv);
    append_f32(f, require(f, p + "self_attn.k_proj.weight", {hkv * d, h}), L.wqkv);
    append_f32(f, require(f, p + "self_attn.v_proj.weight", {hkv * d, h}), L.wqkv);
    if (c.attention_bias) {
      append_f32(f, require(f, p + "self_attn.q_proj.bias", {hq * d}), L.bqkv);
      append_f32(f, require(f, p + "self_attn.k_proj.bias", {hkv * d}), L.bqkv);
      append_f32(f, require(f, p + "self_attn.v_proj.bias", {hkv * d}), L.bqkv);
    }
    L.wo = load_f32(f, p + "self_attn.o_proj.weight", {h, hq * d});
    L.wgate_up.reserve(2 * inter * h);
    append_f32(f, require(f, p + "mlp.gate_proj.weight", {inter, h}), L.wgate_up);
    append_f32(f, require(f, p + "mlp.up_proj.weight", {inter, h}), L.wgate_up);
    L.wdown = load_f32(f, p + "mlp.down_proj.weight", {h, inter});
  }
  m->w_ = std::move(w);
  return m;
}

}  // namespace retroinfer
