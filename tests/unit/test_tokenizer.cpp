// Tokenizer behaviour that needs no real vocabulary: byte map, UTF-8, round trips of arbitrary bytes,
// special-token parsing, streaming decode, chat templates, error paths, speed and thread safety.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <random>
#include <set>
#include <thread>

#include "retroinfer/error.h"
#include "retroinfer/tokenizer.h"
#include "test_tokenizer_util.h"
#include "test_util.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/utf8.h"

using namespace retroinfer;
using namespace retroinfer::test;

namespace {

const Tokenizer& tiny() {
  static const auto tok = Tokenizer::from_json_file(tokenizer_data("tiny_bpe.tokenizer.json"));
  return *tok;
}

const Tokenizer& smollm2() {
  static const auto tok = Tokenizer::from_vocab(load_smollm2_vocab());
  return *tok;
}

std::string random_utf8(std::mt19937& rng, size_t n_codepoints) {
  // Code points from every UTF-8 length class, surrogates excluded.
  std::uniform_int_distribution<int> cls(0, 9);
  std::string s;
  for (size_t i = 0; i < n_codepoints; ++i) {
    uint32_t cp = 0;
    switch (cls(rng)) {
      case 0: case 1: case 2: case 3: cp = std::uniform_int_distribution<uint32_t>(0x20, 0x7E)(rng); break;
      case 4: cp = std::uniform_int_distribution<uint32_t>(0, 0x1F)(rng); break;
      case 5: cp = std::uniform_int_distribution<uint32_t>(0x80, 0x7FF)(rng); break;
      case 6: cp = std::uniform_int_distribution<uint32_t>(0x800, 0xD7FF)(rng); break;
      case 7: cp = std::uniform_int_distribution<uint32_t>(0xE000, 0xFFFF)(rng); break;
      case 8: cp = std::uniform_int_distribution<uint32_t>(0x10000, 0x10FFFF)(rng); break;
      default: cp = " \t\n\r"[std::uniform_int_distribution<int>(0, 3)(rng)]; break;
    }
    tokenizer::append_utf8(s, cp);
  }
  return s;
}

}  // namespace

TEST(TokenizerByteLevel, MapIsABijectionOnBytes) {
  const auto& m = tokenizer::ByteLevelMap::instance();
  std::set<std::string> seen;
  std::string all;
  for (int b = 0; b < 256; ++b) {
    seen.insert(m.byte_to_text(static_cast<uint8_t>(b)));
    all.push_back(static_cast<char>(b));
  }
  EXPECT_EQ(seen.size(), 256u);
  EXPECT_EQ(m.byte_to_text(' '), "\xC4\xA0");   // 'Ġ' U+0120
  EXPECT_EQ(m.byte_to_text('\n'), "\xC4\x8A");  // 'Ċ' U+010A
  EXPECT_EQ(m.byte_to_text('A'), "A");
  std::string mapped, back;
  m.encode(all, mapped);
  ASSERT_TRUE(m.decode(mapped, back));
  EXPECT_EQ(back, all);
  EXPECT_FALSE(m.decode("\xE4\xBD\xA0", back));  // U+4F60 stands for no byte
}

TEST(TokenizerUtf8, Validation) {
  EXPECT_TRUE(tokenizer::is_valid_utf8("abc \xC3\xA9 \xE4\xBD\xA0 \xF0\x9F\x98\x80"));
  for (const char* bad : {"\x80", "\xC0\xAF", "\xC3", "\xE0\x80\x80", "\xED\xA0\x80", "\xF4\x90\x80\x80",
                          "\xF8\x88\x80\x80\x80", "\xFF", "\xE4\xBD"}) {
    EXPECT_FALSE(tokenizer::is_valid_utf8(bad)) << nlohmann::json::binary({}).dump() << std::string(bad).size();
  }
  EXPECT_EQ(tokenizer::utf8_incomplete_len("\xF0\x9F\x98", 0), 3u);
  EXPECT_EQ(tokenizer::utf8_incomplete_len("\xE0\x80", 0), 0u);  // can never become valid (overlong)
}

