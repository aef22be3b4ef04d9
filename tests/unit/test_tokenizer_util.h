// Helpers shared by the tokenizer tests: fixture paths and golden files.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>

#include "retroinfer/tokenizer.h"

namespace retroinfer::test {

inline std::string tokenizer_data(const std::string& name) {
  return std::string(RETROINFER_TEST_DATA) + "/tokenizer/" + name;
}

inline nlohmann::json load_json(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f.good()) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << f.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// shared/assets/tokenizers/<name>/tokenizer.json if present: $RETROINFER_ASSETS_DIR, then shared/ beside the
// repository (CI clone), then two levels up (helper worktrees under /work/wt/).
inline std::optional<std::string> asset_tokenizer(const std::string& name) {
  namespace fs = std::filesystem;
  std::vector<fs::path> roots;
  if (const char* env = std::getenv("RETROINFER_ASSETS_DIR")) roots.emplace_back(env);
  const fs::path src(RETROINFER_SOURCE_DIR);
  roots.push_back(src / ".." / "shared" / "assets");
  roots.push_back(src / ".." / ".." / "shared" / "assets");
  for (const auto& r : roots) {
    const fs::path p = r / "tokenizers" / name / "tokenizer.json";
    if (fs::exists(p)) return p.string();
  }
  return std::nullopt;
}

// The SmolLM2 GGUF vocabulary fixture, merges rebuilt from their compact form (see
// scripts/make_tokenizer_goldens.py, compact_vocab).
inline GgufVocab load_smollm2_vocab() {
  const nlohmann::json j = load_json(tokenizer_data("smollm2_vocab.json"));
  GgufVocab v;
  v.tokens = j.at("tokens").get<std::vector<std::string>>();
  v.token_types = j.at("token_types").get<std::vector<int32_t>>();
  v.model = j.at("model").get<std::string>();
  v.pre = j.at("pre").get<std::string>();
  v.bos_id = j.at("bos_id").get<int64_t>();
  v.eos_id = j.at("eos_id").get<int64_t>();
  v.pad_id = j.at("pad_id").get<int64_t>();
  v.add_bos = j.at("add_bos").get<bool>();
  v.chat_template = j.at("chat_template").get<std::string>();
  const auto first = j.at("first_merge_result").get<size_t>();
  const auto left = j.at("merge_left_bytes").get<std::vector<size_t>>();
  for (size_t i = 0; i < left.size(); ++i) {
    const std::string& t = v.tokens.at(first + i);
    v.merges.push_back(t.substr(0, left[i]) + " " + t.substr(left[i]));
  }
  return v;
}

// Checks every golden case: exact ids, and decode(ids) == expected_text(text).
template <typename Normalise>
void check_goldens(const Tokenizer& tok, const std::string& golden_file, Normalise expected_text) {
  const nlohmann::json g = load_json(tokenizer_data(golden_file));
  int checked = 0;
  for (const auto& c : g.at("cases")) {
    const std::string text = c.at("text").get<std::string>();
    const auto want = c.at("ids").get<std::vector<TokenId>>();
    const std::vector<TokenId> got = tok.encode(text);
    EXPECT_EQ(got, want) << golden_file << " case " << checked << " text " << nlohmann::json(text).dump();
    EXPECT_EQ(tok.decode(got), expected_text(text)) << golden_file << " case " << checked;
    ++checked;
  }
  EXPECT_GT(checked, 50) << golden_file;
}

inline std::string identity(const std::string& s) { return s; }

// s without the bytes that have no token in tok's byte-level vocabulary (encode drops them, as HF does).
inline std::string drop_untokenizable(const Tokenizer& tok, const std::string& s);
}  // namespace retroinfer::test

#include "tokenizer/utf8.h"

namespace retroinfer::test {
inline std::string drop_untokenizable(const Tokenizer& tok, const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (tok.token_to_id(tokenizer::ByteLevelMap::instance().byte_to_text(c))) out.push_back(static_cast<char>(c));
  }
  return out;
}

}  // namespace retroinfer::test
