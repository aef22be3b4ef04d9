// GGUF container parsing: header, metadata of every type, tensor infos, alignment, dequantization, and
// rejection of corrupt files (every truncation, random byte flips, each bad field).
#include <gtest/gtest.h>

#include <random>

#include "io/gguf_reader.h"
#include "io_test_files.h"
#include "retroinfer/error.h"
#include "retroinfer/model_file.h"

using namespace retroinfer;
using namespace retroinfer::testing;
using retroinfer::io::parse_gguf;

namespace {

io::GgufContents parse(const std::vector<uint8_t>& b, const std::string& name = "test.gguf") {
  return parse_gguf(b.data(), b.size(), name);
}

// Expects parse to throw an Error whose message contains every needle.
void expect_parse_error(const std::vector<uint8_t>& b, std::initializer_list<const char*> needles) {
  try {
    parse(b);
    ADD_FAILURE() << "no error; expected one mentioning " << *needles.begin();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("test.gguf"), std::string::npos) << msg;
    for (const char* n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "missing '" << n << "' in: " << msg;
  }
}

std::vector<uint8_t> header(uint32_t version, uint64_t n_tensors, uint64_t n_kv) {
  std::vector<uint8_t> b;
  put<uint32_t>(b, 0x46554747u);
  put<uint32_t>(b, version);
  put<uint64_t>(b, n_tensors);
  put<uint64_t>(b, n_kv);
  return b;
}

// A small file with metadata of several kinds and three tensors of different types.
GgufWriter small_writer() {
  GgufWriter w;
  w.kv_str("general.architecture", "llama");
  w.kv_u32("llama.block_count", 2);
  w.kv_f32("llama.rope.freq_base", 10000.0f);
  w.kv_bool("tokenizer.ggml.add_bos_token", true);
  w.kv_str_array("tokenizer.ggml.tokens", {"<unk>", "a", "bc"});
  w.kv_i32_array("tokenizer.ggml.token_type", {2, 1, 1});
  w.tensor("a.weight", {4, 2}, kGgmlF32, f32_bytes({1, 2, 3, 4, 5, 6, 7, 8}));
  std::vector<uint8_t> q8(34, 0);
  q8[1] = 0x3c;  // d = 1.0 (f16 0x3c00)
  for (int j = 0; j < 32; ++j) q8[2 + j] = static_cast<uint8_t>(j - 16);
  w.tensor("b.weight", {32, 1}, kGgmlQ8_0, q8);
  w.tensor("c.weight", {3}, kGgmlF16, {0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38});
  return w;
}

}  // namespace

