#include "eval/tasks.h"

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_set>

#include "core/splitmix.h"
#include "retroinfer/error.h"

namespace retroinfer::eval {
namespace {

// splitmix64: a small, portable generator (the same numbers on every platform and standard library).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next() { return splitmix64_next(s_); }
  uint64_t below(uint64_t n) { return next() % n; }  // modulo bias < n / 2^64: negligible
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)

 private:
  uint64_t s_;
};

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

const char* const kNoise[] = {"The grass is green.", "The sky is blue.", "The sun is yellow.", "Here we go.",
                              "There and back again."};

bool ends_sentence(const std::string& w) {
  return !w.empty() && (w.back() == '.' || w.back() == '?' || w.back() == '!');
}

// A haystack of units (words or sentences) joined by single spaces, with needles inserted between units.
struct Needle {
  size_t before_unit;  // inserted before this unit (== units.size(): at the end)
  std::string text;
};
struct Woven {
  std::string text;
  std::vector<double> depths;  // per needle (input order): haystack chars before it / all haystack chars
};
Woven weave(const std::vector<std::string>& units, const std::vector<Needle>& needles) {
  std::vector<size_t> order(needles.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return needles[a].before_unit < needles[b].before_unit; });
  size_t hay_chars = 0;
  for (const auto& u : units) hay_chars += u.size() + 1;
  Woven w;
  w.depths.assign(needles.size(), 0.0);
  size_t k = 0, hay_before = 0;
  auto put = [&](const std::string& s) {
    if (!w.text.empty()) w.text += ' ';
    w.text += s;
  };
  for (size_t u = 0; u <= units.size(); ++u) {
    while (k < order.size() && needles[order[k]].before_unit == u) {
      put(needles[order[k]].text);
      w.depths[order[k]] = hay_chars > 0 ? static_cast<double>(hay_before) / hay_chars : 0.0;
      ++k;
    }
    if (u < units.size()) {
      put(units[u]);
      hay_before += units[u].size() + 1;
    }
  }
  return w;
}

// Unit index for depth d in [0, 1] of n units, moved back to just after a sentence end (or 0).
size_t depth_to_unit(const std::vector<std::string>& units, double d) {
  size_t i = static_cast<size_t>(std::llround(d * static_cast<double>(units.size())));
  i = std::min(i, units.size());
  while (i > 0 && !ends_sentence(units[i - 1])) --i;
  return i;
}

std::string number(Rng& r, int digits) {
  uint64_t lo = 1;
  for (int i = 1; i < digits; ++i) lo *= 10;
  return std::to_string(lo + r.below(9 * lo));
}
std::string uuid4(Rng& r) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (int i = 0; i < 32; ++i) {
    if (i == 8 || i == 12 || i == 16 || i == 20) s += '-';
    int nib = static_cast<int>(r.below(16));
    if (i == 12) nib = 4;                      // version 4
    if (i == 16) nib = 8 + (nib & 3);          // variant 10xx
    s += kHex[nib];
  }
  return s;
}
std::string letters(Rng& r, int n, char base) {
  std::string s;
  for (int i = 0; i < n; ++i) s += static_cast<char>(base + r.below(26));
  return s;
}

// What one task build produced for a given haystack size.
struct Built {
  std::string user, answer_prefix;
  std::vector<std::string> refs;
  std::vector<std::string> needle_texts;
  std::vector<double> needle_depths;
};

struct Ctx {
  const TaskResources* res;
  uint64_t seed;     // per sample
  double depth;      // asked depth of the first needle
  int64_t target;    // target tokens (cwe sizes its repetitions by it)
};

// Draws `n` distinct items of [0, m) (n <= m) in draw order.
std::vector<size_t> distinct(Rng& r, size_t n, size_t m) {
  std::vector<size_t> out;
  std::unordered_set<size_t> seen;
  while (out.size() < n) {
    const size_t v = r.below(m);
    if (seen.insert(v).second) out.push_back(v);
  }
  return out;
}

