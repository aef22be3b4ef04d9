#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/pre_tokenizer.h"

#include <pcre2.h>

#include "retroinfer/error.h"

namespace retroinfer::tokenizer {
namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof(buf));
  return reinterpret_cast<const char*>(buf);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

}  // namespace

Regex::Regex(std::string_view pattern, bool literal) : pattern_(pattern) {
  int err = 0;
  PCRE2_SIZE err_offset = 0;
  // UTF: patterns and subjects are UTF-8; UCP: \s, \w, \d and case folding use Unicode properties, as
  // Oniguruma (used by Hugging Face tokenizers) does. Subjects are validated before matching, hence
  // PCRE2_NO_UTF_CHECK at match time.
  const uint32_t options = PCRE2_UTF | (literal ? PCRE2_LITERAL : PCRE2_UCP);  // LITERAL refuses UCP
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), options, &err,
                                   &err_offset, nullptr);
  RETROINFER_CHECK(code != nullptr, "tokenizer: cannot compile pre-tokenizer regex '", pattern, "': ",
                   pcre2_message(err), " at offset ", err_offset, "; check the tokenizer file");
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;  // falls back to the interpreter
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void Regex::split_isolated(std::string_view text, std::vector<std::string_view>& out) const {
  if (text.empty()) return;
  auto* code = static_cast<pcre2_code*>(code_);
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create_from_pattern(code, nullptr));
  RETROINFER_CHECK(md != nullptr, "tokenizer: out of memory creating PCRE2 match data");
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t gap_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = pcre2_match(code, subject, text.size(), pos, PCRE2_NO_UTF_CHECK, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    RETROINFER_CHECK(rc >= 0, "tokenizer: regex '", pattern_, "' failed on a ", text.size(),
                     "-byte piece: ", pcre2_message(rc), "; the input may be pathological");
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    const size_t begin = ov[0];
    size_t end = ov[1];
    if (end == begin) {
      // Empty match (none of the built-in patterns produce one): step over one code point.
      end = begin + 1;
      while (end < text.size() && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) ++end;
      pos = end;
      continue;
    }
    if (begin > gap_start) out.push_back(text.substr(gap_start, begin - gap_start));
    out.push_back(text.substr(begin, end - begin));
    gap_start = end;
    pos = end;
  }
  if (gap_start < text.size()) out.push_back(text.substr(gap_start));
}

void PreTokenizer::add_regex(std::string_view pattern, bool literal) {
  regexes_.push_back(std::make_unique<Regex>(pattern, literal));
}

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  if (regexes_.empty()) {
    if (!text.empty()) out.push_back(text);
    return;
  }
  std::vector<std::string_view> current{text};
  std::vector<std::string_view> next;
  for (size_t r = 0; r < regexes_.size(); ++r) {
    std::vector<std::string_view>& dst = (r + 1 == regexes_.size()) ? out : next;
    for (std::string_view piece : current) regexes_[r]->split_isolated(piece, dst);
    if (r + 1 < regexes_.size()) {
      current.swap(next);
      next.clear();
    }
  }
}

std::vector<std::string> PreTokenizer::patterns() const {
  std::vector<std::string> p;
  for (const auto& r : regexes_) p.push_back(r->pattern());
  return p;
}

std::vector<std::string_view> regexes_for_gguf_pre(std::string_view pre) {
  if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "falcon3" || pre == "smaug-bpe") {
    return {kLlama3Regex};
  }
  if (pre == "qwen2" || pre == "deepseek-r1-qwen") return {kQwen2Regex};
  if (pre == "smollm" || pre == "starcoder" || pre == "refact" || pre == "codeshell") {
    return {kDigitsRegex, kGpt2Regex};
  }
  // "default" (also what converters write when they do not know the pre-tokenizer) is treated as GPT-2.
  if (pre == "gpt2" || pre == "gpt-2" || pre == "default" || pre.empty()) return {kGpt2Regex};
  RETROINFER_FAIL("tokenizer: unsupported GGUF pre-tokenizer '", pre,
                  "' (supported: llama-bpe, llama3, qwen2, smollm, starcoder, gpt2, default); "
                  "use a tokenizer.json instead or add its regex to src/tokenizer/pre_tokenizer.cpp");
}

}  // namespace retroinfer::tokenizer
