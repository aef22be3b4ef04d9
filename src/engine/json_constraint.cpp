#include "engine/json_constraint.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "retroinfer/error.h"

namespace retroinfer {
namespace {

// What may come next.
enum Mode : uint8_t {
  kStart,           // leading whitespace, then '{'
  kValue,           // a value (after ':' or an array's ',')
  kArrayFirst,      // a value or ']' (after '[')
  kObjectFirstKey,  // a key or '}' (after '{')
  kObjectKey,       // a key (after an object's ',')
  kColon,           // ':' after a key
  kAfterValue,      // ',' or the container's closing bracket
  kString,          // string bytes, '"', '\\'
  kStringEscape,    // the byte after '\\'
  kStringHex,       // aux hex digits of \uXXXX left (surrogate: see JsonPrefixState)
  kStringLowSlash,  // after a high surrogate \uD800-\uDBFF: the '\\' of its low surrogate
  kStringLowU,      // ... then its 'u'
  kStringUtf8,      // aux UTF-8 continuation bytes left (utf8_lead: the sequence's first byte)
  kNumberMinus,     // after '-': a digit
  kNumberZero,      // after a leading 0: '.', 'e', or the end
  kNumberInt,       // integer digits: more, '.', 'e', or the end
  kNumberDot,       // after '.': a digit
  kNumberFrac,      // fraction digits: more, 'e', or the end
  kNumberExp,       // after 'e': a sign or a digit
  kNumberExpSign,   // after the exponent's sign: a digit
  kNumberExpDigits, // exponent digits: more or the end
  kLiteral,         // the rest of true / false / null (aux: bytes matched)
  kDone,            // the top-level object is closed: trailing whitespace only
};

// JsonPrefixState::surrogate
enum Surrogate : uint8_t { kNoSurrogate, kFirstDigitD, kHighSeen, kLowPending };

constexpr const char* kLiterals[3] = {"true", "false", "null"};

bool is_ws(uint8_t c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(uint8_t c) { return c >= '0' && c <= '9'; }
bool is_hex(uint8_t c) { return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }

bool top_is_object(const JsonPrefixState& s) { return (s.objects >> (s.depth - 1)) & 1u; }

bool push(JsonPrefixState& s, bool object) {
  if (s.depth >= kMaxJsonDepth) return false;
  if (object)
    s.objects |= uint64_t{1} << s.depth;
  else
    s.objects &= ~(uint64_t{1} << s.depth);
  ++s.depth;
  s.mode = object ? kObjectFirstKey : kArrayFirst;
  return true;
}

void pop(JsonPrefixState& s) {
  --s.depth;
  s.mode = s.depth == 0 ? kDone : kAfterValue;
}

bool value_start(JsonPrefixState& s, uint8_t c) {
  switch (c) {
    case '{': return push(s, true);
    case '[': return push(s, false);
    case '"': s.mode = kString; s.key = 0; return true;
    case '-': s.mode = kNumberMinus; return true;
    case '0': s.mode = kNumberZero; return true;
    case 't': s.mode = kLiteral; s.literal = 0; s.aux = 1; return true;
    case 'f': s.mode = kLiteral; s.literal = 1; s.aux = 1; return true;
    case 'n': s.mode = kLiteral; s.literal = 2; s.aux = 1; return true;
    default:
      if (c >= '1' && c <= '9') {
        s.mode = kNumberInt;
        return true;
      }
      return false;
  }
}

// Outside strings: whitespace (capped runs) is accepted in every structural mode.
bool whitespace(JsonPrefixState& s) {
  if (s.ws_run >= kMaxJsonWhitespaceRun) return false;
  ++s.ws_run;
  return true;
}

bool after_value(JsonPrefixState& s, uint8_t c) {
  if (is_ws(c)) return whitespace(s);
  if (c == ',') {
    s.mode = top_is_object(s) ? kObjectKey : kValue;
    return true;
  }
  if ((c == '}' && top_is_object(s)) || (c == ']' && !top_is_object(s))) {
    pop(s);
    return true;
  }
  return false;
}

}  // namespace

bool JsonPrefixState::feed(uint8_t c) {
  JsonPrefixState& s = *this;
  const bool structural = s.mode < kString || s.mode == kDone;
  if (structural && !is_ws(c)) s.ws_run = 0;
  switch (s.mode) {
    case kStart:
      if (is_ws(c)) return whitespace(s);
      return c == '{' && push(s, true);
    case kValue:
      if (is_ws(c)) return whitespace(s);
      return value_start(s, c);
    case kArrayFirst:
      if (is_ws(c)) return whitespace(s);
      if (c == ']') {
        pop(s);
        return true;
      }
      return value_start(s, c);
    case kObjectFirstKey:
    case kObjectKey:
      if (is_ws(c)) return whitespace(s);
      if (c == '}' && s.mode == kObjectFirstKey) {
        pop(s);
        return true;
      }
      if (c != '"') return false;
      s.mode = kString;
      s.key = 1;
      return true;
    case kColon:
      if (is_ws(c)) return whitespace(s);
      if (c != ':') return false;
      s.mode = kValue;
      return true;
    case kAfterValue:
      return after_value(s, c);
    case kString:
      if (c == '"') {
        s.mode = s.key ? kColon : kAfterValue;
        s.ws_run = 0;
        return true;
      }
      if (c == '\\') {
        s.mode = kStringEscape;
        return true;
      }
      if (c < 0x20) return false;  // control characters must be escaped
      if (c < 0x80) return true;
      // A UTF-8 lead byte (RFC 3629): C2-DF one continuation byte, E0-EF two, F0-F4 three.
      if (c >= 0xC2 && c <= 0xDF) s.aux = 1;
      else if (c >= 0xE0 && c <= 0xEF) s.aux = 2;
      else if (c >= 0xF0 && c <= 0xF4) s.aux = 3;
      else return false;
      s.utf8_lead = c;
      s.mode = kStringUtf8;
      return true;
    case kStringUtf8: {
      uint8_t lo = 0x80, hi = 0xBF;
      if (s.utf8_lead != 0) {  // the first continuation byte: no overlongs, surrogates or code points past U+10FFFF
        if (s.utf8_lead == 0xE0) lo = 0xA0;
        if (s.utf8_lead == 0xED) hi = 0x9F;
        if (s.utf8_lead == 0xF0) lo = 0x90;
        if (s.utf8_lead == 0xF4) hi = 0x8F;
        s.utf8_lead = 0;
      }
      if (c < lo || c > hi) return false;
      if (--s.aux == 0) s.mode = kString;
      return true;
    }
    case kStringEscape:
      if (c == 'u') {
        s.mode = kStringHex;
        s.aux = 4;
        s.surrogate = 0;
        return true;
      }
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' || c == 't') {
        s.mode = kString;
        return true;
      }
      return false;
    case kStringHex: {
      // Code units D800-DBFF (high surrogates) must be followed by \uDC00-\uDFFF, and those come only
      // there: decided on the first two digits, so that every accepted prefix can still be completed.
      if (!is_hex(c)) return false;
      const uint8_t v = is_digit(c) ? c - '0' : (c | 0x20) - 'a' + 10;
      if (s.aux == 4) {
        if (s.surrogate == kLowPending && v != 0xD) return false;
        if (s.surrogate == kNoSurrogate && v == 0xD) s.surrogate = kFirstDigitD;
      } else if (s.aux == 3) {
        if (s.surrogate == kLowPending && v < 0xC) return false;
        if (s.surrogate == kFirstDigitD) {
          if (v >= 0xC) return false;  // a low surrogate without a high one
          s.surrogate = v >= 0x8 ? kHighSeen : kNoSurrogate;
        }
      }
      if (--s.aux > 0) return true;
      if (s.surrogate == kHighSeen) {
        s.mode = kStringLowSlash;
      } else {
        s.mode = kString;
        s.surrogate = kNoSurrogate;
      }
      return true;
    }
    case kStringLowSlash:
      if (c != '\\') return false;
      s.mode = kStringLowU;
      return true;
    case kStringLowU:
      if (c != 'u') return false;
      s.mode = kStringHex;
      s.aux = 4;
      s.surrogate = kLowPending;
      return true;
    case kNumberMinus:
      if (c == '0') s.mode = kNumberZero;
      else if (is_digit(c)) s.mode = kNumberInt;
      else return false;
      return true;
    case kNumberZero:
    case kNumberInt:
      if (is_digit(c) && s.mode == kNumberInt) return true;
      if (c == '.') {
        s.mode = kNumberDot;
        return true;
      }
      if (c == 'e' || c == 'E') {
        s.mode = kNumberExp;
        return true;
      }
      s.mode = kAfterValue;
      s.ws_run = 0;
      return after_value(s, c);
    case kNumberDot:
      if (!is_digit(c)) return false;
      s.mode = kNumberFrac;
      return true;
    case kNumberFrac:
      if (is_digit(c)) return true;
      if (c == 'e' || c == 'E') {
        s.mode = kNumberExp;
        return true;
      }
      s.mode = kAfterValue;
      s.ws_run = 0;
      return after_value(s, c);
    case kNumberExp:
      if (c == '+' || c == '-') {
        s.mode = kNumberExpSign;
        return true;
      }
      if (!is_digit(c)) return false;
      s.mode = kNumberExpDigits;
      return true;
    case kNumberExpSign:
      if (!is_digit(c)) return false;
      s.mode = kNumberExpDigits;
      return true;
    case kNumberExpDigits:
      if (is_digit(c)) return true;
      s.mode = kAfterValue;
      s.ws_run = 0;
      return after_value(s, c);
    case kLiteral: {
      const char* lit = kLiterals[s.literal];
      if (c != static_cast<uint8_t>(lit[s.aux])) return false;
      if (lit[++s.aux] == '\0') {
        s.mode = kAfterValue;
        s.ws_run = 0;
      }
      return true;
    }
    case kDone:
      return is_ws(c) && whitespace(s);
    default:
      return false;
  }
}

bool JsonPrefixState::feed(std::string_view bytes) {
  for (const char c : bytes)
    if (!feed(static_cast<uint8_t>(c))) return false;
  return true;
}

bool JsonPrefixState::complete() const { return mode == kDone; }

bool JsonPrefixState::in_string() const { return mode == kString; }

std::shared_ptr<const JsonTokenTable> JsonTokenTable::build(const Tokenizer& tok, int64_t model_vocab,
                                                            std::span<const int32_t> end_ids) {
  auto t = std::make_shared<JsonTokenTable>();
  t->texts.resize(static_cast<size_t>(model_vocab));
  const auto n = static_cast<int32_t>(std::min<int64_t>(tok.vocab_size(), model_vocab));
  for (int32_t id = 0; id < n; ++id) {
    try {
      if (!tok.is_control(id)) t->texts[id] = tok.token_to_piece(id);
    } catch (const Error&) {
      // A hole in the vocabulary: no text, never allowed.
    }
  }
  for (const int32_t id : end_ids)
    if (id >= 0 && id < model_vocab) t->texts[id].clear();
  t->plain.resize(t->texts.size());
  for (size_t id = 0; id < t->texts.size(); ++id) {
    const std::string& x = t->texts[id];
    t->plain[id] = !x.empty() && std::all_of(x.begin(), x.end(), [](char ch) {
      return ch >= 0x20 && ch <= 0x7E && ch != '"' && ch != '\\';
    });
  }
  return t;
}

JsonConstraint::JsonConstraint(std::shared_ptr<const JsonTokenTable> table) : table_(std::move(table)) {
  RETROINFER_CHECK(table_, "json constraint: no token table");
}

void JsonConstraint::mask(std::span<float> logits) const {
  RETROINFER_CHECK(logits.size() == table_->texts.size(), "json constraint: logits of ", logits.size(),
                   " tokens, the token table has ", table_->texts.size());
  // The first bytes allowed from this state: most tokens are refused on their first byte.
  bool first_ok[256];
  for (int c = 0; c < 256; ++c) {
    JsonPrefixState s = state_;
    first_ok[c] = s.feed(static_cast<uint8_t>(c));
  }
  constexpr float kBanned = -std::numeric_limits<float>::infinity();
  const bool in_string = state_.in_string() && table_->plain.size() == logits.size();
  for (size_t id = 0; id < logits.size(); ++id) {
    if (in_string && table_->plain[id]) continue;
    const std::string& text = table_->texts[id];
    if (text.empty() || !first_ok[static_cast<uint8_t>(text[0])]) {
      logits[id] = kBanned;
      continue;
    }
    JsonPrefixState s = state_;
    if (!s.feed(text)) logits[id] = kBanned;
  }
}

void JsonConstraint::accept(int32_t token) {
  RETROINFER_CHECK(token >= 0 && static_cast<size_t>(token) < table_->texts.size(), "json constraint: token ",
                   token, " is outside the vocabulary");
  const std::string& text = table_->texts[token];
  RETROINFER_CHECK(!text.empty() && state_.feed(text), "json constraint: token ", token,
                   " does not continue the JSON text (it was not allowed by the mask)");
}

}  // namespace retroinfer
