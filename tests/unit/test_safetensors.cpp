// safetensors: container parsing and validation, single-file and sharded checkpoints with config.json.
#include <gtest/gtest.h>

#include <random>

#include "io/safetensors_reader.h"
#include "io_test_files.h"
#include "retroinfer/error.h"
#include "retroinfer/model_file.h"

using namespace retroinfer;
using namespace retroinfer::testing;
using retroinfer::io::parse_safetensors;

namespace {

io::SafetensorsContents parse(const std::vector<uint8_t>& b) { return parse_safetensors(b.data(), b.size(), "x.safetensors"); }

void expect_parse_error(const std::vector<uint8_t>& b, std::initializer_list<const char*> needles) {
  try {
    parse(b);
    ADD_FAILURE() << "no error; expected one mentioning " << *needles.begin();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("x.safetensors"), std::string::npos) << msg;
    for (const char* n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
  }
}

void expect_open_error(const std::string& path, std::initializer_list<const char*> needles) {
  try {
    ModelFile::open(path);
    ADD_FAILURE() << "opened without error; expected " << *needles.begin();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
  }
}

std::vector<uint8_t> bf16_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b;
  for (float x : v) put<uint16_t>(b, f32_to_bf16(x));
  return b;
}

SafetensorsWriter small_writer() {
  SafetensorsWriter w;
  w.tensor("a", "F32", {2, 3}, f32_bytes({1, 2, 3, 4, 5, 6}));
  w.tensor("b", "F16", {2}, {0x00, 0x3c, 0x00, 0xc0});
  w.tensor("c", "BF16", {1, 2}, {0x80, 0x3f, 0x40, 0x40});
  w.metadata("format", "pt");
  return w;
}

// Writes the tiny model as an HF checkpoint: config.json + one or two safetensors shards.
void write_tiny(const TempDir& d, const TinyLlama& m, bool bf16, int shards) {
  write_text(d.file("config.json"), m.config_json());
  std::vector<SafetensorsWriter> ws(static_cast<size_t>(shards));
  nlohmann::json weight_map = nlohmann::json::object();
  int i = 0;
  for (const auto& [name, sv] : m.weights()) {
    const int s = i++ % shards;
    ws[static_cast<size_t>(s)].tensor(name, bf16 ? "BF16" : "F32", sv.first, bf16 ? bf16_bytes(sv.second) : f32_bytes(sv.second));
    weight_map[name] = "model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors";
  }
  if (shards == 1) {
    write_file(d.file("model.safetensors"), ws[0].bytes());
    return;
  }
  for (int s = 0; s < shards; ++s)
    write_file(d.file("model-0000" + std::to_string(s + 1) + "-of-0000" + std::to_string(shards) + ".safetensors"),
               ws[static_cast<size_t>(s)].bytes());
  write_text(d.file("model.safetensors.index.json"), nlohmann::json{{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}}.dump());
}

}  // namespace