TEST(Gguf, ParsesHeaderMetadataAndTensors) {
  const auto bytes = small_writer().bytes();
  const auto g = parse(bytes);
  EXPECT_EQ(g.version, 3u);
  EXPECT_EQ(g.alignment, 32u);
  EXPECT_EQ(g.data_offset % 32, 0u);
  EXPECT_EQ(g.metadata.size(), 6u);
  EXPECT_EQ(g.metadata.get_string("general.architecture"), "llama");
  EXPECT_EQ(g.metadata.get_int("llama.block_count"), 2);
  EXPECT_FLOAT_EQ(g.metadata.get_float("llama.rope.freq_base"), 10000.0f);
  EXPECT_TRUE(g.metadata.get_bool("tokenizer.ggml.add_bos_token"));
  EXPECT_EQ(g.metadata.get_string_array("tokenizer.ggml.tokens"), (std::vector<std::string>{"<unk>", "a", "bc"}));
  EXPECT_EQ(g.metadata.get_int_array("tokenizer.ggml.token_type"), (std::vector<int64_t>{2, 1, 1}));
  EXPECT_EQ(g.metadata.get_float_array("tokenizer.ggml.token_type"), (std::vector<float>{2, 1, 1}));
  ASSERT_EQ(g.tensors.size(), 3u);
  EXPECT_EQ(g.tensors[0].name, "a.weight");
  EXPECT_EQ(g.tensors[0].dims, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(g.tensors[0].nbytes, 32u);
  EXPECT_EQ(g.tensors[1].type, WeightType::kQ8_0);
  EXPECT_EQ(g.tensors[1].nbytes, 34u);
  EXPECT_EQ(g.tensors[1].offset, 32u);  // 32 bytes of a.weight, already aligned
  EXPECT_EQ(g.tensors[2].offset, 96u);  // 32 + (34 rounded up to 64)
  float c[3];
  dequantize(g.tensors[2].type, g.tensors[2].data, 3, c);
  EXPECT_EQ(c[0], 1.0f);
  EXPECT_EQ(c[1], -2.0f);
  EXPECT_EQ(c[2], 0.5f);
  // Version 2 has the same layout.
  GgufWriter w2(2);
  w2.kv_u64("x", 7);
  EXPECT_EQ(parse(w2.bytes()).metadata.get_int("x"), 7);
}

TEST(Gguf, MetadataAllValueTypesAndNestedArrays) {
  GgufWriter w;
  auto kv = [&](const char* k, uint32_t t, std::vector<uint8_t> v) { w.kv_raw(k, t, v); };
  kv("u8", kGU8, {200});
  kv("i8", kGI8, {0xff});
  kv("u16", kGU16, {0x34, 0x12});
  kv("i16", kGI16, {0xfe, 0xff});
  w.kv_u32("u32", 4000000000u);
  w.kv_i32("i32", -5);
  w.kv_u64("u64", 0xffffffffffffffffull);
  {
    std::vector<uint8_t> b;
    put<int64_t>(b, -1234567890123ll);
    kv("i64", kGI64, b);
  }
  {
    std::vector<uint8_t> b;
    put<double>(b, 0.125);
    kv("f64", kGF64, b);
  }
  w.kv_f32("f32", 1.5f);
  w.kv_bool("flag", false);
  {  // [[1, 2], [3]] as array of arrays of int32
    std::vector<uint8_t> b;
    put<uint32_t>(b, kGArr);
    put<uint64_t>(b, 2);
    put<uint32_t>(b, kGI32);
    put<uint64_t>(b, 2);
    put<int32_t>(b, 1);
    put<int32_t>(b, 2);
    put<uint32_t>(b, kGI32);
    put<uint64_t>(b, 1);
    put<int32_t>(b, 3);
    kv("nested", kGArr, b);
  }
  w.kv_f32_array("floats", {0.5f, -1.0f});
  const auto bytes = w.bytes();
  const auto g = parse(bytes);
  const GgufMetadata& m = g.metadata;
  EXPECT_EQ(m.get_int("u8"), 200);
  EXPECT_EQ(m.get_int("i8"), -1);
  EXPECT_EQ(m.get_int("u16"), 0x1234);
  EXPECT_EQ(m.get_int("i16"), -2);
  EXPECT_EQ(m.get_int("u32"), 4000000000ll);
  EXPECT_EQ(m.get_int("i32"), -5);
  EXPECT_EQ(m.get_int("i64"), -1234567890123ll);
  EXPECT_EQ(m.get_float("f64"), 0.125);
  EXPECT_EQ(m.get_float("f32"), 1.5);
  EXPECT_FALSE(m.get_bool("flag"));
  EXPECT_EQ(m.get("u8").type, GgufType::kUint8);
  const auto& nested = std::get<std::vector<GgufValue>>(m.get("nested").value);
  ASSERT_EQ(nested.size(), 2u);
  EXPECT_EQ(nested[0].elem_type, GgufType::kInt32);
  EXPECT_EQ(std::get<std::vector<GgufValue>>(nested[1].value).size(), 1u);
  EXPECT_EQ(m.get_float_array("floats"), (std::vector<float>{0.5f, -1.0f}));
  EXPECT_EQ(m.get_int_or("absent", 9), 9);
  EXPECT_EQ(m.get_string_or("absent", "z"), "z");
  EXPECT_EQ(m.keys().front(), "f32");

  // Typed getters name the file and the key when missing or mistyped.
  auto expect_msg = [](auto fn, std::initializer_list<const char*> needles) {
    try {
      fn();
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      for (const char* n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
    }
  };
  expect_msg([&] { m.get_int("missing.key"); }, {"test.gguf", "missing.key", "missing"});
  expect_msg([&] { m.get_string("u32"); }, {"test.gguf", "'u32'", "uint32", "expected string"});
  expect_msg([&] { m.get_int("u64"); }, {"'u64'", "fits int64"});
  expect_msg([&] { m.get_int("f32"); }, {"'f32'", "float32"});
  expect_msg([&] { m.get_bool("i8"); }, {"'i8'", "expected bool"});
  expect_msg([&] { m.get_string_array("floats"); }, {"'floats'[0]", "float32", "expected string"});
  expect_msg([&] { m.get_int_array("nested"); }, {"'nested'[0]", "array of int32"});
  expect_msg([&] { m.get_float_array("u8"); }, {"'u8'", "uint8", "expected array"});
}

TEST(Gguf, CustomAlignment) {
  GgufWriter w;
  w.set_alignment(64);
  w.tensor("a", {8}, kGgmlF32, f32_bytes({1, 2, 3, 4, 5, 6, 7, 8}));
  w.tensor("b", {1}, kGgmlF32, f32_bytes({9}));
  const auto bytes = w.bytes();
  const auto g = parse(bytes);
  EXPECT_EQ(g.alignment, 64u);
  EXPECT_EQ(g.data_offset % 64, 0u);
  EXPECT_EQ(g.tensors[1].offset, 64u);
  float x;
  dequantize(WeightType::kF32, g.tensors[1].data, 1, &x);
  EXPECT_EQ(x, 9.0f);
}

TEST(Gguf, DequantizeHandComputedBlocks) {
  // Q8_0: d = 2.0 (f16 0x4000), q_j = j - 16 -> x_j = 2 (j - 16).
  std::vector<uint8_t> q8 = {0x00, 0x40};
  for (int j = 0; j < 32; ++j) q8.push_back(static_cast<uint8_t>(static_cast<int8_t>(j - 16)));
  // Q4_0: d = 0.5 (0x3800), qs[j] = j | (15 - j) << 4 -> x_j = (j - 8) / 2, x_{j+16} = (7 - j) / 2.
  std::vector<uint8_t> q40 = {0x00, 0x38};
  for (int j = 0; j < 16; ++j) q40.push_back(static_cast<uint8_t>(j | (15 - j) << 4));
  // Q4_1: d = 0.25 (0x3400), m = -1 (0xbc00), same nibbles -> x_j = j/4 - 1, x_{j+16} = (15 - j)/4 - 1.
  std::vector<uint8_t> q41 = {0x00, 0x34, 0x00, 0xbc};
  for (int j = 0; j < 16; ++j) q41.push_back(static_cast<uint8_t>(j | (15 - j) << 4));
  float out[32];
  dequantize(WeightType::kQ8_0, q8.data(), 32, out);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], 2.0f * (j - 16)) << "q8_0 element " << j;
  dequantize(WeightType::kQ4_0, q40.data(), 32, out);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * (j - 8)) << "q4_0 element " << j;
    EXPECT_EQ(out[j + 16], 0.5f * (7 - j)) << "q4_0 element " << j + 16;
  }
  dequantize(WeightType::kQ4_1, q41.data(), 32, out);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.25f * j - 1.0f) << "q4_1 element " << j;
    EXPECT_EQ(out[j + 16], 0.25f * (15 - j) - 1.0f) << "q4_1 element " << j + 16;
  }
  // F16: 1, -2, 0.5, 65504 (max half), -0; BF16: 1, -2, 0.5, 3.0 (0x4040).
  const std::vector<uint8_t> f16 = {0x00, 0x3c, 0x00, 0xc0, 0x00, 0x38, 0xff, 0x7b, 0x00, 0x80};
  dequantize(WeightType::kF16, f16.data(), 5, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 0.5f);
  EXPECT_EQ(out[3], 65504.0f);
  EXPECT_TRUE(out[4] == 0.0f && std::signbit(out[4]));
  const std::vector<uint8_t> bf16 = {0x80, 0x3f, 0x00, 0xc0, 0x00, 0x3f, 0x40, 0x40};
  dequantize(WeightType::kBF16, bf16.data(), 4, out);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  EXPECT_EQ(out[2], 0.5f);
  EXPECT_EQ(out[3], 3.0f);
  EXPECT_THROW(dequantize(WeightType::kQ4_0, q40.data(), 31, out), Error);
  EXPECT_EQ(weight_type_row_bytes(WeightType::kQ4_1, 64), 40u);
  EXPECT_THROW(weight_type_row_bytes(WeightType::kQ8_0, 33), Error);
}

