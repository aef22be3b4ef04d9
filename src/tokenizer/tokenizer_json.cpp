// Loader for Hugging Face tokenizer.json (byte-level BPE) and the tokenizer_config.json beside it.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "retroinfer/error.h"
#include "retroinfer/tokenizer.h"
#include "tokenizer/tokenizer_impl.h"

namespace retroinfer {
namespace {

using nlohmann::json;
using tokenizer::TokenizerSpec;

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  RETROINFER_CHECK(f.good(), "tokenizer: cannot open '", path, "'; check the path");
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

const json& require(const json& j, const char* key, const std::string& where) {
  RETROINFER_CHECK(j.is_object() && j.contains(key), "tokenizer ", where, ": missing field '", key, "'");
  return j.at(key);
}

// A token id: an integer in [0, 2^31). get<TokenId>() of a float or of an integer out of range is undefined
// behaviour: a file with an id of 1.9e130 (found by fuzz_tokenizer) gets an Error.
TokenId token_id(const json& v, const std::string& origin, const char* what) {
  const bool ok = (v.is_number_unsigned() && v.get<uint64_t>() <= INT32_MAX) ||
                  (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() >= 0 &&
                   v.get<int64_t>() <= INT32_MAX);
  RETROINFER_CHECK(ok, "tokenizer ", origin, ": ", what, " must be a token id (an integer in [0, 2^31)), got ",
                   v.dump().substr(0, 64));
  return static_cast<TokenId>(v.get<int64_t>());
}

std::string type_of(const json& j) { return j.is_object() && j.contains("type") ? j["type"].get<std::string>() : ""; }

// Returns true if a ByteLevel step was seen.
bool parse_pre_tokenizer(const json& j, TokenizerSpec& spec) {
  if (j.is_null()) return false;
  const std::string type = type_of(j);
  const std::string& where = spec.origin;
  if (type == "Sequence") {
    bool byte_level = false;
    for (const json& p : require(j, "pretokenizers", where)) byte_level |= parse_pre_tokenizer(p, spec);
    return byte_level;
  }
  if (type == "ByteLevel") {
    spec.add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) spec.regexes.emplace_back(std::string(tokenizer::kGpt2Regex), false);
    return true;
  }
  if (type == "Split") {
    const json& pattern = require(j, "pattern", where);
    const std::string behavior = j.value("behavior", "Isolated");
    RETROINFER_CHECK(behavior == "Isolated", "tokenizer ", where, ": Split behavior '", behavior,
                     "' is not supported (only Isolated)");
    RETROINFER_CHECK(!j.value("invert", false), "tokenizer ", where, ": Split with invert=true is not supported");
    if (pattern.contains("Regex")) {
      spec.regexes.emplace_back(pattern["Regex"].get<std::string>(), false);
    } else if (pattern.contains("String")) {
      spec.regexes.emplace_back(pattern["String"].get<std::string>(), true);
    } else {
      RETROINFER_FAIL("tokenizer ", where, ": Split pattern is neither Regex nor String");
    }
    return false;
  }
  if (type == "Digits") {
    spec.regexes.emplace_back(j.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)", false);
    return false;
  }
  RETROINFER_FAIL("tokenizer ", where, ": pre_tokenizer type '", type,
                  "' is not supported (supported: Sequence, Split, ByteLevel, Digits)");
}

void parse_normalizer(const json& j, TokenizerSpec& spec) {
  if (j.is_null()) return;
  const std::string type = type_of(j);
  if (type == "Sequence") {
    for (const json& n : require(j, "normalizers", spec.origin)) parse_normalizer(n, spec);
  } else if (type == "NFC") {
    spec.nfc = true;
  } else {
    RETROINFER_FAIL("tokenizer ", spec.origin, ": normalizer '", type, "' is not supported (only NFC)");
  }
}

TokenId lookup(const TokenizerSpec& spec, const std::string& content) {
  for (const auto& a : spec.added) {
    if (a.content == content) return a.id;
  }
  for (const auto& [text, id] : spec.vocab) {
    if (text == content) return id;
  }
  RETROINFER_FAIL("tokenizer ", spec.origin, ": special token '", content, "' is not in the vocabulary");
}

void parse_post_processor(const json& j, TokenizerSpec& spec) {
  if (j.is_null()) return;
  const std::string type = type_of(j);
  if (type == "Sequence") {
    for (const json& p : require(j, "processors", spec.origin)) parse_post_processor(p, spec);
  } else if (type == "TemplateProcessing") {
    // single: [{SpecialToken: {id: name}}, ..., {Sequence: {id: "A"}}, ...]; special_tokens: name -> {ids}.
    const json& specials = j.value("special_tokens", json::object());
    bool after = false;
    for (const json& item : require(j, "single", spec.origin)) {
      if (item.contains("Sequence")) {
        after = true;
        continue;
      }
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      std::vector<TokenId> ids;
      if (specials.contains(name)) {
        for (const json& id : specials[name].at("ids")) ids.push_back(token_id(id, spec.origin, "a post_processor id"));
      } else {
        ids.push_back(lookup(spec, name));
      }
      auto& dst = after ? spec.suffix : spec.prefix;
      dst.insert(dst.end(), ids.begin(), ids.end());
    }
  } else if (type == "RobertaProcessing" || type == "BertProcessing") {
    spec.prefix.push_back(token_id(j.at("cls").at(1), spec.origin, "post_processor.cls"));
    spec.suffix.push_back(token_id(j.at("sep").at(1), spec.origin, "post_processor.sep"));
  } else if (type != "ByteLevel") {
    RETROINFER_FAIL("tokenizer ", spec.origin, ": post_processor '", type, "' is not supported");
  }
}

TokenizerSpec parse_tokenizer_json(std::string_view text, const std::string& origin) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    RETROINFER_FAIL("tokenizer ", origin, ": invalid JSON: ", e.what());
  }
  TokenizerSpec spec;
  spec.origin = origin;
  try {
    const json& model = require(j, "model", origin);
    const std::string type = model.value("type", "BPE");
    RETROINFER_CHECK(type == "BPE", "tokenizer ", origin, ": model type '", type,
                     "' is not supported (only byte-level BPE)");
    RETROINFER_CHECK(!model.value("byte_fallback", false), "tokenizer ", origin,
                     ": byte_fallback BPE (SentencePiece style) is not supported; only byte-level BPE is");
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      RETROINFER_CHECK(!model.contains(key) || model[key].is_null() || model[key].get<std::string>().empty(),
                       "tokenizer ", origin, ": model.", key, " is not supported");
    }
    spec.ignore_merges = model.value("ignore_merges", false);
    if (model.contains("unk_token") && model["unk_token"].is_string()) spec.unk = model["unk_token"].get<std::string>();
    spec.fuse_unk = model.value("fuse_unk", false);
    const json& vocab = require(model, "vocab", origin);
    RETROINFER_CHECK(vocab.is_object(), "tokenizer ", origin, ": model.vocab must be an object");
    spec.vocab.reserve(vocab.size());
    for (auto it = vocab.begin(); it != vocab.end(); ++it) spec.vocab.emplace_back(it.key(), token_id(it.value(), origin, "a model.vocab id"));
    const json& merges = require(model, "merges", origin);
    spec.merges.reserve(merges.size());
    for (const json& m : merges) {
      if (m.is_string()) {  // "left right"
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        RETROINFER_CHECK(space != std::string::npos && s.find(' ', space + 1) == std::string::npos, "tokenizer ",
                         origin, ": merge '", s, "' is not of the form 'left right'");
        spec.merges.emplace_back(s.substr(0, space), s.substr(space + 1));
      } else {  // ["left", "right"]
        RETROINFER_CHECK(m.is_array() && m.size() == 2, "tokenizer ", origin, ": merge ", m.dump(),
                         " is neither 'a b' nor [a, b]");
        spec.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      }
    }
    for (const json& a : j.value("added_tokens", json::array())) {
      tokenizer::AddedToken t;
      t.id = token_id(a.at("id"), origin, "an added_tokens id");
      t.content = a.at("content").get<std::string>();
      t.special = a.value("special", false);
      t.lstrip = a.value("lstrip", false);
      t.rstrip = a.value("rstrip", false);
      spec.added.push_back(std::move(t));
    }
    parse_normalizer(j.value("normalizer", json()), spec);
    const bool byte_level = parse_pre_tokenizer(j.value("pre_tokenizer", json()), spec);
    RETROINFER_CHECK(byte_level || type_of(j.value("decoder", json())) == "ByteLevel", "tokenizer ", origin,
                     ": no ByteLevel pre-tokenizer or decoder; only byte-level BPE is supported");
    parse_post_processor(j.value("post_processor", json()), spec);
  } catch (const json::exception& e) {
    RETROINFER_FAIL("tokenizer ", origin, ": unexpected JSON structure: ", e.what());
  }
  return spec;
}