std::vector<std::string> noise_units(int64_t n) {
  std::vector<std::string> u(n);
  for (int64_t i = 0; i < n; ++i) u[i] = kNoise[i % 5];
  return u;
}

std::vector<std::string> essay_units(const TaskResources& res, size_t start, int64_t n) {
  std::vector<std::string> u(n);
  const size_t m = res.essay_words.size();
  for (int64_t i = 0; i < n; ++i) u[i] = res.essay_words[(start + i) % m];
  return u;
}

enum class Hay { kNoise, kEssay };
enum class Value { kNumber, kWord, kUuid };

// niah_*: n_keys keys, n_values values per key, asked: how many keys the question names.
Built build_niah(const Ctx& c, int64_t n, Hay hay, Value value, int n_keys, int n_values, int asked) {
  Rng r(c.seed);
  const auto& words = c.res->words;
  const auto kw = distinct(r, 2 * n_keys, words.size());
  std::vector<std::string> keys;
  for (int k = 0; k < n_keys; ++k) keys.push_back(words[kw[2 * k]] + "-" + words[kw[2 * k + 1]]);
  const char* type = value == Value::kNumber ? "numbers" : value == Value::kWord ? "words" : "uuids";
  std::vector<std::string> texts, vals;
  std::unordered_set<std::string> used(keys.begin(), keys.end());
  for (int k = 0; k < n_keys; ++k) {
    for (int v = 0; v < n_values; ++v) {
      std::string val;
      do {
        val = value == Value::kNumber ? number(r, 7) : value == Value::kWord ? words[r.below(words.size())] : uuid4(r);
      } while (!used.insert(val).second);
      vals.push_back(val);
      std::string t = "One of the special magic ";
      t += type;
      t += " for " + keys[k] + " is: " + val + ".";
      texts.push_back(std::move(t));
    }
  }
  std::vector<double> depths{c.depth};
  for (size_t i = 1; i < texts.size(); ++i) depths.push_back(r.uniform());
  const size_t start = r.below(c.res->essay_words.size());
  const std::vector<std::string> units = hay == Hay::kNoise ? noise_units(n) : essay_units(*c.res, start, n);
  std::vector<Needle> needles;
  for (size_t i = 0; i < texts.size(); ++i) needles.push_back({depth_to_unit(units, depths[i]), texts[i]});
  Woven w = weave(units, needles);
  std::string query;
  for (int k = 0; k < asked; ++k) {
    if (k > 0) query += asked > 2 ? ", " : " ";
    if (k > 0 && k + 1 == asked) query += "and ";
    query += keys[k];
  }
  Built b;
  b.user = std::string("Some special magic ") + type + " are hidden within the following text. Make sure to memorize "
           "it. I will quiz you about the " + type + " afterwards.\n" + w.text + "\nWhat are all the special magic " +
           type + " for " + query + " mentioned in the provided text?";
  b.answer_prefix = std::string("The special magic ") + type + " for " + query + " mentioned in the provided text are";
  for (int k = 0; k < asked; ++k)
    for (int v = 0; v < n_values; ++v) b.refs.push_back(vals[k * n_values + v]);
  b.needle_texts = texts;
  b.needle_depths = w.depths;
  return b;
}

Built build_passkey(const Ctx& c, int64_t n) {
  Rng r(c.seed);
  const std::string key = number(r, 5);
  const std::vector<std::string> units = noise_units(n);
  const std::string needle = "The pass key is " + key + ". Remember it. " + key + " is the pass key.";
  Woven w = weave(units, {{depth_to_unit(units, c.depth), needle}});
  Built b;
  b.user = "There is an important piece of information hidden inside a lot of irrelevant text. Find it and memorize "
           "it. I will quiz you about the important information there.\n" + w.text + "\nWhat is the pass key?";
  b.answer_prefix = "The pass key is";
  b.refs = {key};
  b.needle_texts = {needle};
  b.needle_depths = w.depths;
  return b;
}

