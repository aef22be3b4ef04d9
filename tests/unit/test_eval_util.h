// Helpers shared by the eval tests: small inline haystack text and word lists, a byte-level tokenizer that
// fits the tiny model fixtures' vocabulary.
#pragma once

#include <string>
#include <vector>

#include "eval/tasks.h"
#include "retroinfer/tokenizer.h"

namespace retroinfer::test {

// An essay of `sentences` sentences of 6..13 words made of syllables (deterministic), and a word list of
// distinct lowercase words.
inline eval::TaskResources small_resources(int sentences = 400) {
  static const char* kSyl[] = {"ba", "ko", "ri", "te", "mu", "sa", "lo", "vi", "ne", "da", "pu", "gi"};
  eval::TaskResources r;
  uint32_t x = 12345;
  auto next = [&] { return x = x * 1664525u + 1013904223u; };
  for (int s = 0; s < sentences; ++s) {
    const int n = 6 + static_cast<int>((next() >> 16) % 8);
    for (int w = 0; w < n; ++w) {
      std::string word;
      const int syl = 1 + static_cast<int>((next() >> 16) % 3);
      for (int k = 0; k < syl; ++k) word += kSyl[(next() >> 16) % 12];
      if (w == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
      if (w + 1 == n) word += '.';
      r.essay_words.push_back(word);
    }
  }
  for (int a = 0; a < 12; ++a)
    for (int b = 0; b < 12; ++b)
      for (int c = 0; c < 12; ++c) r.words.push_back(std::string(kSyl[a]) + kSyl[b] + kSyl[c]);
  return r;
}

// The 256 GPT-2 byte symbols (bytes_to_unicode: printable bytes map to themselves, the rest to U+0100 + n in
// byte order) as ids 0..255 of a vocabulary without merges, normal tokens, pre-tokenizer gpt2, no BOS.
inline GgufVocab byte_symbol_vocab() {
  GgufVocab v;
  int n = 0;
  v.tokens.resize(256);
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    const int cp = printable ? b : 256 + n++;
    std::string s;
    if (cp < 0x80) {
      s += static_cast<char>(cp);
    } else {
      s += static_cast<char>(0xC0 | (cp >> 6));
      s += static_cast<char>(0x80 | (cp & 0x3F));
    }
    v.tokens[b] = s;
  }
  v.token_types.assign(256, 1);
  v.pre = "gpt2";
  v.add_bos = false;
  return v;
}

// Byte-level BPE vocabulary without merges: the 256 byte symbols plus "<|end|>" (256, control, EOS). 257 ids:
// fits the tiny model fixtures (vocab 512).
inline std::unique_ptr<Tokenizer> byte_tokenizer() {
  GgufVocab v = byte_symbol_vocab();
  v.tokens.push_back("<|end|>");
  v.token_types.push_back(3);
  v.eos_id = 256;
  return Tokenizer::from_vocab(v);
}

}  // namespace retroinfer::test
