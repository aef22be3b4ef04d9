#include "engine/model_tokenizer.h"

#include <filesystem>

#include "retroinfer/error.h"

namespace retroinfer {

std::unique_ptr<Tokenizer> load_model_tokenizer(const ModelFile& file) {
  if (const GgufMetadata* m = file.gguf_metadata()) {
    GgufVocab v;
    v.tokens = m->get_string_array("tokenizer.ggml.tokens");
    if (m->has("tokenizer.ggml.merges")) v.merges = m->get_string_array("tokenizer.ggml.merges");
    if (m->has("tokenizer.ggml.token_type"))
      for (int64_t t : m->get_int_array("tokenizer.ggml.token_type")) v.token_types.push_back(static_cast<int32_t>(t));
    v.model = m->get_string_or("tokenizer.ggml.model", "gpt2");
    v.pre = m->get_string_or("tokenizer.ggml.pre", "default");
    v.bos_id = m->get_int_or("tokenizer.ggml.bos_token_id", -1);
    v.eos_id = m->get_int_or("tokenizer.ggml.eos_token_id", -1);
    v.eot_id = m->get_int_or("tokenizer.ggml.eot_token_id", -1);
    v.pad_id = m->get_int_or("tokenizer.ggml.padding_token_id", -1);
    if (m->has("tokenizer.ggml.add_bos_token")) v.add_bos = m->get_bool("tokenizer.ggml.add_bos_token");
    v.chat_template = m->get_string_or("tokenizer.chat_template", "");
    return Tokenizer::from_vocab(v);
  }
  namespace fs = std::filesystem;
  fs::path p(file.path());
  fs::path dir = fs::is_directory(p) ? p : p.parent_path();
  const fs::path tj = dir / "tokenizer.json";
  RETROINFER_CHECK(fs::exists(tj), "model ", file.path(), ": no tokenizer.json beside the weights (", tj.string(),
                   "); copy it from the model's repository or pass a GGUF file");
  return Tokenizer::from_json_file(tj.string());
}

}  // namespace retroinfer
