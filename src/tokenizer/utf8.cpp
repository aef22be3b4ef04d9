#include "tokenizer/utf8.h"

namespace retroinfer::tokenizer {

size_t utf8_valid_prefix_len(std::string_view s, size_t pos) {
  const size_t n = s.size() - pos;
  const auto* p = reinterpret_cast<const uint8_t*>(s.data() + pos);
  if (n == 0) return 0;
  const uint8_t b0 = p[0];
  if (b0 < 0x80) return 1;
  auto cont = [&](size_t i) { return i < n && (p[i] & 0xC0) == 0x80; };
  if (b0 >= 0xC2 && b0 <= 0xDF) return cont(1) ? 2 : 0;
  if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (!cont(1) || !cont(2)) return 0;
    if (b0 == 0xE0 && p[1] < 0xA0) return 0;  // overlong
    if (b0 == 0xED && p[1] >= 0xA0) return 0;  // UTF-16 surrogate
    return 3;
  }
  if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (!cont(1) || !cont(2) || !cont(3)) return 0;
    if (b0 == 0xF0 && p[1] < 0x90) return 0;  // overlong
    if (b0 == 0xF4 && p[1] >= 0x90) return 0;  // > U+10FFFF
    return 4;
  }
  return 0;
}

size_t utf8_incomplete_len(std::string_view s, size_t pos) {
  const size_t n = s.size() - pos;
  const auto* p = reinterpret_cast<const uint8_t*>(s.data() + pos);
  if (n == 0) return 0;
  const uint8_t b0 = p[0];
  size_t need = 0;
  if (b0 >= 0xC2 && b0 <= 0xDF) need = 2;
  else if (b0 >= 0xE0 && b0 <= 0xEF) need = 3;
  else if (b0 >= 0xF0 && b0 <= 0xF4) need = 4;
  else return 0;
  if (n >= need) return 0;  // complete or invalid, not incomplete
  for (size_t i = 1; i < n; ++i) {
    if ((p[i] & 0xC0) != 0x80) return 0;
  }
  // Second-byte range restrictions, so that a prefix that can never become valid is not held back.
  if (n >= 2) {
    if (b0 == 0xE0 && p[1] < 0xA0) return 0;
    if (b0 == 0xED && p[1] >= 0xA0) return 0;
    if (b0 == 0xF0 && p[1] < 0x90) return 0;
    if (b0 == 0xF4 && p[1] >= 0x90) return 0;
  }
  return n;
}

bool is_valid_utf8(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    const size_t len = utf8_valid_prefix_len(s, pos);
    if (len == 0) return false;
    pos += len;
  }
  return true;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

const ByteLevelMap& ByteLevelMap::instance() {
  static const ByteLevelMap map;
  return map;
}

ByteLevelMap::ByteLevelMap() {
  codepoint_to_byte_.fill(-1);
  // Printable ranges keep their own code point: '!'..'~', U+00A1..U+00AC, U+00AE..U+00FF.
  auto keeps_itself = [](int b) { return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE); };
  int next = 0x100;  // the other 68 bytes take U+0100.. in increasing byte order
  for (int b = 0; b < 256; ++b) {
    const int cp = keeps_itself(b) ? b : next++;
    byte_text_[b].clear();
    append_utf8(byte_text_[b], static_cast<uint32_t>(cp));
    codepoint_to_byte_[cp] = static_cast<int16_t>(b);
  }
}

void ByteLevelMap::encode(std::string_view raw, std::string& out) const {
  for (unsigned char c : raw) out += byte_text_[c];
}

bool ByteLevelMap::decode(std::string_view text, std::string& out) const {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t len = utf8_valid_prefix_len(text, pos);
    if (len == 0 || len > 2) return false;  // mapped code points are < U+0800: 1 or 2 bytes
    const auto* p = reinterpret_cast<const uint8_t*>(text.data() + pos);
    const uint32_t cp = len == 1 ? p[0] : ((p[0] & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    if (cp >= codepoint_to_byte_.size() || codepoint_to_byte_[cp] < 0) return false;
    out.push_back(static_cast<char>(codepoint_to_byte_[cp]));
    pos += len;
  }
  return true;
}

}  // namespace retroinfer::tokenizer
