// StreamingDecoder: returns only complete UTF-8 text, holding back an incomplete tail.
#include "retroinfer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace retroinfer {
namespace {
constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
}

StreamingDecoder::StreamingDecoder(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(&tokenizer), skip_special_(skip_special) {}

std::string StreamingDecoder::push(TokenId id) {
  const std::string& piece = tokenizer_->token_to_piece(id);  // throws for a bad id before any change
  if (skip_special_ && tokenizer_->is_control(id)) return {};
  pending_ += piece;
  std::string out;
  size_t pos = 0;
  while (pos < pending_.size()) {
    const size_t len = tokenizer::utf8_valid_prefix_len(pending_, pos);
    if (len > 0) {
      out.append(pending_, pos, len);
      pos += len;
    } else if (tokenizer::utf8_incomplete_len(pending_, pos) == pending_.size() - pos) {
      break;  // an incomplete sequence at the end: wait for more bytes
    } else {
      out += kReplacement;  // a byte that can never be valid here
      ++pos;
    }
  }
  pending_.erase(0, pos);
  return out;
}

std::string StreamingDecoder::flush() {
  std::string out = pending_.empty() ? std::string() : std::string(kReplacement);
  pending_.clear();
  return out;
}

}  // namespace retroinfer