std::optional<std::string> token_name(const json& cfg, const char* key) {
  if (!cfg.contains(key) || cfg[key].is_null()) return std::nullopt;
  const json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content")) return v["content"].get<std::string>();
  return std::nullopt;
}

// tokenizer_config.json: chat_template, bos_token, eos_token, add_bos_token (all optional).
void apply_tokenizer_config(const std::string& path, TokenizerSpec& spec) {
  json cfg;
  try {
    cfg = json::parse(read_file(path));
    if (cfg.contains("chat_template")) {
      const json& t = cfg["chat_template"];
      if (t.is_string()) {
        spec.chat_template = t.get<std::string>();
      } else if (t.is_array()) {  // [{name, template}, ...]: take "default"
        for (const json& e : t) {
          if (e.value("name", "") == "default") spec.chat_template = e.value("template", "");
        }
      }
    }
    if (auto bos = token_name(cfg, "bos_token")) spec.bos = lookup(spec, *bos);
    if (auto eos = token_name(cfg, "eos_token")) spec.eos = lookup(spec, *eos);
    if (cfg.value("add_bos_token", false) && spec.bos && spec.prefix.empty()) spec.prefix.push_back(*spec.bos);
  } catch (const json::exception& e) {
    RETROINFER_FAIL("tokenizer ", path, ": cannot read tokenizer_config.json: ", e.what());
  }
}

}  // namespace

std::unique_ptr<Tokenizer> Tokenizer::from_json_string(std::string_view json_text, const std::string& origin) {
  return std::unique_ptr<Tokenizer>(
      new Tokenizer(tokenizer::build_tokenizer_impl(parse_tokenizer_json(json_text, origin))));
}

std::unique_ptr<Tokenizer> Tokenizer::from_json_file(const std::string& path) {
  TokenizerSpec spec = parse_tokenizer_json(read_file(path), path);
  const auto config = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config)) apply_tokenizer_config(config.string(), spec);
  return std::unique_ptr<Tokenizer>(new Tokenizer(tokenizer::build_tokenizer_impl(std::move(spec))));
}

}  // namespace retroinfer