Built build_vt(const Ctx& c, int64_t n) {
  Rng r(c.seed);
  constexpr int kHops = 4;  // 5 variables: one assigned the value, four copies along the chain
  const std::string value = number(r, 5);
  std::vector<std::string> names;
  while (names.size() < kHops + 1) {
    std::string v = letters(r, 5, 'A');
    if (std::find(names.begin(), names.end(), v) == names.end()) names.push_back(v);
  }
  // The chain in reading order: the first statement at the asked depth, the rest at sorted random depths
  // after it.
  std::vector<double> depths{c.depth};
  for (int i = 0; i < kHops; ++i) depths.push_back(c.depth + (1.0 - c.depth) * r.uniform());
  std::sort(depths.begin() + 1, depths.end());
  const std::vector<std::string> units = noise_units(n);
  std::vector<Needle> needles;
  Built b;
  for (int i = 0; i <= kHops; ++i) {
    const std::string t = "VAR " + names[i] + " = " + (i == 0 ? value : "VAR " + names[i - 1]) + ".";
    needles.push_back({depth_to_unit(units, depths[i]), t});
    b.needle_texts.push_back(t);
  }
  Woven w = weave(units, needles);
  b.user = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n" + w.text +
           "\nQuestion: Find all variables that are assigned the value " + value + " in the text above.";
  b.answer_prefix = "Answer: According to the chain(s) of variable assignment in the text above, " +
                    std::to_string(kHops + 1) + " variables are assigned the value " + value + ", they are:";
  b.refs = names;
  b.needle_depths = w.depths;
  return b;
}

// Repetitions of each common word: about a third of the context. An entry "123. word\n" is ~4.5 tokens,
// so 10 words x f x 4.5 = target / 3 gives f = target / 135; at least 5 so that the common words stand
// out against the uncommon ones (3 each), at most RULER's 30.
int cwe_common_freq(int64_t target) {
  return static_cast<int>(std::clamp<int64_t>(target / 135, 5, 30));
}

Built build_cwe(const Ctx& c, int64_t n) {
  Rng r(c.seed);
  constexpr int kCommon = 10, kUncommonFreq = 3;
  const int freq = cwe_common_freq(c.target);
  const auto& words = c.res->words;
  // n = uncommon entries (the sizing unit, ~4.5 tokens): word k of the uncommon ones fills entries
  // 3k .. 3k + 2 (the last one may appear fewer times).
  const int64_t n_uncommon = (n + kUncommonFreq - 1) / kUncommonFreq;
  RETROINFER_CHECK(static_cast<size_t>(n_uncommon + kCommon) <= words.size(), "eval: cwe needs ",
                   n_uncommon + kCommon, " distinct words but the word list has ", words.size());
  const auto pick = distinct(r, kCommon + n_uncommon, words.size());
  std::vector<std::string> list;
  for (int i = 0; i < kCommon; ++i)
    for (int k = 0; k < freq; ++k) list.push_back(words[pick[i]]);
  for (int64_t e = 0; e < n; ++e) list.push_back(words[pick[kCommon + e / kUncommonFreq]]);
  for (size_t i = list.size(); i > 1; --i) std::swap(list[i - 1], list[r.below(i)]);  // Fisher-Yates
  std::string ctx;
  for (size_t i = 0; i < list.size(); ++i) ctx += std::to_string(i + 1) + ". " + list[i] + "\n";
  Built b;
  b.user = "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
           "that appear most often.\n" + ctx + "Question: What are the 10 most common words in the above list?";
  b.answer_prefix = "Answer: The top 10 words that appear most often in the list are:";
  for (int i = 0; i < kCommon; ++i) b.refs.push_back(words[pick[i]]);
  return b;
}

