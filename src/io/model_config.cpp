// Hugging Face config.json parsing and ModelConfig validation.
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "retroinfer/error.h"
#include "retroinfer/model_config.h"

namespace retroinfer {

namespace {

using nlohmann::json;

// Field readers: every one names the file and the field when the value is missing or mistyped.
class Fields {
 public:
  Fields(const json& j, const std::string& file, std::string prefix = "")
      : j_(j), file_(file), prefix_(std::move(prefix)) {}

  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }

  int get_int(const char* key) const {
    const json& v = at(key);
    RETROINFER_CHECK(v.is_number_integer(), file_, ": field '", prefix_, key, "' must be an integer, found ",
                     v.type_name(), " ", v.dump());
    const auto x = v.get<int64_t>();
    RETROINFER_CHECK(x >= std::numeric_limits<int>::min() && x <= std::numeric_limits<int>::max(), file_,
                     ": field '", prefix_, key, "' = ", x, " is out of range");
    return static_cast<int>(x);
  }
  int get_int(const char* key, int dflt) const { return has(key) ? get_int(key) : dflt; }

  float get_float(const char* key) const {
    const json& v = at(key);
    RETROINFER_CHECK(v.is_number(), file_, ": field '", prefix_, key, "' must be a number, found ", v.type_name(),
                     " ", v.dump());
    // A double beyond float's range converts with undefined behaviour: an Error instead.
    const double x = v.get<double>();
    RETROINFER_CHECK(std::isfinite(x) && std::fabs(x) <= std::numeric_limits<float>::max(), file_, ": field '",
                     prefix_, key, "' = ", v.dump(), " is out of a float's range");
    return static_cast<float>(x);
  }
  float get_float(const char* key, float dflt) const { return has(key) ? get_float(key) : dflt; }

  bool get_bool(const char* key, bool dflt) const {
    if (!has(key)) return dflt;
    const json& v = at(key);
    RETROINFER_CHECK(v.is_boolean(), file_, ": field '", prefix_, key, "' must be true or false, found ",
                     v.type_name(), " ", v.dump());
    return v.get<bool>();
  }

  std::string get_string(const char* key) const {
    const json& v = at(key);
    RETROINFER_CHECK(v.is_string(), file_, ": field '", prefix_, key, "' must be a string, found ", v.type_name(),
                     " ", v.dump());
    return v.get<std::string>();
  }
  std::string get_string(const char* key, const std::string& dflt) const {
    return has(key) ? get_string(key) : dflt;
  }

  // int, list of ints, or absent/null (empty).
  std::vector<int> get_int_list(const char* key) const {
    std::vector<int> out;
    if (!has(key)) return out;
    const json& v = at(key);
    if (v.is_number_integer()) {
      out.push_back(get_int(key));
      return out;
    }
    RETROINFER_CHECK(v.is_array(), file_, ": field '", prefix_, key, "' must be an integer or a list of integers, found ",
                     v.type_name());
    for (size_t i = 0; i < v.size(); ++i) {
      RETROINFER_CHECK(v[i].is_number_integer() && v[i].get<int64_t>() >= 0 &&
                           v[i].get<int64_t>() <= std::numeric_limits<int>::max(),
                       file_, ": field '", prefix_, key, "'[", i, "] must be a non-negative integer, found ", v[i].dump());
      out.push_back(v[i].get<int>());
    }
    return out;
  }

  const json& at(const char* key) const {
    RETROINFER_CHECK(has(key), file_, ": required field '", prefix_, key, "' is missing");
    return j_.at(key);
  }

