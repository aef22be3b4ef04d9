// Builds a Tokenizer from the tokenizer vectors of GGUF metadata (tokenizer.ggml.*).
#include "retroinfer/error.h"
#include "retroinfer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace retroinfer {

std::unique_ptr<Tokenizer> Tokenizer::from_vocab(const GgufVocab& v) {
  tokenizer::TokenizerSpec spec;
  spec.origin = "GGUF vocab";
  RETROINFER_CHECK(v.model == "gpt2", "tokenizer: GGUF tokenizer.ggml.model '", v.model,
                   "' is not supported (only 'gpt2', byte-level BPE)");
  RETROINFER_CHECK(!v.tokens.empty(), "tokenizer: GGUF tokenizer.ggml.tokens is empty");
  RETROINFER_CHECK(v.token_types.empty() || v.token_types.size() == v.tokens.size(),
                   "tokenizer: GGUF token_type has ", v.token_types.size(), " entries but tokens has ",
                   v.tokens.size(), "; the file is inconsistent");
  RETROINFER_CHECK(v.tokens.size() < (1u << 30), "tokenizer: GGUF vocabulary of ", v.tokens.size(),
                   " tokens is implausibly large");
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const auto id = static_cast<TokenId>(i);
    const int32_t type = v.token_types.empty() ? 1 : v.token_types[i];
    RETROINFER_CHECK(type >= 0 && type <= 6, "tokenizer: GGUF token ", i, " has unknown token_type ", type);
    if (type == static_cast<int32_t>(TokenType::kControl) || type == static_cast<int32_t>(TokenType::kUserDefined)) {
      RETROINFER_CHECK(!v.tokens[i].empty(), "tokenizer: GGUF token ", i, " (control/user-defined) is empty");
      spec.added.push_back({id, v.tokens[i], type == static_cast<int32_t>(TokenType::kControl), false, false});
    } else {
      spec.vocab.emplace_back(v.tokens[i], id);  // normal, unknown, unused, byte: plain BPE vocabulary
    }
  }
  spec.merges.reserve(v.merges.size());
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const std::string& s = v.merges[r];
    const size_t space = s.find(' ');
    RETROINFER_CHECK(space != std::string::npos && space > 0 && space + 1 < s.size(), "tokenizer: GGUF merge #", r,
                     " '", s, "' is not of the form 'left right'");
    spec.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
  }
  for (std::string_view re : tokenizer::regexes_for_gguf_pre(v.pre)) spec.regexes.emplace_back(std::string(re), false);
  const bool llama3 = v.pre == "llama-bpe" || v.pre == "llama3" || v.pre == "llama-v3";
  spec.ignore_merges = llama3;  // Llama-3's tokenizer.json sets model.ignore_merges
  // Qwen2's tokenizer.json has an NFC normaliser; GGUF does not record it, the pre name implies it.
  spec.nfc = v.pre == "qwen2" || v.pre == "deepseek-r1-qwen";
  auto id_of = [&](int64_t id, const char* what) -> std::optional<TokenId> {
    if (id < 0) return std::nullopt;
    RETROINFER_CHECK(static_cast<uint64_t>(id) < v.tokens.size(), "tokenizer: GGUF ", what, " ", id,
                     " is outside the vocabulary of ", v.tokens.size(), " tokens");
    return static_cast<TokenId>(id);
  };
  spec.bos = id_of(v.bos_id, "bos_token_id");
  spec.eos = id_of(v.eos_id, "eos_token_id");
  if (auto eot = id_of(v.eot_id, "eot_token_id")) spec.eog.push_back(*eot);
  id_of(v.pad_id, "padding_token_id");
  if (v.add_bos.value_or(llama3)) {
    RETROINFER_CHECK(spec.bos.has_value(), "tokenizer: GGUF asks to add BOS but has no bos_token_id");
    spec.prefix.push_back(*spec.bos);
  }
  spec.chat_template = v.chat_template;
  return std::unique_ptr<Tokenizer>(new Tokenizer(tokenizer::build_tokenizer_impl(std::move(spec))));
}

}  // namespace retroinfer
