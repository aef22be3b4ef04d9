// dequantize() of the ggml block types Q5_0, Q5_1, Q4_K, Q5_K and Q6_K (src/io/ggml_quants.cpp) against the
// `gguf` package's numpy implementation (llama.cpp's gguf-py) on random blocks: tests/data/quant/ggml_blocks.json,
// made by scripts/make_quant_fixtures.py. Both follow llama.cpp's reference arithmetic; the bound allows for a
// different rounding order of d * sc * q - dmin * m (a few f32 ulps of the largest term).
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "retroinfer/error.h"
#include "retroinfer/model_file.h"

namespace retroinfer {
namespace {

std::vector<uint8_t> from_hex(const std::string& h) {
  std::vector<uint8_t> out(h.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
  return out;
}

WeightType weight_type_of(const std::string& name) {
  if (name == "Q5_0") return WeightType::kQ5_0;
  if (name == "Q5_1") return WeightType::kQ5_1;
  if (name == "Q4_K") return WeightType::kQ4_K;
  if (name == "Q5_K") return WeightType::kQ5_K;
  if (name == "Q6_K") return WeightType::kQ6_K;
  ADD_FAILURE() << "fixture type " << name;
  return WeightType::kF32;
}

nlohmann::json fixture() {
  std::ifstream f(std::string(RETROINFER_TEST_DATA) + "/quant/ggml_blocks.json");
  EXPECT_TRUE(f.good()) << "tests/data/quant/ggml_blocks.json missing (scripts/make_quant_fixtures.py makes it)";
  return nlohmann::json::parse(f);
}

TEST(GgmlQuants, DequantizeMatchesGgufPackage) {
  const nlohmann::json j = fixture();
  ASSERT_EQ(j.at("types").size(), 5u);
  for (const auto& c : j.at("types")) {
    const std::string name = c.at("type");
    const WeightType t = weight_type_of(name);
    const std::vector<uint8_t> raw = from_hex(c.at("bytes_hex"));
    const std::vector<float> want = c.at("values").get<std::vector<float>>();
    ASSERT_EQ(weight_type_block_elems(t), c.at("block_elems").get<int>()) << name;
    ASSERT_EQ(weight_type_block_bytes(t), c.at("block_bytes").get<int>()) << name;
    ASSERT_EQ(weight_type_row_bytes(t, static_cast<int64_t>(want.size())), raw.size()) << name;
    std::vector<float> got(want.size(), std::nanf(""));
    dequantize(t, raw.data(), static_cast<int64_t>(want.size()), got.data());
    double scale = 0.0;
    for (float w : want) scale = std::max(scale, std::fabs(double(w)));
    ASSERT_GT(scale, 0.0) << name;
    int bad = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      // 4 f32 ulps of the block's largest value: the two implementations may round d * sc, dmin * m and the
      // final subtraction in another order; a wrong nibble, bit or scale is off by a whole quantization step.
      if (!(std::fabs(double(got[i]) - want[i]) <= 4.0 * scale * 0x1p-23)) {
        if (++bad <= 5) ADD_FAILURE() << name << " element " << i << ": " << got[i] << " vs " << want[i];
      }
    }
    EXPECT_EQ(bad, 0) << name << ": " << bad << " of " << want.size() << " elements differ";
    EXPECT_EQ(weight_type_name(t).size(), 4u) << name;
  }
}

TEST(GgmlQuants, PartialBlocksAreRefused) {
  std::vector<uint8_t> raw(210, 0);
  std::vector<float> out(256);
  EXPECT_THROW(dequantize(WeightType::kQ6_K, raw.data(), 128, out.data()), Error);  // half a super-block
  EXPECT_THROW(dequantize(WeightType::kQ5_0, raw.data(), 31, out.data()), Error);
  EXPECT_THROW(weight_type_row_bytes(WeightType::kQ4_K, 100), Error);
  EXPECT_EQ(weight_type_row_bytes(WeightType::kQ4_K, 512), 288u);
  EXPECT_EQ(weight_type_row_bytes(WeightType::kQ5_1, 64), 48u);
}

}  // namespace
}  // namespace retroinfer