TEST(Tokenizer, RoundTripRandomValidUtf8) {
  std::mt19937 rng(42);
  for (int i = 0; i < 300; ++i) {
    const std::string s = random_utf8(rng, 1 + i % 40);
    EXPECT_EQ(tiny().decode(tiny().encode(s)), s) << "seed 42 case " << i;
    EXPECT_EQ(smollm2().decode(smollm2().encode(s)), drop_untokenizable(smollm2(), s)) << "seed 42 case " << i;
  }
}

// Invalid UTF-8: each byte outside a valid sequence becomes its own byte token; any byte string round-trips.
TEST(Tokenizer, InvalidUtf8BytesRoundTrip) {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int i = 0; i < 300; ++i) {
    std::string s(static_cast<size_t>(1 + i % 50), '\0');
    for (char& c : s) c = static_cast<char>(byte(rng));
    EXPECT_EQ(tiny().decode(tiny().encode(s)), s) << "seed 7 case " << i;
    EXPECT_EQ(smollm2().decode(smollm2().encode(s)), drop_untokenizable(smollm2(), s)) << "seed 7 case " << i;
  }
  const std::string bad = "ab\xFF\xFE" "cd \xC3";  // invalid bytes and a truncated sequence at the end
  const auto ids = tiny().encode(bad);
  EXPECT_EQ(tiny().decode(ids), bad);
  const auto ff = tiny().token_to_id(tokenizer::ByteLevelMap::instance().byte_to_text(0xFF));
  ASSERT_TRUE(ff.has_value());
  EXPECT_NE(std::find(ids.begin(), ids.end(), *ff), ids.end());
}

TEST(Tokenizer, SpecialTokensInText) {
  const Tokenizer& t = smollm2();
  const TokenId im_start = *t.token_to_id("<|im_start|>");
  const TokenId im_end = *t.token_to_id("<|im_end|>");
  const auto ids = t.encode("<|im_start|>user\nHi<|im_end|>");
  ASSERT_GE(ids.size(), 4u);
  EXPECT_EQ(ids.front(), im_start);
  EXPECT_EQ(ids.back(), im_end);
  // parse_special=false: the same text is plain text, no control id appears, and it round-trips.
  const auto plain = t.encode("<|im_start|>user\nHi<|im_end|>", false, false);
  for (TokenId id : plain) EXPECT_FALSE(t.is_control(id)) << id;
  EXPECT_EQ(t.decode(plain), "<|im_start|>user\nHi<|im_end|>");
  EXPECT_EQ(t.decode(ids, /*skip_special=*/true), "user\nHi");
  // A prefix of a special token is not one.
  EXPECT_EQ(t.decode(t.encode("<|im_start")), "<|im_start");
  EXPECT_EQ(std::count(ids.begin(), ids.end(), im_start), 1);
}