Built build_fwe(const Ctx& c, int64_t n) {
  Rng r(c.seed);
  // Zipf, alpha 2, over a coded vocabulary of 1000 random 5-letter words: p(rank 1..4) = .61 .15 .068 .038,
  // so the top three stand clearly apart after a few hundred draws.
  constexpr int kVocab = 1000;
  std::vector<std::string> vocab;
  std::unordered_set<std::string> seen;
  while (vocab.size() < kVocab) {
    std::string w = letters(r, 5, 'a');
    if (seen.insert(w).second) vocab.push_back(w);
  }
  std::vector<double> cdf(kVocab);
  double z = 0;
  for (int i = 0; i < kVocab; ++i) cdf[i] = (z += 1.0 / ((i + 1.0) * (i + 1.0)));
  std::vector<int64_t> count(kVocab, 0);
  std::string ctx;
  for (int64_t i = 0; i < n; ++i) {
    const double u = r.uniform() * z;
    const int k = static_cast<int>(std::min<ptrdiff_t>(std::upper_bound(cdf.begin(), cdf.end(), u) - cdf.begin(), kVocab - 1));
    ++count[k];
    if (i > 0) ctx += ' ';
    ctx += vocab[k];
  }
  std::vector<int> rank(kVocab);
  for (int i = 0; i < kVocab; ++i) rank[i] = i;
  std::stable_sort(rank.begin(), rank.end(), [&](int a, int b) { return count[a] > count[b]; });
  Built b;
  b.user = "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
           "appeared coded words.\n" + ctx + "\nQuestion: Do not provide any explanation. What are the three most "
           "frequently appeared words in the above coded text?";
  b.answer_prefix = "Answer: According to the coded text above, the three most frequently appeared words are:";
  for (int i = 0; i < 3; ++i) b.refs.push_back(vocab[rank[i]]);
  return b;
}

struct TaskDef {
  const char* name;
  int max_new_tokens;  // enough for the reference answer(s) plus separators
  bool has_depth;
  Built (*build)(const Ctx&, int64_t);
};

const std::array<TaskDef, 10> kTasks = {{
    {"niah_single_1", 16, true, [](const Ctx& c, int64_t n) { return build_niah(c, n, Hay::kNoise, Value::kNumber, 1, 1, 1); }},
    {"niah_single_2", 16, true, [](const Ctx& c, int64_t n) { return build_niah(c, n, Hay::kEssay, Value::kWord, 1, 1, 1); }},
    {"niah_single_3", 48, true, [](const Ctx& c, int64_t n) { return build_niah(c, n, Hay::kEssay, Value::kUuid, 1, 1, 1); }},
    {"niah_multikey", 16, true, [](const Ctx& c, int64_t n) { return build_niah(c, n, Hay::kEssay, Value::kNumber, 4, 1, 1); }},
    {"niah_multivalue", 48, true, [](const Ctx& c, int64_t n) { return build_niah(c, n, Hay::kEssay, Value::kNumber, 1, 4, 1); }},
    {"niah_multiquery", 48, true, [](const Ctx& c, int64_t n) { return build_niah(c, n, Hay::kEssay, Value::kNumber, 4, 1, 4); }},
    {"vt", 48, true, build_vt},
    {"cwe", 64, false, build_cwe},
    {"fwe", 24, false, build_fwe},
    {"passkey", 8, true, build_passkey},
}};

const TaskDef& find_task(std::string_view name) {
  for (const auto& t : kTasks)
    if (name == t.name) return t;
  std::string known;
  for (const auto& t : kTasks) known += std::string(known.empty() ? "" : ", ") + t.name;
  RETROINFER_FAIL("eval: unknown task '", name, "'; known tasks: ", known);
}

}  // namespace

