// Byte-level BPE tokenizer (GPT-2 / Llama-3 / Qwen2 / SmolLM2 style) and hard-coded chat templates.
//
// Load from a Hugging Face tokenizer.json (Tokenizer::from_json_file) or from the vectors stored in GGUF
// metadata (Tokenizer::from_vocab with a GgufVocab filled by the model loader). See docs/tokenizer.md.
//
// Threading contract: a Tokenizer is immutable after construction except for its internal per-word cache,
// which is guarded by a mutex; encode/decode/token_to_piece may be called concurrently from any threads.
// set_add_bos is not thread-safe (call it before sharing the tokenizer). StreamingDecoder is
// single-threaded and borrows its Tokenizer, which must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace retroinfer {

using TokenId = int32_t;

// Token kinds, numbered as in GGUF `tokenizer.ggml.token_type`.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,       // a byte-level BPE token; its text is the byte-to-unicode mapped form of its bytes
  kUnknown = 2,
  kControl = 3,      // special token (<|eot_id|>, <|im_start|>): recognised in text, skipped by skip_special
  kUserDefined = 4,  // added, non-special token: recognised in text, its text is its literal bytes
  kUnused = 5,
  kByte = 6,         // SentencePiece byte token <0xAB> (not used by byte-level BPE; treated as kNormal)
};

// The tokenizer part of GGUF metadata, as plain vectors so that the model loader can fill it without this
// module depending on the GGUF reader. Field names follow the GGUF keys.
struct GgufVocab {
  std::vector<std::string> tokens;        // tokenizer.ggml.tokens, index = token id
  std::vector<std::string> merges;        // tokenizer.ggml.merges, "left right", index = merge rank
  std::vector<int32_t> token_types;       // tokenizer.ggml.token_type (TokenType values); empty = all normal
  std::string model = "gpt2";             // tokenizer.ggml.model; only "gpt2" (byte-level BPE) is supported
  std::string pre = "default";            // tokenizer.ggml.pre: "llama-bpe", "qwen2", "smollm", "gpt2", ...
  int64_t bos_id = -1;                    // tokenizer.ggml.bos_token_id, -1 when absent
  int64_t eos_id = -1;                    // tokenizer.ggml.eos_token_id, -1 when absent
  int64_t eot_id = -1;                    // tokenizer.ggml.eot_token_id, -1 when absent
  int64_t pad_id = -1;                    // tokenizer.ggml.padding_token_id, -1 when absent
  std::optional<bool> add_bos;            // tokenizer.ggml.add_bos_token; absent = true for llama-bpe only
  std::string chat_template;              // tokenizer.chat_template, "" when absent
};

class GgufMetadata;  // include/retroinfer/model_file.h

// Reads the tokenizer.* keys of GGUF metadata (ModelFile::gguf_metadata()) into a GgufVocab. Throws Error
// naming the key when a required one (tokenizer.ggml.model, .tokens, and .merges for gpt2) is missing or
// a key has the wrong type.
GgufVocab gguf_vocab_from_metadata(const GgufMetadata& metadata);

struct ChatMessage {
  std::string role;     // "system", "user", "assistant"
  std::string content;  // UTF-8 text
};

// Hard-coded chat formats (no Jinja engine). See docs/tokenizer.md for the exact strings.
enum class ChatFormat {
  kNone,     // no template known: apply_chat_template throws
  kLlama3,   // <|begin_of_text|><|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|>
  kChatML,   // <|im_start|>role\ncontent<|im_end|>\n (Qwen3 without tools/thinking, generic ChatML)
  kQwen2,    // ChatML + default system "You are a helpful assistant."
  kQwen25,   // ChatML + default system "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
  kQwen3,    // ChatML; a final assistant turn after the last user turn gets an empty <think></think> block
  kSmolLM2,  // ChatML + default system "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
};

// Parses "llama3", "chatml", "qwen2", "qwen2.5", "qwen3", "smollm2"; throws Error otherwise.
ChatFormat parse_chat_format(std::string_view name);
std::string_view chat_format_name(ChatFormat format);
// Guesses the format from a Jinja template string (GGUF tokenizer.chat_template); kNone if unrecognised.
ChatFormat detect_chat_format_from_template(std::string_view jinja_template);
// Renders messages; add_generation_prompt appends the assistant header. Throws Error for kNone.
std::string apply_chat_template(ChatFormat format, std::span<const ChatMessage> messages,
                                bool add_generation_prompt);
// apply_chat_template's text and where each message's content lies in it: [begin, end) byte offsets, in
// message order (a content the template trims is recorded trimmed). Throws Error for kNone.
struct ChatRendering {
  std::string text;
  std::vector<std::pair<size_t, size_t>> content_spans;
};
ChatRendering render_chat_template(ChatFormat format, std::span<const ChatMessage> messages,
                                   bool add_generation_prompt);