TEST(Tokenizer, AddBosAndErrors) {
  auto tok = Tokenizer::from_vocab(load_smollm2_vocab());
  EXPECT_EQ(tok->encode("Hi", true), tok->encode("Hi"));
  tok->set_add_bos(true);
  const auto ids = tok->encode("Hi", true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(tok->encode("Hi", false).size() + 1, ids.size());
}

TEST(Tokenizer, DecodeOutOfRangeThrows) {
  const Tokenizer& t = tiny();
  const std::vector<TokenId> bad_hi{0, t.vocab_size()};
  const std::vector<TokenId> bad_neg{-1};
  EXPECT_THROW(t.decode(bad_hi), Error);
  EXPECT_THROW(t.decode(bad_neg), Error);
  EXPECT_THROW(t.token_to_piece(1 << 20), Error);
  EXPECT_NO_THROW(t.decode(std::vector<TokenId>{0, t.vocab_size() - 1}));
}

TEST(Tokenizer, EmptyAndPathologicalInputsFinish) {
  const Tokenizer& t = smollm2();
  EXPECT_TRUE(t.encode("").empty());
  // Long runs that exercise regex backtracking and long BPE words; each must finish quickly and round-trip.
  for (const std::string& s : {std::string(100000, ' '), std::string(50000, 'a'), std::string(30000, '\n'),
                               std::string(20000, '9'), std::string(" \n", 0) + std::string(40000, '\t') + "x"}) {
    const auto start = std::chrono::steady_clock::now();
    const auto ids = t.encode(s);
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(t.decode(ids), s);
    EXPECT_LT(secs, 2.0 * test::kTimeBoundScale) << s.size() << " bytes of 0x" << std::hex << int(s[0]);
  }
}

TEST(StreamingDecoder, HoldsBackIncompleteUtf8) {
  const Tokenizer& t = smollm2();
  const std::string text = "Emoji 👨‍👩‍👧 and 你好 and é, done.";
  const auto ids = t.encode(text);
  StreamingDecoder dec(t);
  std::string streamed;
  size_t held = 0;
  for (TokenId id : ids) {
    const std::string part = dec.push(id);
    EXPECT_TRUE(tokenizer::is_valid_utf8(part));
    held += dec.pending_bytes() > 0;
    streamed += part;
  }
  streamed += dec.flush();
  EXPECT_EQ(streamed, text);
  EXPECT_GT(held, 0u) << "the emoji/CJK should have been split across byte tokens at least once";
  // Byte tokens pushed one by one: nothing comes out until the 4-byte sequence is complete.
  StreamingDecoder d2(t);
  const auto& bl = tokenizer::ByteLevelMap::instance();
  const std::string smile = "\xF0\x9F\x98\x80";
  for (size_t i = 0; i < 4; ++i) {
    const auto id = t.token_to_id(bl.byte_to_text(static_cast<uint8_t>(smile[i])));
    ASSERT_TRUE(id.has_value());
    EXPECT_EQ(d2.push(*id), i < 3 ? "" : smile) << i;
  }
  // An invalid byte becomes U+FFFD; an incomplete tail is replaced at flush.
  StreamingDecoder d3(tiny());
  EXPECT_EQ(d3.push(*tiny().token_to_id(bl.byte_to_text(0xFF))), "\xEF\xBF\xBD");
  EXPECT_EQ(d3.push(*tiny().token_to_id(bl.byte_to_text(0xE4))), "");
  EXPECT_EQ(d3.push(*tiny().token_to_id("a")), "\xEF\xBF\xBD" "a");
  EXPECT_EQ(d3.push(*tiny().token_to_id(bl.byte_to_text(0xE4))), "");
  EXPECT_EQ(d3.flush(), "\xEF\xBF\xBD");
  EXPECT_THROW(d3.push(-5), Error);
}

TEST(ChatTemplate, MatchesJinjaGoldens) {
  const auto g = load_json(tokenizer_data("chat_goldens.json"));
  int n = 0;
  for (const auto& c : g.at("cases")) {
    std::vector<ChatMessage> msgs;
    for (const auto& m : c.at("messages")) msgs.push_back({m.at("role"), m.at("content")});
    const ChatFormat f = parse_chat_format(c.at("format").get<std::string>());
    EXPECT_EQ(apply_chat_template(f, msgs, c.at("add_generation_prompt").get<bool>()), c.at("text").get<std::string>())
        << "case " << n << " format " << c.at("format");
    ++n;
  }
  EXPECT_GE(n, 24);
}

TEST(ChatTemplate, DetectionAndNames) {
  const auto g = load_json(tokenizer_data("smollm2_vocab.json"));
  EXPECT_EQ(detect_chat_format_from_template(g.at("chat_template").get<std::string>()), ChatFormat::kSmolLM2);
  EXPECT_EQ(detect_chat_format_from_template("{{'<|start_header_id|>'}}"), ChatFormat::kLlama3);
  EXPECT_EQ(detect_chat_format_from_template("<|im_start|>system\nYou are a helpful assistant."), ChatFormat::kQwen2);
  EXPECT_EQ(detect_chat_format_from_template("<|im_start|>{{x}}<think>"), ChatFormat::kQwen3);
  EXPECT_EQ(detect_chat_format_from_template("{{ bos }}[INST]"), ChatFormat::kNone);
  for (ChatFormat f : {ChatFormat::kLlama3, ChatFormat::kChatML, ChatFormat::kQwen2, ChatFormat::kQwen25,
                       ChatFormat::kQwen3, ChatFormat::kSmolLM2}) {
    EXPECT_EQ(parse_chat_format(chat_format_name(f)), f);
  }
  EXPECT_THROW(parse_chat_format("jinja"), Error);
  const std::vector<ChatMessage> msgs{{"user", "hi"}};
  EXPECT_THROW(apply_chat_template(ChatFormat::kNone, msgs, true), Error);
  EXPECT_EQ(apply_chat_template(ChatFormat::kQwen2, msgs, true),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\n");
  // The rendered template tokenizes with the control tokens as single ids.
  const auto ids = smollm2().encode(smollm2().apply_chat_template(msgs, true));
  EXPECT_EQ(std::count(ids.begin(), ids.end(), *smollm2().token_to_id("<|im_start|>")), 3);
}

TEST(TokenizerErrors, BadJson) {
  EXPECT_THROW(Tokenizer::from_json_string("{not json"), Error);
  EXPECT_THROW(Tokenizer::from_json_string(R"({"model": {"type": "Unigram", "vocab": []}})"), Error);
  EXPECT_THROW(Tokenizer::from_json_string(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                                               "pre_tokenizer": {"type": "Metaspace"}})"), Error);
  // A merge whose result is missing from the vocabulary.
  EXPECT_THROW(Tokenizer::from_json_string(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1},
               "merges": ["a b"]}, "pre_tokenizer": {"type": "ByteLevel"}})"), Error);
  EXPECT_THROW(Tokenizer::from_json_string(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["ab"]},
                                               "pre_tokenizer": {"type": "ByteLevel"}})"), Error);
  EXPECT_THROW(Tokenizer::from_json_string(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
               "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated"}})"),
               Error);
  EXPECT_THROW(Tokenizer::from_json_file("/nonexistent/tokenizer.json"), Error);
  // A minimal valid file loads; a byte missing from its vocabulary is dropped (no unk token), as HF does.
  auto t = Tokenizer::from_json_string(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2},
      "merges": [["a", "b"]]}, "pre_tokenizer": {"type": "ByteLevel", "use_regex": true}})");
  EXPECT_EQ(t->encode("abab"), (std::vector<TokenId>{2, 2}));
  EXPECT_EQ(t->encode("abc"), (std::vector<TokenId>{2}));
  auto u = Tokenizer::from_json_string(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "<unk>": 3},
      "merges": [["a", "b"]], "unk_token": "<unk>"}, "pre_tokenizer": {"type": "ByteLevel", "use_regex": true}})");
  EXPECT_EQ(u->encode("acb"), (std::vector<TokenId>{0, 3, 1}));  // unk stops the merge of a and b
}