std::string clean_bible_text(std::string_view raw) {
  std::string out;
  size_t pos = 0;
  while (pos < raw.size()) {
    size_t end = raw.find('\n', pos);
    if (end == std::string_view::npos) end = raw.size();
    std::string_view line = raw.substr(pos, end - pos);
    pos = end + 1;
    size_t b = line.find_first_not_of(" \t\r");
    if (b == std::string_view::npos) continue;
    line = line.substr(b);
    while (!line.empty() && (line.back() == ' ' || line.back() == '\r' || line.back() == '\t')) line.remove_suffix(1);
    // Chapter header: "<Book words> <number>" with nothing else (e.g. "Genesis 1", "1 Kings 3").
    const size_t sp = line.rfind(' ');
    if (sp != std::string_view::npos && sp + 1 < line.size() &&
        line.find_first_not_of("0123456789", sp + 1) == std::string_view::npos &&
        line.substr(0, sp).find_first_of(".,;:") == std::string_view::npos && sp < 24)
      continue;
    // Verse number at the start of a line.
    size_t d = 0;
    while (d < line.size() && line[d] >= '0' && line[d] <= '9') ++d;
    if (d > 0 && d < line.size() && line[d] == ' ') line = line.substr(d + 1);
    if (!out.empty()) out += ' ';
    out += line;
  }
  return out;
}

std::vector<std::string> split_words(std::string_view text) {
  std::vector<std::string> w;
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && std::isspace(static_cast<unsigned char>(text[i]))) ++i;
    size_t j = i;
    while (j < text.size() && !std::isspace(static_cast<unsigned char>(text[j]))) ++j;
    if (j > i) w.emplace_back(text.substr(i, j - i));
    i = j;
  }
  return w;
}

std::vector<std::string> filter_word_list(std::string_view dict) {
  std::vector<std::string> out;
  std::unordered_set<std::string> seen;
  for (const std::string& w : split_words(dict)) {
    if (w.size() < 3 || w.size() > 10) continue;
    if (!std::all_of(w.begin(), w.end(), [](char c) { return c >= 'a' && c <= 'z'; })) continue;
    if (seen.insert(w).second) out.push_back(w);
  }
  return out;
}

std::string load_bible_text(const std::vector<std::string>& ranges) {
  std::string all;
  for (const std::string& range : ranges) {
    RETROINFER_CHECK(range.find_first_of("'\"\\$`;|&<>") == std::string::npos, "eval: bad bible range '", range, "'");
    const std::string cmd = "bible '" + range + "' 2>/dev/null";
    FILE* p = popen(cmd.c_str(), "r");
    RETROINFER_CHECK(p != nullptr, "eval: cannot run `", cmd, "`; install bible-kjv (scripts/setup.sh)");
    std::string raw;
    char buf[65536];
    size_t got;
    while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) raw.append(buf, got);
    const int rc = pclose(p);
    const std::string text = clean_bible_text(raw);
    RETROINFER_CHECK(rc == 0 && !text.empty(), "eval: `", cmd, "` failed or printed nothing (exit status ", rc,
                     "); install bible-kjv (scripts/setup.sh) or pass --haystack-file");
    if (!all.empty()) all += ' ';
    all += text;
  }
  return all;
}

std::vector<std::string> load_word_list(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  RETROINFER_CHECK(f.good(), "eval: cannot read the word list '", path,
                   "'; install wamerican (scripts/setup.sh) or pass --word-list");
  std::stringstream ss;
  ss << f.rdbuf();
  std::vector<std::string> w = filter_word_list(ss.str());
  RETROINFER_CHECK(w.size() >= 1000, "eval: the word list '", path, "' has only ", w.size(),
                   " usable words (lowercase a-z, 3..10 letters); need 1000");
  return w;
}

const std::vector<std::string>& task_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const auto& t : kTasks) n.emplace_back(t.name);
    return n;
  }();
  return names;
}

std::vector<std::string> parse_task_list(std::string_view list) {
  if (list == "all") return task_names();
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t end = list.find(',', pos);
    if (end == std::string_view::npos) end = list.size();
    const std::string_view name = list.substr(pos, end - pos);
    if (!name.empty()) {
      find_task(name);
      out.emplace_back(name);
    }
    pos = end + 1;
  }
  RETROINFER_CHECK(!out.empty(), "eval: empty task list '", list, "'");
  return out;
}

