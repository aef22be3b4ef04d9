// Byte-level BPE: table building, encode, decode. Loaders live in tokenizer_json.cpp / tokenizer_gguf.cpp.
#include "retroinfer/tokenizer.h"

#include <algorithm>
#include <queue>

#include "retroinfer/error.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/tokenizer_impl.h"
#include "tokenizer/utf8.h"

namespace retroinfer {
namespace tokenizer {
namespace {

uint64_t merge_key(TokenId left, TokenId right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

}  // namespace

// Ids past twice the entries a vocabulary may leave unused (reserved ranges, padding to a round size).
constexpr size_t kTokenIdSlack = 65536;

std::unique_ptr<Tokenizer::Impl> build_tokenizer_impl(TokenizerSpec spec) {
  auto impl = std::make_unique<Tokenizer::Impl>();
  const std::string& origin = spec.origin;
  TokenId max_id = -1;
  for (const auto& [text, id] : spec.vocab) {
    RETROINFER_CHECK(id >= 0, "tokenizer ", origin, ": negative id ", id, " for token '", text, "'");
    max_id = std::max(max_id, id);
  }
  for (const auto& a : spec.added) {
    RETROINFER_CHECK(a.id >= 0, "tokenizer ", origin, ": negative id ", a.id, " for added token '", a.content, "'");
    RETROINFER_CHECK(!a.content.empty(), "tokenizer ", origin, ": added token ", a.id, " has empty content");
    max_id = std::max(max_id, a.id);
  }
  RETROINFER_CHECK(max_id >= 0, "tokenizer ", origin, ": empty vocabulary");
  // Ids index dense tables (text, piece and type per id): a vocabulary's ids are 0..N-1 with added tokens at most
  // a little past it, so an id far beyond the entries (61,345,678 for a few hundred: ~4 GB of tables) is refused.
  const size_t entries = spec.vocab.size() + spec.added.size();
  const size_t max_dense = 2 * entries + kTokenIdSlack;
  RETROINFER_CHECK(max_id < (1 << 30) && static_cast<size_t>(max_id) < max_dense, "tokenizer ", origin, ": token id ",
                   max_id, " is implausibly large for ", entries, " entries (ids index dense tables: at most ",
                   max_dense - 1, ")");
  const size_t n = static_cast<size_t>(max_id) + 1;
  impl->texts.assign(n, std::string());
  impl->pieces.assign(n, std::string());
  impl->types.assign(n, TokenType::kUndefined);

  const ByteLevelMap& bl = ByteLevelMap::instance();
  for (auto& [text, id] : spec.vocab) {
    RETROINFER_CHECK(impl->types[id] == TokenType::kUndefined, "tokenizer ", origin, ": id ", id,
                     " is used by two vocabulary entries ('", impl->texts[id], "' and '", text, "')");
    std::string piece;
    if (!bl.decode(text, piece)) piece = text;  // not byte-level text: its own bytes (as HF's decoder does)
    impl->pieces[id] = std::move(piece);
    impl->types[id] = TokenType::kNormal;
    impl->texts[id] = std::move(text);
  }
  for (const auto& a : spec.added) {
    impl->texts[a.id] = a.content;
    impl->pieces[a.id] = a.content;
    impl->types[a.id] = a.special ? TokenType::kControl : TokenType::kUserDefined;
  }
  // texts is final from here on: the indexes point into it. A repeated text keeps its first id.
  impl->vocab.reset(&impl->texts, spec.vocab.size());
  for (const auto& entry : spec.vocab) {
    if (impl->types[entry.second] == TokenType::kNormal) impl->vocab.insert(entry.second, /*overwrite=*/false);
  }
  impl->all_texts.reset(&impl->texts, n);
  for (size_t id = 0; id < n; ++id) {
    if (impl->types[id] == TokenType::kNormal) impl->all_texts.insert(static_cast<TokenId>(id), false);
  }
  for (const auto& a : spec.added) impl->all_texts.insert(a.id, /*overwrite=*/true);

  for (int b = 0; b < 256; ++b) impl->byte_ids[b] = impl->vocab.find(bl.byte_to_text(static_cast<uint8_t>(b)));

  impl->merges.reserve(spec.merges.size());
  std::string joined;
  for (size_t rank = 0; rank < spec.merges.size(); ++rank) {
    const auto& [left, right] = spec.merges[rank];
    // GGUF files mark some tokens control that a tokenizer.json keeps in model.vocab: fall back to them.
    auto find_any = [&](std::string_view t) {
      const TokenId id = impl->vocab.find(t);
      return id >= 0 ? id : impl->all_texts.find(t);
    };
    const TokenId l = find_any(left);
    const TokenId r = find_any(right);
    joined = left;
    joined += right;
    const TokenId m = find_any(joined);
    RETROINFER_CHECK(l >= 0 && r >= 0 && m >= 0, "tokenizer ",
                     origin, ": merge #", rank, " '", left, " ", right, "' uses a token missing from the vocabulary",
                     "; the file is inconsistent");
    // A repeated pair keeps its first (lowest) rank, as Hugging Face does.
    impl->merges.insert(merge_key(l, r), MergeEntry{static_cast<int32_t>(rank), m});
  }

  impl->added = std::move(spec.added);
  for (uint32_t i = 0; i < impl->added.size(); ++i) {
    impl->added_by_first_byte[static_cast<uint8_t>(impl->added[i].content[0])].push_back(i);
  }
  for (auto& v : impl->added_by_first_byte) {
    std::stable_sort(v.begin(), v.end(), [&](uint32_t a, uint32_t b) {
      return impl->added[a].content.size() > impl->added[b].content.size();
    });
  }

  for (const auto& [pattern, literal] : spec.regexes) impl->pre.add_regex(pattern, literal);
  impl->nfc = spec.nfc;
  impl->add_prefix_space = spec.add_prefix_space;
  impl->ignore_merges = spec.ignore_merges;
  if (spec.unk) {
    const TokenId unk = impl->all_texts.find(*spec.unk);
    RETROINFER_CHECK(unk >= 0, "tokenizer ", origin, ": unk_token '", *spec.unk, "' is not in the vocabulary");
    impl->unk = unk;
  }
  impl->fuse_unk = spec.fuse_unk;
  impl->prefix = std::move(spec.prefix);
  impl->suffix = std::move(spec.suffix);
  for (TokenId id : impl->prefix) impl->check_id(id, "special prefix token");
  for (TokenId id : impl->suffix) impl->check_id(id, "special suffix token");

  auto find = [&](std::string_view text) -> std::optional<TokenId> {
    const TokenId id = impl->all_texts.find(text);
    return id < 0 ? std::nullopt : std::optional<TokenId>(id);
  };
  impl->bos = spec.bos ? spec.bos : find("<|begin_of_text|>");
  if (!impl->bos && !impl->prefix.empty()) impl->bos = impl->prefix.front();
  impl->eos = spec.eos;
  for (const char* name : {"<|end_of_text|>", "<|endoftext|>", "<|im_end|>", "</s>"}) {
    if (!impl->eos) impl->eos = find(name);
  }
  if (impl->bos) impl->check_id(*impl->bos, "BOS token");
  if (impl->eos) impl->check_id(*impl->eos, "EOS token");
  impl->eog = std::move(spec.eog);
  if (impl->eos) impl->eog.push_back(*impl->eos);
  for (const char* name : {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>", "<|im_end|>", "<|endoftext|>"}) {
    if (auto id = find(name)) impl->eog.push_back(*id);
  }
  for (TokenId id : impl->eog) impl->check_id(id, "end-of-generation token");
  std::sort(impl->eog.begin(), impl->eog.end());
  impl->eog.erase(std::unique(impl->eog.begin(), impl->eog.end()), impl->eog.end());

  impl->chat_format = detect_chat_format_from_template(spec.chat_template);
  if (impl->chat_format == ChatFormat::kNone) impl->chat_format = detect_chat_format_from_vocab(*impl);
  return impl;
}

ChatFormat detect_chat_format_from_vocab(const Tokenizer::Impl& impl) {
  auto has = [&](const char* t) { return impl.all_texts.find(t) >= 0; };
  if (has("<|start_header_id|>") && has("<|eot_id|>")) return ChatFormat::kLlama3;
  if (has("<|im_start|>")) {
    if (has("<think>")) return ChatFormat::kQwen3;
    if (has("<|vision_start|>")) return ChatFormat::kQwen25;
    if (has("<repo_name>") && has("<jupyter_start>")) return ChatFormat::kSmolLM2;  // StarCoder-family vocab
    return ChatFormat::kChatML;
  }
  return ChatFormat::kNone;
}

}  // namespace tokenizer

using tokenizer::ByteLevelMap;

void Tokenizer::Impl::check_id(TokenId id, const char* what) const {
  RETROINFER_CHECK(id >= 0 && static_cast<size_t>(id) < types.size() && types[id] != TokenType::kUndefined,
                   "tokenizer: ", what, " id ", id, " is not in the vocabulary (size ", types.size(), ")");
}

// Hugging Face's BPE merge loop: repeatedly apply the lowest-ranked adjacent pair (leftmost on ties), via a
// min-heap of candidate pairs whose entries are re-validated when popped. O(n log n) in the word length.
void Tokenizer::Impl::bpe(std::string_view word, std::vector<TokenId>& out) const {
  struct Symbol {
    TokenId id;
    int32_t prev, next;  // -1 at the ends
    bool alive;
  };
  struct Candidate {
    int32_t rank, pos;
    TokenId result;
    bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
  };
  RETROINFER_CHECK(word.size() < (1u << 31), "tokenizer: a single pre-token of ", word.size(),
                   " bytes is too long for BPE (int32 positions)");
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  for (unsigned char b : word) {
    TokenId id = byte_ids[b];
    if (id < 0) {
      // A byte with no token (SmolLM2 lacks 21 of them): unk if the model has one, else dropped, as
      // Hugging Face tokenizers and llama.cpp do. Its neighbours then become adjacent and may merge.
      if (!unk || (fuse_unk && !sym.empty() && sym.back().id == *unk)) continue;
      id = *unk;
    }
    sym.push_back(Symbol{id, 0, 0, true});
  }
  const auto n = static_cast<int32_t>(sym.size());
  for (int32_t i = 0; i < n; ++i) {
    sym[i].prev = i - 1;
    sym[i].next = i + 1 < n ? i + 1 : -1;
  }
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push_pair = [&](int32_t pos) {
    const int32_t nx = sym[pos].next;
    if (nx < 0) return;
    const tokenizer::MergeEntry* m = merges.find(tokenizer::merge_key(sym[pos].id, sym[nx].id));
    if (m != nullptr) heap.push(Candidate{m->rank, pos, m->result});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_pair(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    Symbol& s = sym[c.pos];
    if (!s.alive || s.next < 0) continue;
    const tokenizer::MergeEntry* m = merges.find(tokenizer::merge_key(s.id, sym[s.next].id));
    if (m == nullptr || m->result != c.result) continue;  // stale: the pair changed
    Symbol& right = sym[s.next];
    right.alive = false;
    s.id = c.result;
    s.next = right.next;
    if (s.next >= 0) sym[s.next].prev = c.pos;
    if (s.prev >= 0) push_pair(s.prev);
    push_pair(c.pos);
  }
  for (int32_t i = n > 0 ? 0 : -1; i >= 0; i = sym[i].next) out.push_back(sym[i].id);
}

void Tokenizer::Impl::encode_word(std::string_view word, std::vector<TokenId>& out) const {
  if (word.size() == 1) {
    bpe(word, out);
    return;
  }
  const bool cacheable = word.size() <= kCacheMaxWordBytes;
  std::string key(word);
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    auto it = cache.find(key);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  std::vector<TokenId> ids;
  if (ignore_merges) {
    std::string mapped;
    ByteLevelMap::instance().encode(word, mapped);
    const TokenId id = vocab.find(mapped);
    if (id >= 0) ids.push_back(id);
  }
  if (ids.empty()) bpe(word, ids);
  out.insert(out.end(), ids.begin(), ids.end());
  if (cacheable) {
    std::lock_guard<std::mutex> lock(cache_mutex);
    if (cache.size() >= kCacheMaxEntries) cache.clear();
    cache.emplace(std::move(key), std::move(ids));
  }
}

// Text between added tokens: valid UTF-8 runs are normalised, pre-tokenized and BPE-encoded; each byte that
// is not part of valid UTF-8 becomes its own single-byte token (so any byte string round-trips).
void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<TokenId>& out) const {
  if (text.empty()) return;
  std::string prefixed;
  if (add_prefix_space && text.front() != ' ') {
    prefixed = " ";
    prefixed += text;
    text = prefixed;
  }
  std::vector<std::string_view> words;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = pos;
    while (end < text.size()) {
      const size_t len = tokenizer::utf8_valid_prefix_len(text, end);
      if (len == 0) break;
      end += len;
    }
    if (end > pos) {
      std::string normalised;
      std::string_view run = text.substr(pos, end - pos);
      if (nfc) {
        normalised = tokenizer::nfc(run);
        run = normalised;
      }
      words.clear();
      pre.split(run, words);
      for (std::string_view w : words) encode_word(w, out);
      pos = end;
    }
    if (pos < text.size()) {  // one invalid byte
      bpe(text.substr(pos, 1), out);
      ++pos;
    }
  }
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

std::vector<TokenId> Tokenizer::encode(std::string_view text, bool add_special, bool parse_special) const {
  const Impl& im = *impl_;
  std::vector<TokenId> out;
  out.reserve(text.size() / 3 + 8);
  if (add_special) out.insert(out.end(), im.prefix.begin(), im.prefix.end());
  // Split on added tokens: leftmost match, longest at that position.
  size_t seg_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const auto& cands = im.added_by_first_byte[static_cast<uint8_t>(text[pos])];
    const tokenizer::AddedToken* hit = nullptr;
    for (uint32_t idx : cands) {
      const auto& a = im.added[idx];
      if (a.special && !parse_special) continue;
      if (text.compare(pos, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) {
      ++pos;
      continue;
    }
    size_t begin = pos;
    size_t end = pos + hit->content.size();
    if (hit->lstrip) {
      while (begin > seg_start && tokenizer::is_ascii_space(text[begin - 1])) --begin;
    }
    if (hit->rstrip) {
      while (end < text.size() && tokenizer::is_ascii_space(text[end])) ++end;
    }
    im.encode_plain(text.substr(seg_start, begin - seg_start), out);
    out.push_back(hit->id);
    seg_start = pos = end;
  }
  im.encode_plain(text.substr(seg_start), out);
  if (add_special) out.insert(out.end(), im.suffix.begin(), im.suffix.end());
  return out;
}

std::string Tokenizer::decode(std::span<const TokenId> ids, bool skip_special) const {
  std::string out;
  for (TokenId id : ids) {
    const std::string& piece = token_to_piece(id);
    if (skip_special && impl_->types[id] == TokenType::kControl) continue;
    out += piece;
  }
  return out;
}

const std::string& Tokenizer::token_to_piece(TokenId id) const {
  impl_->check_id(id, "decode:");
  return impl_->pieces[id];
}

const std::string& Tokenizer::token_text(TokenId id) const {
  impl_->check_id(id, "token_text:");
  return impl_->texts[id];
}

std::optional<TokenId> Tokenizer::token_to_id(std::string_view token_text) const {
  const TokenId id = impl_->all_texts.find(token_text);
  return id < 0 ? std::nullopt : std::optional<TokenId>(id);
}

TokenType Tokenizer::token_type(TokenId id) const {
  impl_->check_id(id, "token_type:");
  return impl_->types[id];
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->types.size()); }
std::optional<TokenId> Tokenizer::bos_id() const { return impl_->bos; }
std::optional<TokenId> Tokenizer::eos_id() const { return impl_->eos; }
const std::vector<TokenId>& Tokenizer::eog_ids() const { return impl_->eog; }
bool Tokenizer::is_eog(TokenId id) const {
  return std::binary_search(impl_->eog.begin(), impl_->eog.end(), id);
}
const std::vector<TokenId>& Tokenizer::special_prefix() const { return impl_->prefix; }
const std::vector<TokenId>& Tokenizer::special_suffix() const { return impl_->suffix; }

void Tokenizer::set_add_bos(bool add_bos) {
  if (!add_bos) {
    impl_->prefix.clear();
    return;
  }
  RETROINFER_CHECK(impl_->bos.has_value(), "tokenizer: set_add_bos(true) but the vocabulary has no BOS token");
  impl_->prefix = {*impl_->bos};
}

ChatFormat Tokenizer::chat_format() const { return impl_->chat_format; }
void Tokenizer::set_chat_format(ChatFormat format) { impl_->chat_format = format; }
std::string Tokenizer::apply_chat_template(std::span<const ChatMessage> messages, bool add_generation_prompt) const {
  return retroinfer::apply_chat_template(impl_->chat_format, messages, add_generation_prompt);
}

std::vector<TokenId> Tokenizer::encode_chat(std::span<const ChatMessage> messages, bool add_generation_prompt,
                                            bool parse_special_in_content) const {
  const ChatRendering r = render_chat_template(impl_->chat_format, messages, add_generation_prompt);
  if (parse_special_in_content) return encode(r.text, false, true);
  // The markup and the contents are encoded apart: every content is bounded by special tokens of the
  // markup, where encode() splits the text anyway, so the pieces tokenise as the whole would apart from the
  // special tokens a content spelled out.
  std::vector<TokenId> ids;
  const std::string_view text = r.text;
  size_t pos = 0;
  auto add = [&](std::string_view piece, bool parse_special) {
    if (piece.empty()) return;
    const std::vector<TokenId> part = encode(piece, false, parse_special);
    ids.insert(ids.end(), part.begin(), part.end());
  };
  for (const auto& [begin, end] : r.content_spans) {
    add(text.substr(pos, begin - pos), true);
    add(text.substr(begin, end - begin), false);
    pos = end;
  }
  add(text.substr(pos), true);
  return ids;
}

}  // namespace retroinfer