TEST(TokenizerErrors, BadGgufVocab) {
  GgufVocab v;
  v.tokens = {"a", "b", "ab"};
  v.merges = {"a b"};
  v.pre = "gpt2";
  EXPECT_EQ(Tokenizer::from_vocab(v)->encode("ab"), std::vector<TokenId>{2});
  GgufVocab w = v;
  w.pre = "no-such-pre";
  EXPECT_THROW(Tokenizer::from_vocab(w), Error);
  w = v;
  w.token_types = {1, 1};
  EXPECT_THROW(Tokenizer::from_vocab(w), Error);
  w = v;
  w.model = "llama";
  EXPECT_THROW(Tokenizer::from_vocab(w), Error);
  w = v;
  w.merges = {"a c"};
  EXPECT_THROW(Tokenizer::from_vocab(w), Error);
  w = v;
  w.eos_id = 99;
  EXPECT_THROW(Tokenizer::from_vocab(w), Error);
  w = v;
  w.add_bos = true;  // but no bos id
  EXPECT_THROW(Tokenizer::from_vocab(w), Error);
  EXPECT_THROW(Tokenizer::from_vocab(GgufVocab{}), Error);
  // Tolerated: a merge producing a control token, and an empty control token (padding).
  w = v;
  w.tokens.push_back("");
  w.token_types = {1, 1, 3, 3};
  auto t = Tokenizer::from_vocab(w);
  EXPECT_EQ(t->encode("ab"), std::vector<TokenId>{2});
  EXPECT_EQ(t->decode(std::vector<TokenId>{3, 0}), "a");
}

