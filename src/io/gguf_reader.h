// GGUF v2/v3 container parser: header, metadata, tensor infos, data section. Everything is validated
// before use; no name mapping or model semantics here (see gguf_model.cpp). Internal to src/io.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "retroinfer/model_file.h"

namespace retroinfer::io {

inline constexpr uint32_t kGgufMagic = 0x46554747u;  // "GGUF" read as a little-endian uint32
inline constexpr uint32_t kGgufDefaultAlignment = 32;
inline constexpr int kGgufMaxDims = 4;          // GGML_MAX_DIMS
inline constexpr int kGgufMaxArrayDepth = 8;    // nested arrays deeper than this are rejected
// Cap on array elements over all metadata: each element becomes a GgufValue (~64 bytes), so a crafted
// file of N bytes could otherwise ask for ~64 N bytes. Real files hold well under 1M (a 256K-token
// vocabulary: tokens + scores + types + ~300K merges); 2^23 leaves 8x headroom and bounds the memory
// at ~0.5 GiB.
inline constexpr uint64_t kGgufMaxMetadataElements = uint64_t{1} << 23;

// ggml type codes of the supported tensor types.
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14,
  kBF16 = 30
};
// Name of any ggml type code ("Q6_K", ...) for messages; "type N" when unknown.
std::string ggml_type_name(uint32_t code);

struct GgufTensor {
  std::string name;           // ggml name, e.g. "blk.0.attn_q.weight"
  uint32_t ggml_type = 0;     // as stored
  WeightType type = WeightType::kF32;
  std::vector<int64_t> dims;  // ggml order: innermost (contiguous) first
  uint64_t offset = 0;        // relative to the data section
  const uint8_t* data = nullptr;  // into the file bytes
  size_t nbytes = 0;
};

struct GgufContents {
  uint32_t version = 0;
  uint32_t alignment = kGgufDefaultAlignment;
  uint64_t data_offset = 0;  // absolute file offset of the data section
  GgufMetadata metadata;
  std::vector<GgufTensor> tensors;  // in file order
};

// Parses a whole GGUF file held in memory ([size] bytes at data). `file` names it in errors.
// Throws Error naming the file and the field on any inconsistency; never reads out of bounds.
GgufContents parse_gguf(const uint8_t* data, size_t size, const std::string& file);

}  // namespace retroinfer::io