TEST(Gguf, EveryTruncationIsAnError) {
  const auto full = small_writer().bytes();
  ASSERT_NO_THROW(parse(full));
  for (size_t n = 0; n < full.size(); ++n) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n));
    try {
      parse(cut);
      ADD_FAILURE() << "truncation at " << n << " of " << full.size() << " bytes parsed without error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("test.gguf"), std::string::npos) << "at " << n << ": " << e.what();
    }
  }
}

TEST(Gguf, RandomByteFlipsNeverCrash) {
  const auto full = small_writer().bytes();
  std::mt19937 rng(12345);
  int errors = 0;
  const int kCases = 3000;
  for (int c = 0; c < kCases; ++c) {
    auto b = full;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) b[rng() % b.size()] = static_cast<uint8_t>(rng());
    try {
      const auto g = parse(b);
      for (const auto& t : g.tensors) {  // whatever parsed must be readable in full
        std::vector<float> out(static_cast<size_t>(t.nbytes / weight_type_block_bytes(t.type) *
                                                   weight_type_block_elems(t.type)));
        dequantize(t.type, t.data, static_cast<int64_t>(out.size()), out.data());
      }
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 0) << "seed 12345";  // flips in the header must be caught
}

TEST(Gguf, RejectsBadHeaders) {
  auto bad_magic = small_writer().bytes();
  bad_magic[0] = 'X';
  expect_parse_error(bad_magic, {"bad magic", "not a GGUF file"});
  expect_parse_error(header(1, 0, 0), {"version 1", "not supported"});
  expect_parse_error(header(4, 0, 0), {"version 4"});
  expect_parse_error(header(0x03000000u, 0, 0), {"big-endian"});
  expect_parse_error(header(3, 1ull << 60, 0), {"tensor_count", "cannot fit"});
  expect_parse_error(header(3, 0, 1ull << 62), {"metadata_kv_count", "cannot fit"});
  expect_parse_error({0x47, 0x47}, {"header magic", "needs 4 bytes"});
}

