// Unicode normalisation (NFC, as Qwen2's tokenizer.json asks for), through ICU.
#pragma once

#include <string>
#include <string_view>

namespace retroinfer::tokenizer {

// NFC of valid UTF-8 text. ASCII-only text is returned unchanged without calling ICU.
// Throws Error if ICU fails (it cannot for valid UTF-8 short of running out of memory).
std::string nfc(std::string_view text);

}  // namespace retroinfer::tokenizer