TaskGenerator::TaskGenerator(TaskResources res, TokenCounter count, PromptWrapper wrap, TaskOptions opt)
    : res_(std::move(res)), count_(std::move(count)), wrap_(std::move(wrap)), opt_(opt) {
  RETROINFER_CHECK(res_.essay_words.size() >= 1000, "eval: the essay haystack has ", res_.essay_words.size(),
                   " words; need at least 1000");
  RETROINFER_CHECK(res_.words.size() >= 100, "eval: the word list has ", res_.words.size(), " words; need 100");
  RETROINFER_CHECK(count_ && wrap_, "eval: TaskGenerator needs a token counter and a prompt wrapper");
  RETROINFER_CHECK(opt_.num_depths >= 1, "eval: num_depths must be >= 1");
  RETROINFER_CHECK(opt_.tolerance > 0 && opt_.tolerance < 0.5, "eval: tolerance must be in (0, 0.5)");
}

TaskSample TaskGenerator::make(std::string_view task, int64_t target_tokens, int index) const {
  const TaskDef& def = find_task(task);
  RETROINFER_CHECK(index >= 0, "eval: negative sample index ", index);
  Ctx c;
  c.res = &res_;
  c.target = target_tokens;
  c.seed = fnv1a(task) ^ (opt_.seed * 0x9E3779B97F4A7C15ull) ^ (static_cast<uint64_t>(target_tokens) << 20) ^
           (static_cast<uint64_t>(index) * 0xD1B54A32D192ED03ull);
  c.depth = opt_.num_depths == 1 ? 0.5 : static_cast<double>(index % opt_.num_depths) / (opt_.num_depths - 1);

  const auto tokens_of = [&](int64_t n, Built* keep) {
    Built b = def.build(c, n);
    const std::string p = wrap_(b.user, b.answer_prefix);
    const int64_t t = count_(p);
    if (keep) *keep = std::move(b);
    return t;
  };
  // Tokens grow about linearly with the haystack units: fit a line through two small sizes, then correct
  // with the measured count (secant steps aimed at the middle of the accepted window).
  const int64_t lo = static_cast<int64_t>(std::ceil((1.0 - opt_.tolerance) * static_cast<double>(target_tokens)));
  const int64_t n_a = 32, n_b = 160;
  const int64_t t_a = tokens_of(n_a, nullptr), t_b = tokens_of(n_b, nullptr);
  const double slope = std::max(0.5, static_cast<double>(t_b - t_a) / (n_b - n_a));
  const double base = t_a - slope * n_a;
  RETROINFER_CHECK(base + slope < static_cast<double>(lo), "eval: task ", task, " needs about ",
                   static_cast<int64_t>(base + slope), " tokens of fixed text; a target of ", target_tokens,
                   " tokens is too small");
  const double aim = 0.5 * (lo + target_tokens);
  int64_t n = std::max<int64_t>(1, std::llround((aim - base) / slope));
  Built b;
  int64_t t = 0;
  for (int it = 0; it < 16; ++it) {
    t = tokens_of(n, &b);
    if (t >= lo && t <= target_tokens) break;
    int64_t step = std::llround((aim - static_cast<double>(t)) / slope);
    if (step == 0) step = t > target_tokens ? -1 : 1;
    n = std::max<int64_t>(1, n + step);
  }
  RETROINFER_CHECK(t >= lo && t <= target_tokens, "eval: could not size task ", task, " sample ", index, " to ",
                   target_tokens, " tokens (got ", t, " with ", n, " haystack units)");
  TaskSample s;
  s.task = def.name;
  s.target_tokens = target_tokens;
  s.index = index;
  s.prompt = wrap_(b.user, b.answer_prefix);
  s.prompt_tokens = t;
  s.references = std::move(b.refs);
  s.max_new_tokens = def.max_new_tokens;
  s.depth = def.has_depth ? c.depth : -1.0;
  s.needle_depths = std::move(b.needle_depths);
  for (const auto& nt : b.needle_texts) s.needle_offsets.push_back(s.prompt.find(nt));
  return s;
}

}  // namespace retroinfer::eval