 private:
  const json& j_;
  const std::string& file_;
  std::string prefix_;
};

RopeScaling parse_rope_scaling(const json& rs, const std::string& file, const char* name, int max_pos) {
  RETROINFER_CHECK(rs.is_object(), file, ": field '", name, "' must be an object or null, found ", rs.type_name());
  const std::string prefix = std::string(name) + ".";
  Fields f(rs, file, prefix);
  RopeScaling r;
  // Newer transformers write rope_type, older ones type.
  r.type = f.has("rope_type") ? f.get_string("rope_type") : f.get_string("type", "default");
  if (r.type == "default") return r;
  RETROINFER_CHECK(r.type == "linear" || r.type == "dynamic" || r.type == "llama3" || r.type == "yarn", file,
                   ": field '", prefix, "rope_type' = '", r.type,
                   "' is not supported (supported: default, linear, dynamic, llama3, yarn)");
  r.factor = f.get_float("factor");
  if (r.type == "llama3") {
    r.low_freq_factor = f.get_float("low_freq_factor");
    r.high_freq_factor = f.get_float("high_freq_factor");
    r.original_max_position = f.get_int("original_max_position_embeddings");
  } else if (r.type == "yarn") {
    r.beta_fast = f.get_float("beta_fast", 32.0f);
    r.beta_slow = f.get_float("beta_slow", 1.0f);
    r.attention_factor = f.get_float("attention_factor", 0.0f);
    // transformers: original_max_position_embeddings from rope_scaling, else max_position_embeddings.
    r.original_max_position = f.get_int("original_max_position_embeddings", max_pos);
  } else if (r.type == "dynamic") {
    r.original_max_position = f.get_int("original_max_position_embeddings", max_pos);
  }
  return r;
}

}  // namespace

ModelConfig parse_hf_config(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RETROINFER_CHECK(in.good(), path, ": cannot open the model config (a Hugging Face model directory needs "
                   "config.json beside the safetensors files)");
  std::stringstream ss;
  ss << in.rdbuf();
  const json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  RETROINFER_CHECK(!j.is_discarded(), path, ": not valid JSON");
  RETROINFER_CHECK(j.is_object(), path, ": top level must be a JSON object, found ", j.type_name());
  Fields f(j, path);

  ModelConfig c;
  c.architecture = f.get_string("model_type");
  RETROINFER_CHECK(c.architecture == "llama" || c.architecture == "qwen2" || c.architecture == "mistral", path,
                   ": field 'model_type' = '", c.architecture,
                   "' is not a supported architecture (supported: llama, qwen2, mistral)");
  const std::string act = f.get_string("hidden_act", "silu");
  RETROINFER_CHECK(act == "silu", path, ": field 'hidden_act' = '", act, "': only silu is supported");
  c.vocab_size = f.get_int("vocab_size");
  c.hidden_size = f.get_int("hidden_size");
  c.intermediate_size = f.get_int("intermediate_size");
  c.num_layers = f.get_int("num_hidden_layers");
  c.num_heads_q = f.get_int("num_attention_heads");
  c.num_heads_kv = f.get_int("num_key_value_heads", c.num_heads_q);
  RETROINFER_CHECK(c.num_heads_q > 0, path, ": field 'num_attention_heads' = ", c.num_heads_q, " must be positive");
  c.head_dim = f.get_int("head_dim", c.hidden_size / c.num_heads_q);
  c.rms_norm_eps = f.get_float("rms_norm_eps", 1e-6f);
  c.max_position_embeddings = f.get_int("max_position_embeddings", 0);
  c.tie_word_embeddings = f.get_bool("tie_word_embeddings", false);
  // Qwen2 always has QKV bias (its config has no field for it); llama / mistral say so in attention_bias.
  c.attention_bias = c.architecture == "qwen2" ? true : f.get_bool("attention_bias", false);
  c.bos_token_id = f.get_int("bos_token_id", -1);
  c.eos_token_ids = f.get_int_list("eos_token_id");
  const bool sliding = c.architecture == "mistral" || f.get_bool("use_sliding_window", false);
  c.sliding_window = sliding ? f.get_int("sliding_window", 0) : 0;

  // RoPE: transformers >= 4.5x may nest theta and scaling in rope_parameters.
  if (f.has("rope_parameters")) {
    const json& rp = f.at("rope_parameters");
    RETROINFER_CHECK(rp.is_object(), path, ": field 'rope_parameters' must be an object, found ", rp.type_name());
    Fields rf(rp, path, "rope_parameters.");
    c.rope_theta = rf.get_float("rope_theta", 10000.0f);
    c.rope_scaling = parse_rope_scaling(rp, path, "rope_parameters", c.max_position_embeddings);
  } else {
    c.rope_theta = f.get_float("rope_theta", 10000.0f);
    if (f.has("rope_scaling"))
      c.rope_scaling = parse_rope_scaling(f.at("rope_scaling"), path, "rope_scaling", c.max_position_embeddings);
  }
  try {
    validate(c);
  } catch (const Error& e) {
    RETROINFER_FAIL(path, ": ", e.what());
  }
  return c;
}