TEST(Gguf, RejectsBadMetadata) {
  {  // key length far beyond the file
    auto b = header(3, 0, 1);
    put<uint64_t>(b, 1ull << 40);
    b.resize(b.size() + 20, 'k');
    expect_parse_error(b, {"metadata key #0", "string length"});
  }
  {  // invalid value type
    GgufWriter w;
    w.kv_raw("k", 13, {0});
    expect_parse_error(w.bytes(), {"'k'", "invalid value type code 13"});
  }
  {  // invalid array element type
    GgufWriter w;
    std::vector<uint8_t> v;
    put<uint32_t>(v, 77);
    put<uint64_t>(v, 0);
    w.kv_raw("arr", kGArr, v);
    expect_parse_error(w.bytes(), {"'arr'", "array element type code 77"});
  }
  {  // huge array length
    GgufWriter w;
    std::vector<uint8_t> v;
    put<uint32_t>(v, kGU32);
    put<uint64_t>(v, 1ull << 61);
    w.kv_raw("arr", kGArr, v);
    expect_parse_error(w.bytes(), {"'arr' array length", "cannot fit"});
  }
  {  // more array elements than the metadata cap (each is 1 byte here, so the file is 8 MiB)
    GgufWriter w;
    std::vector<uint8_t> v;
    put<uint32_t>(v, kGU8);
    put<uint64_t>(v, io::kGgufMaxMetadataElements + 1);
    v.resize(v.size() + io::kGgufMaxMetadataElements + 1, 0);
    w.kv_raw("big", kGArr, v);
    expect_parse_error(w.bytes(), {"'big' array length", "array elements"});
  }
  {  // arrays nested too deep
    GgufWriter w;
    std::vector<uint8_t> v;
    for (int d = 0; d < 10; ++d) {
      put<uint32_t>(v, kGArr);
      put<uint64_t>(v, 1);
    }
    put<uint32_t>(v, kGU8);
    put<uint64_t>(v, 0);
    w.kv_raw("deep", kGArr, v);
    expect_parse_error(w.bytes(), {"'deep'", "nests arrays deeper"});
  }
  {  // bool other than 0/1
    GgufWriter w;
    w.kv_raw("b", kGBool, {7});
    expect_parse_error(w.bytes(), {"'b' bool", "must be 0 or 1"});
  }
  {  // duplicate key
    GgufWriter w;
    w.kv_u32("dup", 1);
    w.kv_u32("dup", 2);
    expect_parse_error(w.bytes(), {"'dup'", "duplicated"});
  }
  {  // alignment not a power of two, or of the wrong type
    GgufWriter w;
    w.kv_u32("general.alignment", 24);
    expect_parse_error(w.bytes(), {"general.alignment", "power of two"});
    GgufWriter w2;
    w2.kv_u64("general.alignment", 32);
    expect_parse_error(w2.bytes(), {"general.alignment", "must be uint32"});
  }
}