TEST(Safetensors, ParsesTensorsAndMetadata) {
  const auto bytes = small_writer().bytes();
  const auto s = parse(bytes);
  EXPECT_EQ(s.metadata.at("format"), "pt");
  ASSERT_EQ(s.tensors.size(), 3u);
  EXPECT_EQ(s.tensors[0].name, "a");
  EXPECT_EQ(s.tensors[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(s.tensors[0].nbytes, 24u);
  float out[6];
  dequantize(s.tensors[0].type, s.tensors[0].data, 6, out);
  EXPECT_EQ(out[5], 6.0f);
  dequantize(s.tensors[1].type, s.tensors[1].data, 2, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  dequantize(s.tensors[2].type, s.tensors[2].data, 2, out);
  EXPECT_EQ(s.tensors[2].type, WeightType::kBF16);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 3.0f);
}

TEST(Safetensors, RejectsBadContainers) {
  const auto w = small_writer();
  expect_parse_error({1, 2, 3}, {"only 3 bytes"});
  {
    std::vector<uint8_t> b;
    put<uint64_t>(b, 1000);
    b.resize(100, ' ');
    expect_parse_error(b, {"header length 1000", "extends past end of file"});
  }
  {
    std::vector<uint8_t> b;
    put<uint64_t>(b, 1ull << 40);
    expect_parse_error(b, {"exceeds the limit"});
  }
  expect_parse_error(w.bytes_with_header("{not json"), {"not valid JSON"});
  expect_parse_error(w.bytes_with_header("[1, 2]"), {"must be a JSON object"});
  auto with = [&](const char* name, nlohmann::json spec) {
    SafetensorsWriter x = small_writer();
    x.header()[name] = std::move(spec);
    return x.bytes();
  };
  expect_parse_error(with("a", 5), {"tensor 'a'", "must be an object"});
  expect_parse_error(with("a", {{"shape", {6}}, {"data_offsets", {0, 24}}}), {"tensor 'a'", "'dtype'"});
  expect_parse_error(with("a", {{"dtype", "Q9"}, {"shape", {6}}, {"data_offsets", {0, 24}}}), {"unknown dtype 'Q9'"});
  expect_parse_error(with("a", {{"dtype", "I64"}, {"shape", {3}}, {"data_offsets", {0, 24}}}), {"I64", "not supported"});
  expect_parse_error(with("a", {{"dtype", "F32"}, {"shape", {-6}}, {"data_offsets", {0, 24}}}), {"shape entry -6"});
  expect_parse_error(with("a", {{"dtype", "F32"}, {"shape", {6}}, {"data_offsets", {0, 4000}}}),
                     {"tensor 'a'", "data_offsets [0, 4000]", "outside the data section"});
  expect_parse_error(with("a", {{"dtype", "F32"}, {"shape", {7}}, {"data_offsets", {0, 24}}}),
                     {"tensor 'a'", "holds 24 bytes", "needs 7 x 4"});
  expect_parse_error(with("a", {{"dtype", "F16"}, {"shape", {2, 3}}, {"data_offsets", {0, 24}}}), {"needs 6 x 2"});
  expect_parse_error(with("a", {{"dtype", "F32"}, {"shape", {6}}, {"data_offsets", {24, 0}}}), {"outside"});
  expect_parse_error(with("a", {{"dtype", "F32"}, {"shape", {6}}, {"data_offsets", {0}}}), {"data_offsets"});
  expect_parse_error(with("a", {{"dtype", "F32"}, {"shape", {1ll << 40, 1ll << 40}}, {"data_offsets", {0, 24}}}),
                     {"overflows"});
  expect_parse_error(with("a", {{"dtype", "F32"}, {"shape", {1}}, {"data_offsets", {24, 28}}}), {"overlap"});
  expect_parse_error(with("__metadata__", {{"k", 3}}), {"'__metadata__'.'k'", "must be a string"});
}

TEST(Safetensors, EveryTruncationAndRandomFlipsAreErrorsNotCrashes) {
  const auto full = small_writer().bytes();
  for (size_t n = 0; n < full.size(); ++n) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    EXPECT_THROW(parse(cut), Error) << "truncation at " << n << " of " << full.size();
  }
  std::mt19937 rng(777);
  for (int c = 0; c < 2000; ++c) {
    auto b = full;
    for (int f = 0; f < 3; ++f) b[rng() % b.size()] = static_cast<uint8_t>(rng());
    try {
      for (const auto& t : parse(b).tensors) {
        std::vector<float> out(t.nbytes / weight_type_block_bytes(t.type));
        dequantize(t.type, t.data, static_cast<int64_t>(out.size()), out.data());
      }
    } catch (const Error&) {
    }
  }
}

TEST(Safetensors, SingleFileDirectoryBf16) {
  TempDir d;
  const TinyLlama m;
  write_tiny(d, m, /*bf16=*/true, 1);
  for (const std::string& path : {d.path().string(), d.file("model.safetensors")}) {
    const auto f = ModelFile::open(path);
    EXPECT_EQ(f->path(), path);
    EXPECT_EQ(f->config().num_layers, 2);
    EXPECT_EQ(f->gguf_metadata(), nullptr);
    for (const auto& [name, sv] : m.weights()) {
      const TensorInfo& t = f->get(name);
      EXPECT_EQ(t.type, WeightType::kBF16);
      EXPECT_EQ(t.shape, sv.first);
      const auto got = f->to_f32(t);
      ASSERT_EQ(got.size(), sv.second.size());
      for (size_t i = 0; i < got.size(); ++i) ASSERT_EQ(got[i], bf16_to_f32(f32_to_bf16(sv.second[i]))) << name << "[" << i << "]";
    }
  }
}

TEST(Safetensors, ShardedCheckpoint) {
  TempDir d;
  TinyLlama m;
  m.tie = true;
  write_tiny(d, m, /*bf16=*/false, 2);
  const auto f = ModelFile::open(d.path().string());
  EXPECT_TRUE(f->config().tie_word_embeddings);
  EXPECT_EQ(f->tensor_names().size(), m.weights().size());
  for (const auto& [name, sv] : m.weights()) EXPECT_EQ(f->to_f32(f->get(name)), sv.second) << name;
}

TEST(Safetensors, CheckpointErrors) {
  const TinyLlama m;
  {  // no config.json
    TempDir d;
    write_tiny(d, m, false, 1);
    std::filesystem::remove(d.file("config.json"));
    expect_open_error(d.path().string(), {"config.json", "cannot open"});
  }
  {  // no weights
    TempDir d;
    write_text(d.file("config.json"), m.config_json());
    expect_open_error(d.path().string(), {"no model.safetensors"});
  }
  {  // lm_head missing although not tied
    TempDir d;
    TinyLlama tied = m;
    tied.tie = true;
    write_tiny(d, tied, false, 1);
    write_text(d.file("config.json"), m.config_json());
    expect_open_error(d.path().string(), {"required tensor 'lm_head.weight' is missing"});
  }
  {  // wrong shape vs config
    TempDir d;
    write_tiny(d, m, false, 1);
    TinyLlama wider = m;
    wider.ffn = 128;
    write_text(d.file("config.json"), wider.config_json());
    expect_open_error(d.path().string(), {"mlp.gate_proj.weight' has shape [96, 64]", "implies [128, 64]"});
  }
  {  // sharded: a shard file missing, a listed tensor absent, a path outside the folder
    TempDir d;
    write_tiny(d, m, false, 2);
    std::filesystem::remove(d.file("model-00002-of-00002.safetensors"));
    expect_open_error(d.path().string(), {"model-00002-of-00002.safetensors", "cannot open"});
    write_tiny(d, m, false, 2);
    auto idx = nlohmann::json::parse(std::ifstream(d.file("model.safetensors.index.json")));
    idx["weight_map"]["extra.weight"] = "model-00001-of-00002.safetensors";
    write_text(d.file("model.safetensors.index.json"), idx.dump());
    expect_open_error(d.path().string(), {"'extra.weight'", "does not contain it"});
    idx["weight_map"]["extra.weight"] = "../etc/passwd";
    write_text(d.file("model.safetensors.index.json"), idx.dump());
    expect_open_error(d.path().string(), {"'../etc/passwd'", "not a plain file name"});
    write_text(d.file("model.safetensors.index.json"), "{\"metadata\": {}}");
    expect_open_error(d.path().string(), {"'weight_map'"});
  }
  {  // unknown extension, missing path
    TempDir d;
    write_text(d.file("weights.bin"), "x");
    expect_open_error(d.file("weights.bin"), {"unknown model file extension '.bin'"});
    expect_open_error(d.file("nothing"), {"no such file or directory"});
  }
}
