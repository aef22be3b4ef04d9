// The one concrete ModelFile: tensors from memory-mapped files (safetensors or GGUF), looked up by Hugging
// Face name. Internal to src/io.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "io/mapped_file.h"
#include "retroinfer/model_file.h"

namespace retroinfer::io {

class LoadedModel final : public ModelFile {
 public:
  explicit LoadedModel(std::string path) : path_(std::move(path)) {}

  const ModelConfig& config() const override { return config_; }
  const TensorInfo* find(std::string_view hf_name) const override;
  std::vector<std::string> tensor_names() const override;
  const GgufMetadata* gguf_metadata() const override { return gguf_ ? &*gguf_ : nullptr; }
  std::string path() const override { return path_; }
  void check_files_unchanged() const override {
    for (const auto& f : files_) f->check_unchanged();
  }
  void release_pages(const TensorInfo& t) const override {
    for (const auto& f : files_) f->release_pages(t.data, t.nbytes);
  }

  // Building (only during open()).
  ModelConfig& mutable_config() { return config_; }
  void keep(std::shared_ptr<MappedFile> f) { files_.push_back(std::move(f)); }
  // Takes ownership of bytes that a tensor's data points into (e.g. rows reordered at open time).
  const uint8_t* own(std::vector<uint8_t> bytes);
  // Adds a tensor; throws Error naming `source` when the name is already present.
  void add(TensorInfo t, const std::string& source);
  void set_gguf(GgufMetadata m) { gguf_ = std::move(m); }

 private:
  std::string path_;
  ModelConfig config_;
  std::map<std::string, TensorInfo, std::less<>> tensors_;
  std::vector<std::shared_ptr<MappedFile>> files_;   // keep the mappings alive
  std::vector<std::vector<uint8_t>> owned_;           // reordered copies (GGUF q/k)
  std::optional<GgufMetadata> gguf_;
};

// Opens a .gguf file (gguf_model.cpp).
std::unique_ptr<ModelFile> open_gguf_model(const std::string& path);
// Opens safetensors: a directory, or a .safetensors file with config.json beside it
// (safetensors_model.cpp).
std::unique_ptr<ModelFile> open_safetensors_model(const std::string& path);

// Throws Error naming `file` unless every tensor the architecture needs is present with the shape
// the config implies (model_file.cpp). `tie_word_embeddings` decides whether lm_head.weight is needed.
void check_required_tensors(const ModelFile& m, const std::string& file);

}  // namespace retroinfer::io
