// UTF-8 helpers and the GPT-2 byte-to-unicode mapping used by byte-level BPE.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "retroinfer/tokenizer.h"

namespace retroinfer::tokenizer {

// utf8_valid_prefix_len (1..4, or 0 for a bad lead byte, bad continuation, overlong form, surrogate,
// > U+10FFFF or a truncated sequence) and is_valid_utf8: include/retroinfer/tokenizer.h.

// Length of the longest prefix of s[pos..] that could still become a valid sequence with more bytes:
// 0 if s[pos] cannot start one, else the number of bytes present (1..3) when the sequence is incomplete.
// Returns 0 also when the sequence is already complete (use utf8_valid_prefix_len first).
size_t utf8_incomplete_len(std::string_view s, size_t pos);

void append_utf8(std::string& out, uint32_t codepoint);

// GPT-2 byte-level mapping: every byte b maps to one printable code point (bytes that are printable
// Latin-1 map to themselves, the other 68 map to U+0100..U+0143 in byte order).
class ByteLevelMap {
 public:
  static const ByteLevelMap& instance();
  // UTF-8 encoding of the code point that stands for byte b.
  const std::string& byte_to_text(uint8_t b) const { return byte_text_[b]; }
  // Maps every byte of raw to its code point and appends the UTF-8 to out.
  void encode(std::string_view raw, std::string& out) const;
  // Inverse of encode: returns false (out unspecified) if text contains a code point outside the map.
  bool decode(std::string_view text, std::string& out) const;

 private:
  ByteLevelMap();
  std::array<std::string, 256> byte_text_;
  std::array<int16_t, 0x144> codepoint_to_byte_;  // -1 where a code point stands for no byte
};

}  // namespace retroinfer::tokenizer
