// Internal state of retroinfer::Tokenizer and the loader-neutral description both loaders fill.
#pragma once

#include <array>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "retroinfer/tokenizer.h"
#include "tokenizer/flat_map.h"
#include "tokenizer/pre_tokenizer.h"

namespace retroinfer {
namespace tokenizer {

// A token recognised in the raw text before pre-tokenization (Hugging Face added_tokens; GGUF control and
// user-defined tokens).
struct AddedToken {
  TokenId id = -1;
  std::string content;  // literal bytes matched in the text
  bool special = false; // control token: skipped by decode(skip_special), not matched when !parse_special
  bool lstrip = false;  // the match swallows ASCII whitespace on its left
  bool rstrip = false;  // the match swallows ASCII whitespace on its right
};

// Everything a loader extracts from its file; build_tokenizer_impl validates it and builds the tables.
struct TokenizerSpec {
  std::string origin;                                      // file name or "GGUF vocab", for error messages
  std::vector<std::pair<std::string, TokenId>> vocab;      // BPE model vocabulary (byte-level mapped text)
  std::vector<std::pair<std::string, std::string>> merges; // index = rank
  std::vector<AddedToken> added;
  std::vector<std::pair<std::string, bool>> regexes;       // (pattern, literal), applied in order
  bool nfc = false;                 // NFC-normalise each text segment before pre-tokenization
  bool add_prefix_space = false;    // ByteLevel add_prefix_space: prepend ' ' to segments lacking one
  bool ignore_merges = false;       // a word that is itself in the vocabulary becomes one token
  std::optional<std::string> unk;   // BPE model.unk_token: stands for a byte with no token (else dropped)
  bool fuse_unk = false;            // consecutive unknown bytes give one unk token
  std::vector<TokenId> prefix;      // added by encode(add_special=true) before the text
  std::vector<TokenId> suffix;      // ... and after it
  std::optional<TokenId> bos, eos;  // explicit ids (GGUF, tokenizer_config.json); else guessed by name
  std::vector<TokenId> eog;         // explicit end-of-generation ids, completed by name
  std::string chat_template;        // Jinja source, only used to detect the chat format
};

struct MergeEntry {
  int32_t rank;
  TokenId result;
};

}  // namespace tokenizer

struct Tokenizer::Impl {
  std::vector<std::string> texts;   // [vocab_size] vocabulary string per id ("" for a hole)
  std::vector<std::string> pieces;  // [vocab_size] decoded bytes per id
  std::vector<TokenType> types;     // [vocab_size]; kUndefined marks a hole (id used by no token)
  tokenizer::StringIdIndex vocab;      // BPE vocabulary (kNormal tokens): mapped text -> id, into texts
  tokenizer::StringIdIndex all_texts;  // every token text -> id (added tokens win), into texts
  tokenizer::FlatU64Map<tokenizer::MergeEntry> merges;  // key (left << 32 | right) -> rank, result
  std::array<TokenId, 256> byte_ids{};                   // id of each single-byte token, -1 if missing
  std::vector<tokenizer::AddedToken> added;
  std::array<std::vector<uint32_t>, 256> added_by_first_byte;  // indices into added, longest first
  tokenizer::PreTokenizer pre;
  bool nfc = false;
  bool add_prefix_space = false;
  bool ignore_merges = false;
  std::optional<TokenId> unk;  // emitted for a byte with no token; without it such bytes are dropped (as HF)
  bool fuse_unk = false;
  std::vector<TokenId> prefix, suffix;
  std::optional<TokenId> bos, eos;
  std::vector<TokenId> eog;
  ChatFormat chat_format = ChatFormat::kNone;

  // Per-word cache: raw word bytes -> ids. Guarded by cache_mutex; cleared when it reaches
  // kCacheMaxEntries (bounded memory: ~64K words x ~100 B).
  static constexpr size_t kCacheMaxEntries = 1u << 16;
  static constexpr size_t kCacheMaxWordBytes = 128;  // longer words are rare and not worth caching
  mutable std::mutex cache_mutex;
  mutable std::unordered_map<std::string, std::vector<TokenId>> cache;

  void encode_plain(std::string_view text, std::vector<TokenId>& out) const;
  void encode_word(std::string_view word, std::vector<TokenId>& out) const;
  void bpe(std::string_view word, std::vector<TokenId>& out) const;
  void check_id(TokenId id, const char* what) const;
};

namespace tokenizer {
std::unique_ptr<Tokenizer::Impl> build_tokenizer_impl(TokenizerSpec spec);
ChatFormat detect_chat_format_from_vocab(const Tokenizer::Impl& impl);
}  // namespace tokenizer

}  // namespace retroinfer
