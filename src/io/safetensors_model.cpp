// Hugging Face safetensors checkpoints (single file or sharded with model.safetensors.index.json) plus
// config.json as a ModelFile.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "io/model_file_impl.h"
#include "io/safetensors_reader.h"
#include "retroinfer/error.h"

namespace retroinfer::io {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// Maps and parses one shard; adds its tensors (all, or only those `wanted` names when given).
void add_shard(LoadedModel& model, const std::string& file, const std::map<std::string, std::string>* weight_map,
               const std::string& shard_name) {
  auto mapped = std::make_shared<MappedFile>(file);
  SafetensorsContents s = parse_safetensors(mapped->data(), mapped->size(), file);
  model.keep(mapped);
  for (SafetensorsTensor& st : s.tensors) {
    if (weight_map != nullptr) {
      auto it = weight_map->find(st.name);
      if (it != weight_map->end() && it->second != shard_name) continue;  // the index says another shard
    }
    TensorInfo t;
    t.name = std::move(st.name);
    t.type = st.type;
    t.shape = std::move(st.shape);
    t.data = st.data;
    t.nbytes = st.nbytes;
    model.add(std::move(t), file);
  }
}

void open_sharded(LoadedModel& model, const fs::path& dir, const fs::path& index_path) {
  const std::string index_file = index_path.string();
  std::ifstream in(index_path, std::ios::binary);
  RETROINFER_CHECK(in.good(), index_file, ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  const json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  RETROINFER_CHECK(!j.is_discarded() && j.is_object(), index_file, ": not a JSON object");
  RETROINFER_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), index_file,
                   ": field 'weight_map' (tensor name -> shard file) is missing or not an object");
  std::map<std::string, std::string> weight_map;
  std::set<std::string> shards;
  for (const auto& [name, v] : j["weight_map"].items()) {
    RETROINFER_CHECK(v.is_string(), index_file, ": weight_map['", name, "'] must be a file name string");
    const std::string shard = v.get<std::string>();
    // Shards must sit beside the index: no directories, no '..'.
    RETROINFER_CHECK(!shard.empty() && shard.find('/') == std::string::npos && shard != "." && shard != "..",
                     index_file, ": weight_map['", name, "'] = '", shard, "' is not a plain file name");
    weight_map[name] = shard;
    shards.insert(shard);
  }
  for (const std::string& shard : shards) add_shard(model, (dir / shard).string(), &weight_map, shard);
  for (const auto& [name, shard] : weight_map)
    RETROINFER_CHECK(model.find(name) != nullptr, index_file, ": tensor '", name, "' is listed in shard '", shard,
                     "' but that file does not contain it");
}

}  // namespace

std::unique_ptr<ModelFile> open_safetensors_model(const std::string& path) {
  const fs::path p(path);
  const bool is_dir = fs::is_directory(p);
  const fs::path dir = is_dir ? p : (p.has_parent_path() ? p.parent_path() : fs::path("."));
  auto model = std::make_unique<LoadedModel>(path);
  model->mutable_config() = parse_hf_config((dir / "config.json").string());
  if (!is_dir) {
    add_shard(*model, path, nullptr, "");
  } else if (fs::exists(dir / "model.safetensors.index.json")) {
    open_sharded(*model, dir, dir / "model.safetensors.index.json");
  } else {
    RETROINFER_CHECK(fs::exists(dir / "model.safetensors"), path,
                     ": no model.safetensors or model.safetensors.index.json in this directory");
    add_shard(*model, (dir / "model.safetensors").string(), nullptr, "");
  }
  check_required_tensors(*model, path);
  return model;
}

}  // namespace retroinfer::io
