#include "tokenizer/normalizer.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <vector>

#include "retroinfer/error.h"

namespace retroinfer::tokenizer {

std::string nfc(std::string_view text) {
  bool ascii = true;
  for (unsigned char c : text) ascii &= c < 0x80;
  if (ascii) return std::string(text);  // ASCII is always in NFC

  UErrorCode status = U_ZERO_ERROR;
  const UNormalizer2* norm = unorm2_getNFCInstance(&status);
  RETROINFER_CHECK(U_SUCCESS(status), "tokenizer: ICU NFC normaliser unavailable: ", u_errorName(status));

  RETROINFER_CHECK(text.size() < (1u << 30), "tokenizer: text of ", text.size(), " bytes is too long to normalise");
  const auto len = static_cast<int32_t>(text.size());
  // UTF-8 -> UTF-16: at most one UTF-16 unit per UTF-8 byte.
  std::vector<UChar> utf16(static_cast<size_t>(len) + 1);
  int32_t utf16_len = 0;
  u_strFromUTF8(utf16.data(), static_cast<int32_t>(utf16.size()), &utf16_len, text.data(), len, &status);
  RETROINFER_CHECK(U_SUCCESS(status), "tokenizer: UTF-8 to UTF-16 failed: ", u_errorName(status));

  if (unorm2_quickCheck(norm, utf16.data(), utf16_len, &status) == UNORM_YES && U_SUCCESS(status)) {
    return std::string(text);
  }
  status = U_ZERO_ERROR;
  // NFC can grow text (a few compatibility-free decompositions expand up to 3x in UTF-16); retry if needed.
  std::vector<UChar> normalised(static_cast<size_t>(utf16_len) * 3 + 16);
  int32_t norm_len = unorm2_normalize(norm, utf16.data(), utf16_len, normalised.data(),
                                      static_cast<int32_t>(normalised.size()), &status);
  if (status == U_BUFFER_OVERFLOW_ERROR) {
    status = U_ZERO_ERROR;
    normalised.resize(static_cast<size_t>(norm_len) + 1);
    norm_len = unorm2_normalize(norm, utf16.data(), utf16_len, normalised.data(),
                                static_cast<int32_t>(normalised.size()), &status);
  }
  RETROINFER_CHECK(U_SUCCESS(status), "tokenizer: NFC normalisation failed: ", u_errorName(status));

  std::string out(static_cast<size_t>(norm_len) * 3 + 4, '\0');  // <= 3 UTF-8 bytes per UTF-16 unit
  int32_t out_len = 0;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &out_len, normalised.data(), norm_len, &status);
  RETROINFER_CHECK(U_SUCCESS(status), "tokenizer: UTF-16 to UTF-8 failed: ", u_errorName(status));
  out.resize(static_cast<size_t>(out_len));
  return out;
}

}  // namespace retroinfer::tokenizer
