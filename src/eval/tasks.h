// RULER-style synthetic long-context tasks (Hsieh et al., "RULER: What's the Real Context Size of Your
// Long-Context Language Models?", 2024), generated from a seed over public-domain haystack text and a word
// list, sized to a target token count with the model's own tokenizer. Drives `retroinfer eval tasks`.
//
// Tasks (name: haystack, what is hidden, what is asked; all scored by string_match_all, see scoring.h):
//   niah_single_1     noise  one needle "One of the special magic numbers for K is: V." (7-digit V)
//   niah_single_2     essay  one needle, word value
//   niah_single_3     essay  one needle, uuid value
//   niah_multikey     essay  4 needles with different keys (number values); one key is asked
//   niah_multivalue   essay  4 needles with the same key; all 4 values are asked
//   niah_multiquery   essay  4 needles with different keys; all 4 keys are asked
//   vt                noise  variable tracking: a chain "VAR A = 12345 ... VAR B = VAR A ..." (5 names)
//   cwe               list   common-words extraction: the 10 words repeated most in a numbered list
//   fwe               text   frequent-words extraction: the 3 most frequent coded words (Zipf, alpha 2)
//   passkey           noise  "The pass key is N. Remember it. N is the pass key." (5-digit N)
// Noise haystack: "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back
// again." repeated. Essay haystack: consecutive words of real text (King James Bible via `bible`), starting
// at a seeded word.
//
// Depth: sample `index` puts its (first / asked) needle at depth (index mod num_depths) / (num_depths - 1)
// of the haystack (0 = start, 1 = end), snapped back to the nearest sentence end; other needles go to
// seeded random depths. Everything is a deterministic function of (seed, task, target tokens, index): the
// same samples serve every attention method and every rerun.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace retroinfer::eval {

// Text the generator draws from. Loaded at run time (see load_* below); tests pass small inline text.
struct TaskResources {
  std::vector<std::string> essay_words;  // the essay haystack as words in reading order (punctuation kept)
  std::vector<std::string> words;        // word list for keys and word values: lowercase ASCII letters
};

// `bible` output -> plain text: drops blank lines and chapter headers ("Genesis 1"), strips verse numbers,
// joins lines with single spaces.
std::string clean_bible_text(std::string_view raw);
// Splits text at ASCII whitespace.
std::vector<std::string> split_words(std::string_view text);
// Dictionary lines -> words usable as keys and values: lowercase ASCII letters only, length 3..10, first
// occurrence kept, in input order.
std::vector<std::string> filter_word_list(std::string_view dict);
// Runs `bible <range>` for each range and cleans the output; throws Error (install bible-kjv through
// scripts/setup.sh) when the command fails or prints nothing.
std::string load_bible_text(const std::vector<std::string>& ranges);
// Reads and filters a word list file (e.g. /usr/share/dict/words); throws Error when missing or too small.
std::vector<std::string> load_word_list(const std::string& path);

// Tokens of a complete prompt text (the model's tokenizer, special tokens parsed).
using TokenCounter = std::function<int64_t(std::string_view prompt)>;
// Builds the complete prompt text from the task's user message and the answer prefix the reply starts
// with (e.g. chat template + generation prompt + answer prefix).
using PromptWrapper = std::function<std::string(std::string_view user, std::string_view answer_prefix)>;

struct TaskSample {
  std::string task;
  int64_t target_tokens = 0;
  int index = 0;
  std::string prompt;                   // complete prompt text (after the wrapper)
  int64_t prompt_tokens = 0;            // TokenCounter(prompt): in [(1 - tolerance) * target, target]
  std::vector<std::string> references;  // strings the answer must contain
  int max_new_tokens = 16;              // greedy decode length for this task
  double depth = -1.0;                  // asked depth of the first needle in [0, 1]; -1 when none
  // For each needle (in insertion order): share of the haystack's characters before it, in [0, 1].
  std::vector<double> needle_depths;
  // Byte offset of each needle in `prompt` (same order).
  std::vector<size_t> needle_offsets;
};

struct TaskOptions {
  uint64_t seed = 42;
  int num_depths = 11;      // depth grid 0%, 10%, ..., 100%
  double tolerance = 0.01;  // prompt length within (1 - tolerance) * target .. target tokens
};

// The task names above, in table order.
const std::vector<std::string>& task_names();
// "all" -> task_names(); else a comma-separated list of names; throws Error naming an unknown task.
std::vector<std::string> parse_task_list(std::string_view list);

// Threading contract: make() is const and may run concurrently if the TokenCounter and PromptWrapper may.
class TaskGenerator {
 public:
  // Throws Error when the resources are too small (essay < 1000 words, word list < 100 words).
  TaskGenerator(TaskResources res, TokenCounter count, PromptWrapper wrap, TaskOptions opt = {});
  // Throws Error for an unknown task or a target too small for the task's fixed text.
  TaskSample make(std::string_view task, int64_t target_tokens, int index) const;
  const TaskOptions& options() const { return opt_; }

 private:
  TaskResources res_;
  TokenCounter count_;
  PromptWrapper wrap_;
  TaskOptions opt_;
};

}  // namespace retroinfer::eval