TEST(PreTokenizer, IsolatedSplitKeepsEverything) {
  tokenizer::PreTokenizer p;
  p.add_regex(tokenizer::kDigitsRegex);
  p.add_regex(tokenizer::kGpt2Regex);
  std::vector<std::string_view> out;
  p.split("Hello  world 123!!\n", out);
  const std::vector<std::string_view> want{"Hello", " ", " world", " ", "1", "2", "3", "!!", "\n"};
  EXPECT_EQ(out, want);
  tokenizer::Regex lit("a.b", /*literal=*/true);
  out.clear();
  lit.split_isolated("xa.bxaxb", out);
  EXPECT_EQ(out, (std::vector<std::string_view>{"x", "a.b", "xaxb"}));
}

// "Efficient enough": ~10K tokens of English-like text in well under a second on a cold cache.
TEST(TokenizerSpeed, TenThousandTokensEnglish) {
  auto tok = Tokenizer::from_vocab(load_smollm2_vocab());
  std::mt19937 rng(3);
  const std::vector<std::string> words{"the", "of", "and", "a", "to", "in", "is", "was", "that", "for", "it",
                                       "with", "as", "his", "on", "be", "at", "by", "I", "this", "had", "not"};
  std::string text;
  std::uniform_int_distribution<int> pick(0, static_cast<int>(words.size()) - 1), len(2, 10), letter(0, 25),
      kind(0, 9);
  while (text.size() < 48000) {
    if (kind(rng) < 6) {
      text += words[pick(rng)];
    } else {  // a random made-up word: defeats the per-word cache
      for (int i = len(rng); i > 0; --i) text.push_back(static_cast<char>('a' + letter(rng)));
    }
    text += kind(rng) == 0 ? ". " : " ";
  }
  const auto start = std::chrono::steady_clock::now();
  const auto ids = tok->encode(text);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(tok->decode(ids), text);
  std::printf("[ speed ] %zu bytes -> %zu tokens in %.3f s (%.0f tokens/s)\n", text.size(), ids.size(), secs,
              static_cast<double>(ids.size()) / secs);
  EXPECT_GT(ids.size(), 10000u);
  EXPECT_LT(secs, 1.0 * test::kTimeBoundScale);
}

TEST(TokenizerThreads, ConcurrentEncodeAgrees) {
  const Tokenizer& t = smollm2();
  std::mt19937 rng(11);
  std::vector<std::string> texts;
  for (int i = 0; i < 64; ++i) texts.push_back(random_utf8(rng, 30));
  std::vector<std::vector<TokenId>> want;
  for (const auto& s : texts) want.push_back(t.encode(s));
  ASSERT_EQ(t.decode(want[0]), drop_untokenizable(t, texts[0]));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 5; ++rep) {
        for (size_t i = 0; i < texts.size(); ++i) mismatches[k] += t.encode(texts[i]) != want[i];
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int k = 0; k < 4; ++k) EXPECT_EQ(mismatches[k], 0) << "thread " << k;
}