void validate(const ModelConfig& c) {
  RETROINFER_CHECK(c.architecture == "llama" || c.architecture == "qwen2" || c.architecture == "mistral",
                   "model architecture '", c.architecture, "' is not supported (supported: llama, qwen2, mistral)");
  // Upper bounds keep every size product (vocab * hidden, heads * head_dim, ...) far inside int64 and
  // reject garbage early; the largest supported models are well below them.
  auto in_range = [](const char* name, int v, int lo, int hi) {
    RETROINFER_CHECK(v >= lo && v <= hi, "model config: ", name, " = ", v, " is out of range [", lo, ", ", hi, "]");
  };
  in_range("vocab_size", c.vocab_size, 1, 1 << 24);
  in_range("hidden_size", c.hidden_size, 1, 1 << 18);
  in_range("intermediate_size", c.intermediate_size, 1, 1 << 20);
  in_range("num_layers", c.num_layers, 1, 1024);
  in_range("num_heads_q", c.num_heads_q, 1, 1024);
  in_range("num_heads_kv", c.num_heads_kv, 1, c.num_heads_q);
  in_range("head_dim", c.head_dim, 2, 1024);
  RETROINFER_CHECK(c.num_heads_q % c.num_heads_kv == 0, "model config: num_heads_q = ", c.num_heads_q,
                   " is not a multiple of num_heads_kv = ", c.num_heads_kv);
  RETROINFER_CHECK(c.head_dim % 2 == 0, "model config: head_dim = ", c.head_dim, " must be even (RoPE pairs)");
  RETROINFER_CHECK(std::isfinite(c.rms_norm_eps) && c.rms_norm_eps > 0, "model config: rms_norm_eps = ",
                   c.rms_norm_eps, " must be positive");
  RETROINFER_CHECK(std::isfinite(c.rope_theta) && c.rope_theta > 1.0f, "model config: rope_theta = ", c.rope_theta,
                   " must be > 1");
  RETROINFER_CHECK(c.max_position_embeddings >= 0, "model config: max_position_embeddings = ",
                   c.max_position_embeddings, " must be >= 0");
  RETROINFER_CHECK(c.bos_token_id >= -1 && c.bos_token_id < c.vocab_size, "model config: bos_token_id = ",
                   c.bos_token_id, " is outside the vocabulary of ", c.vocab_size);
  for (int e : c.eos_token_ids)
    RETROINFER_CHECK(e >= 0 && e < c.vocab_size, "model config: eos_token_id ", e, " is outside the vocabulary of ",
                     c.vocab_size);
  const RopeScaling& r = c.rope_scaling;
  if (r.type == "default") return;
  RETROINFER_CHECK(r.type == "linear" || r.type == "dynamic" || r.type == "llama3" || r.type == "yarn",
                   "model config: rope scaling type '", r.type, "' is not supported");
  RETROINFER_CHECK(std::isfinite(r.factor) && r.factor > 0, "model config: rope scaling factor = ", r.factor,
                   " must be positive");
  if (r.type == "llama3") {
    RETROINFER_CHECK(r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor,
                     "model config: llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor, got ",
                     r.low_freq_factor, " and ", r.high_freq_factor);
    RETROINFER_CHECK(r.original_max_position > 0, "model config: llama3 rope scaling needs "
                     "original_max_position_embeddings > 0");
  }
  if (r.type == "yarn") {
    RETROINFER_CHECK(r.beta_fast > 0 && r.beta_slow > 0, "model config: yarn beta_fast and beta_slow must be positive");
    RETROINFER_CHECK(r.attention_factor >= 0, "model config: yarn attention_factor must be >= 0 (0 = derive)");
    RETROINFER_CHECK(r.original_max_position > 0, "model config: yarn rope scaling needs an original context length");
  }
  if (r.type == "dynamic")
    RETROINFER_CHECK(r.original_max_position > 0, "model config: dynamic rope scaling needs "
                     "max_position_embeddings > 0");
}

}  // namespace retroinfer
