// libFuzzer target: the tokenizer. Byte 0 picks what the rest is:
//   even: text, encoded by one of the two committed test tokenizers (tests/data/tokenizer: tiny_bpe with the
//         GPT-2 regex and added tokens, tiny_split with NFC + the Qwen2 split), with and without special-token
//         parsing; decode(encode(text)) must give the text back (tiny_bpe covers every byte; tiny_split's NFC
//         output must be stable under a second round trip), and the streaming
//         decoder's pieces must add up to decode() when that is valid UTF-8;
//   odd:  a tokenizer.json, loaded with Tokenizer::from_json_string; when it loads, a fixed text (plus the
//         input's own bytes) is encoded, decoded and rendered through its chat template.
// Any outcome other than success or retroinfer::Error is a bug.
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "retroinfer/error.h"
#include "retroinfer/tokenizer.h"

namespace {

using retroinfer::Tokenizer;
using retroinfer::TokenId;

std::unique_ptr<Tokenizer> load_test_tokenizer(const char* name) {
  std::ifstream f(std::string(RETROINFER_TEST_DATA) + "/tokenizer/" + name, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return Tokenizer::from_json_string(ss.str(), name);
}

// Encodes and decodes `text`; aborts when the round trip or the streaming decoder disagree. With a normaliser
// (NFC) decode(encode(text)) is the normalised text, so there the round trip must be stable instead: a second
// pass gives back what the first gave.
void check_round_trip(const Tokenizer& tok, std::string_view text, bool normalises) {
  const std::vector<TokenId> plain = tok.encode(text, /*add_special=*/false, /*parse_special=*/false);
  const std::string back = tok.decode(plain);
  if (!normalises && back != text) std::abort();
  if (normalises && retroinfer::tokenizer::is_valid_utf8(back) && tok.decode(tok.encode(back, false, false)) != back)
    std::abort();
  const std::vector<TokenId> special = tok.encode(text, /*add_special=*/true, /*parse_special=*/true);
  const std::string decoded = tok.decode(special);
  (void)tok.decode(special, /*skip_special=*/true);
  if (retroinfer::tokenizer::is_valid_utf8(decoded)) {
    retroinfer::StreamingDecoder stream(tok);
    std::string pieces;
    for (TokenId id : special) pieces += stream.push(id);
    pieces += stream.flush();
    if (pieces != decoded) std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace retroinfer;
  if (size == 0) return 0;
  static const std::unique_ptr<Tokenizer> kFixed[2] = {load_test_tokenizer("tiny_bpe.tokenizer.json"),
                                                       load_test_tokenizer("tiny_split.tokenizer.json")};
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if ((data[0] & 1) == 0) {
    const int which = (data[0] >> 1) & 1;
    check_round_trip(*kFixed[which], rest, /*normalises=*/which == 1);
    return 0;
  }
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = Tokenizer::from_json_string(rest, "fuzz.json");
  } catch (const Error&) {
    return 0;
  }
  try {
    const std::string text = "Hello, world! 12345 \xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 <|im_end|> " +
                             std::string(rest.substr(0, 64));
    const std::vector<TokenId> ids = tok->encode(text, true, true);
    (void)tok->decode(ids);
    (void)tok->decode(ids, true);
    for (TokenId id = 0; id < tok->vocab_size() && id < 64; ++id) (void)tok->token_type(id);
    const ChatMessage messages[] = {{"user", "hi"}};
    (void)tok->apply_chat_template(messages, true);
  } catch (const Error&) {
  }
  return 0;
}
