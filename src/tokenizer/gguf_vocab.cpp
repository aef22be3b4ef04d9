// GgufMetadata (the io module's GGUF key/value map) -> GgufVocab.
#include "retroinfer/error.h"
#include "retroinfer/model_file.h"
#include "retroinfer/tokenizer.h"

namespace retroinfer {

GgufVocab gguf_vocab_from_metadata(const GgufMetadata& md) {
  GgufVocab v;
  v.model = md.get_string("tokenizer.ggml.model");
  v.tokens = md.get_string_array("tokenizer.ggml.tokens");
  if (md.has("tokenizer.ggml.merges") || v.model == "gpt2") v.merges = md.get_string_array("tokenizer.ggml.merges");
  if (md.has("tokenizer.ggml.token_type")) {
    for (int64_t t : md.get_int_array("tokenizer.ggml.token_type")) {
      RETROINFER_CHECK(t >= INT32_MIN && t <= INT32_MAX, "GGUF tokenizer.ggml.token_type value ", t, " out of range");
      v.token_types.push_back(static_cast<int32_t>(t));
    }
  }
  v.pre = md.get_string_or("tokenizer.ggml.pre", "default");
  v.bos_id = md.get_int_or("tokenizer.ggml.bos_token_id", -1);
  v.eos_id = md.get_int_or("tokenizer.ggml.eos_token_id", -1);
  v.eot_id = md.get_int_or("tokenizer.ggml.eot_token_id", -1);
  v.pad_id = md.get_int_or("tokenizer.ggml.padding_token_id", -1);
  if (md.has("tokenizer.ggml.add_bos_token")) v.add_bos = md.get_bool("tokenizer.ggml.add_bos_token");
  v.chat_template = md.get_string_or("tokenizer.chat_template", "");
  return v;
}

}  // namespace retroinfer