TEST(Gguf, RejectsBadTensorInfos) {
  auto one = [](std::vector<uint64_t> dims, uint32_t type, size_t nbytes) {
    GgufWriter w;
    w.tensor("blk.3.attn_q.weight", std::move(dims), type, std::vector<uint8_t>(nbytes, 0));
    return w.bytes();
  };
  expect_parse_error(one({}, kGgmlF32, 4), {"'blk.3.attn_q.weight'", "n_dims 0"});
  expect_parse_error(one({1, 1, 1, 1, 1}, kGgmlF32, 4), {"n_dims 5"});
  expect_parse_error(one({4, 0}, kGgmlF32, 4), {"dim 1 is 0"});
  expect_parse_error(one({1ull << 40, 1ull << 40}, kGgmlF32, 4), {"overflows"});
  expect_parse_error(one({256}, 10, 84), {"Q2_K", "not supported"});
  expect_parse_error(one({32}, 14, 210), {"innermost dim 32", "block size 256"});  // Q6_K: 256-element blocks
  expect_parse_error(one({256, 4}, 12, 100), {"data [offset", "extends past end of file"});  // truncated Q4_K
  expect_parse_error(one({32}, 99, 4), {"type 99", "not supported"});
  expect_parse_error(one({33}, kGgmlQ8_0, 34), {"innermost dim 33", "block size 32"});
  expect_parse_error(one({64, 64}, kGgmlF32, 100), {"'blk.3.attn_q.weight' data [offset", "16384 bytes",
                                                    "extends past end of file (size"});
  {  // offset not aligned
    GgufWriter w;
    w.tensor("t", {8}, kGgmlF32, std::vector<uint8_t>(32, 0));
    auto bytes = w.bytes();
    // Locate the tensor name "t" and patch the offset field after n_dims, dims and type.
    const size_t name_at = 24 + 8;  // header (24) + name length (8)
    ASSERT_EQ(bytes[name_at], 't');
    const size_t offset_field = name_at + 1 + 4 + 8 + 4;
    bytes[offset_field] = 4;
    expect_parse_error(bytes, {"'t' data offset 4", "alignment 32"});
  }
  {  // duplicate tensor name and overlapping data
    GgufWriter w;
    w.tensor("t", {8}, kGgmlF32, std::vector<uint8_t>(32, 0));
    w.tensor("t", {8}, kGgmlF32, std::vector<uint8_t>(32, 0));
    expect_parse_error(w.bytes(), {"'t'", "listed twice"});
    GgufWriter w2;
    w2.tensor("a", {16}, kGgmlF32, std::vector<uint8_t>(64, 0));
    w2.tensor("b", {8}, kGgmlF32, std::vector<uint8_t>(32, 0));
    auto bytes = w2.bytes();
    const size_t b_offset_field = 24 + 8 + 1 + 4 + 8 + 4 + 8 + 8 + 1 + 4 + 8 + 4;
    ASSERT_EQ(bytes[b_offset_field], 64);
    bytes[b_offset_field] = 32;  // b now starts inside a
    expect_parse_error(bytes, {"'a'", "'b'", "overlap"});
  }
}
