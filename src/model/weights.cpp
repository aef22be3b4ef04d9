// Loading: ModelFile tensors (any stored type) -> Model::Weights (block types kept or widened to f32, by
// ModelOptions::weight_storage), with shape checks and the memory check made before anything large is allocated.
#include "model/weights.h"

#include "model/quant_dot.h"

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

std::vector<float> load_f32(const ModelFile& f, const std::string& name, std::vector<int64_t> shape) {
  return f.to_f32(require(f, name, std::move(shape)));
}

// Bytes the weights of f take in memory with the given storage: the f32 estimate, less what each kept block
// tensor saves (its file bytes instead of 4 bytes an element; an upper bound when a tensor is widened after all,
// see WeightMatrix::append).
int64_t stored_bytes(const ModelFile& f, WeightStorage storage) {
  int64_t n = estimate_memory(f.config(), 1, DType::kF32, 1).weight_bytes;
  if (storage != WeightStorage::kBlocks) return n;
  for (const std::string& name : f.tensor_names()) {
    const TensorInfo& t = f.get(name);
    if (model::has_quant_kernel(t.type)) n -= t.numel() * 4 - static_cast<int64_t>(t.nbytes);
  }
  return n;
}

}  // namespace

std::string_view weight_storage_name(WeightStorage s) { return s == WeightStorage::kF32 ? "f32" : "blocks"; }

WeightStorage parse_weight_storage(std::string_view s) {
  if (s == "blocks") return WeightStorage::kBlocks;
  if (s == "f32") return WeightStorage::kF32;
  RETROINFER_FAIL("unknown CPU weight storage '", s, "': expected blocks or f32");
}

int64_t Model::Weights::bytes() const {
  int64_t n = embed.bytes() + lm_head.bytes() + static_cast<int64_t>(final_norm.size()) * 4;
  for (const auto& l : layers)
    n += l.wqkv.bytes() + l.wo.bytes() + l.wgate_up.bytes() + l.wdown.bytes() +
         static_cast<int64_t>(l.attn_norm.size() + l.bqkv.size() + l.mlp_norm.size()) * 4;
  return n;
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
  // Weights alone: refuse before converting anything.
  const int64_t need = stored_bytes(f, opt.weight_storage);
  RETROINFER_CHECK(need <= m->memory_limit_, "model ", f.path(), ": the weights (",
                   weight_storage_name(opt.weight_storage), ") need ", need >> 20, " MiB but only ", m->memory_limit_ >> 20,
                   " MiB of memory are available; free memory or use a smaller model");
  m->weight_storage_ = opt.weight_storage;
  const bool keep = opt.weight_storage == WeightStorage::kBlocks;
  // decode: the matrix multiplies decode rows, so its block parts take decode's layout (row groups); an untied
  // embedding is only looked up row by row and keeps the file's.
  auto matrix = [&](int64_t cols, std::initializer_list<std::pair<std::string, std::vector<int64_t>>> tensors,
                    bool decode = true) {
    model::WeightMatrix w(cols);
    for (const auto& [name, shape] : tensors) w.append(f, require(f, name, shape), keep);
    if (decode) w.pack_row_groups();
    return w;
  };

  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_heads_q, hkv = c.num_heads_kv;
  const int64_t inter = c.intermediate_size, vocab = c.vocab_size;
  auto w = std::make_unique<Weights>();
  w->embed = matrix(h, {{"model.embed_tokens.weight", {vocab, h}}}, tied);
  if (!tied) w->lm_head = matrix(h, {{"lm_head.weight", {vocab, h}}});
  w->final_norm = load_f32(f, "model.norm.weight", {h});
  w->layers.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Weights::Layer& L = w->layers[i];
    L.attn_norm = load_f32(f, p + "input_layernorm.weight", {h});
    L.mlp_norm = load_f32(f, p + "post_attention_layernorm.weight", {h});
    L.wqkv = matrix(h, {{p + "self_attn.q_proj.weight", {hq * d, h}},
                        {p + "self_attn.k_proj.weight", {hkv * d, h}},
                        {p + "self_attn.v_proj.weight", {hkv * d, h}}});
    if (c.attention_bias) {
      for (const char* part : {"q", "k", "v"}) {
        const std::string name = p + "self_attn." + part + "_proj.bias";
        const std::vector<float> b = load_f32(f, name, {(part[0] == 'q' ? hq : hkv) * d});
        L.bqkv.insert(L.bqkv.end(), b.begin(), b.end());
      }
    }
    L.wo = matrix(hq * d, {{p + "self_attn.o_proj.weight", {h, hq * d}}});
    L.wgate_up = matrix(h, {{p + "mlp.gate_proj.weight", {inter, h}}, {p + "mlp.up_proj.weight", {inter, h}}});
    L.wdown = matrix(inter, {{p + "mlp.down_proj.weight", {h, inter}}});
  }
  m->w_ = std::move(w);
  return m;
}

}  // namespace retroinfer