class Tokenizer {
 public:
  // Loads a Hugging Face tokenizer.json (model.type "BPE", byte-level). Throws Error on anything else.
  static std::unique_ptr<Tokenizer> from_json_file(const std::string& path);
  static std::unique_ptr<Tokenizer> from_json_string(std::string_view json_text,
                                                     const std::string& origin = "<string>");
  // Builds from GGUF metadata vectors. Throws Error on an unknown `pre` name or an inconsistent vocabulary.
  static std::unique_ptr<Tokenizer> from_vocab(const GgufVocab& vocab);

  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text -> token ids. Valid UTF-8 is expected; a byte outside a valid sequence becomes its own byte token,
  // so decode(encode(s)) == s for any bytes when the vocabulary has a token for every byte (Llama 3, Qwen,
  // GPT-2). A byte without a token (SmolLM2 lacks 21) becomes unk_token if any, else is dropped (as in HF).
  // parse_special: recognise added/special tokens written in the text (e.g. "<|eot_id|>") as single ids;
  // false treats them as plain text (use for untrusted user content). add_special: add the BOS/EOS that
  // the tokenizer's post-processor (or GGUF add_bos) prescribes.
  std::vector<TokenId> encode(std::string_view text, bool add_special = false, bool parse_special = true) const;
  // Ids -> bytes. Throws Error for an id outside [0, vocab_size()) or a hole in the vocabulary.
  // skip_special drops control tokens. The result is the exact concatenation of token_to_piece.
  std::string decode(std::span<const TokenId> ids, bool skip_special = false) const;
  // The bytes one token stands for (may be part of a UTF-8 sequence). Throws Error when out of range.
  const std::string& token_to_piece(TokenId id) const;
  // The vocabulary string of a token (byte-level mapped form for normal tokens, e.g. "Ġthe").
  const std::string& token_text(TokenId id) const;
  std::optional<TokenId> token_to_id(std::string_view token_text) const;
  TokenType token_type(TokenId id) const;
  bool is_control(TokenId id) const { return token_type(id) == TokenType::kControl; }

  int32_t vocab_size() const;
  std::optional<TokenId> bos_id() const;
  std::optional<TokenId> eos_id() const;
  // End-of-generation ids (eos, eot, <|eot_id|>, <|eom_id|>, <|im_end|>, <|endoftext|> when present).
  const std::vector<TokenId>& eog_ids() const;
  bool is_eog(TokenId id) const;
  // Ids encode(text, add_special=true) puts before and after the text.
  const std::vector<TokenId>& special_prefix() const;
  const std::vector<TokenId>& special_suffix() const;
  void set_add_bos(bool add_bos);  // prefix = [bos] or []; throws when there is no BOS token

  // Chat template: from the GGUF template string when given, else guessed from the vocabulary.
  ChatFormat chat_format() const;
  void set_chat_format(ChatFormat format);
  std::string apply_chat_template(std::span<const ChatMessage> messages, bool add_generation_prompt) const;
  // The rendered template's tokens: encode(apply_chat_template(...), false, true), except that the messages'
  // contents are encoded with parse_special = parse_special_in_content. false (for untrusted messages) keeps
  // a "<|im_end|>" written in a message as text, so that a message cannot end its turn or open another role's;
  // the template's own markup is always special tokens.
  std::vector<TokenId> encode_chat(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                   bool parse_special_in_content) const;

  struct Impl;

 private:
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Incremental detokenizer for streaming output: push ids one by one, get back the text that is complete.
// An incomplete UTF-8 sequence at the end is held back until the next token completes it; bytes that can
// never form valid UTF-8 are replaced by U+FFFD, so every returned string is valid UTF-8. For ids whose
// decode() is valid UTF-8, the concatenation of push() results and flush() equals decode(ids).
class StreamingDecoder {
 public:
  explicit StreamingDecoder(const Tokenizer& tokenizer, bool skip_special = false);
  std::string push(TokenId id);  // throws Error for an out-of-range id (state unchanged)
  std::string flush();           // returns what is held back (an incomplete tail becomes U+FFFD); resets
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::string pending_;  // bytes received but not yet returned (a UTF-8 prefix of at most 3 bytes)
};

namespace tokenizer {
// True when s is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
bool is_valid_utf8(std::string_view s);
// Length of the well-formed UTF-8 sequence that starts at s[pos], or 0 when the bytes there are not one.
size_t utf8_valid_prefix_len(std::string_view s, size_t pos);
}  // namespace tokenizer

}  // namespace retroinfer
