// Pre-tokenization: splits valid UTF-8 text into words with a sequence of regexes (PCRE2, UTF + UCP mode,
// JIT when available). Each regex splits every current piece with Hugging Face's "Isolated" behaviour:
// matches and the gaps between them both become pieces, so the pieces always concatenate to the input.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace retroinfer::tokenizer {

// GPT-2's regex (Hugging Face ByteLevel pre-tokenizer with use_regex=true).
inline constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// Llama-3 (tokenizer.json Split pattern; digits in runs of at most 3).
inline constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Qwen2 / Qwen2.5 / Qwen3 (as Llama-3 but single digits).
inline constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Hugging Face Digits(individual_digits=true): every numeric character alone.
inline constexpr std::string_view kDigitsRegex = R"(\p{N})";

// A compiled PCRE2 pattern. Immutable after construction: may be shared by threads.
class Regex {
 public:
  // literal=true matches the pattern text verbatim (Hugging Face Split with a String pattern).
  explicit Regex(std::string_view pattern, bool literal = false);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;
  // Appends the Isolated split of text (valid UTF-8) to out, as views into text.
  void split_isolated(std::string_view text, std::vector<std::string_view>& out) const;
  const std::string& pattern() const { return pattern_; }
  bool jit() const { return jit_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

class PreTokenizer {
 public:
  void add_regex(std::string_view pattern, bool literal = false);
  bool empty() const { return regexes_.empty(); }
  // Splits text (valid UTF-8) into pieces, views into text, in order, concatenating to text.
  void split(std::string_view text, std::vector<std::string_view>& out) const;
  std::vector<std::string> patterns() const;

 private:
  std::vector<std::unique_ptr<Regex>> regexes_;
};

// Regexes for a GGUF `tokenizer.ggml.pre` name. Throws Error for an unknown name.
std::vector<std::string_view> regexes_for_gguf_pre(std::string_view pre);

}  // namespace retroinfer::tokenizer
