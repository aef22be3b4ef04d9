// safetensors container parser: 8-byte little-endian header length, JSON header
// {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then the data. Internal
// to src/io.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "retroinfer/model_file.h"

namespace retroinfer::io {

inline constexpr uint64_t kSafetensorsMaxHeader = uint64_t{100} << 20;  // 100 MiB, as the reference reader

struct SafetensorsTensor {
  std::string name;
  WeightType type = WeightType::kF32;  // F32, F16 or BF16
  std::vector<int64_t> shape;          // row-major, outermost first
  const uint8_t* data = nullptr;       // into the file bytes
  size_t nbytes = 0;
};

struct SafetensorsContents {
  std::map<std::string, std::string> metadata;  // __metadata__
  std::vector<SafetensorsTensor> tensors;       // in header order
};

// Parses a whole safetensors file held in memory. Validates: header length inside the file, JSON
// object, dtype known and supported, shape non-negative without overflow, data_offsets inside the data
// section and equal to numel * dtype size, no overlaps. Throws Error naming `file` and the tensor/field.
SafetensorsContents parse_safetensors(const uint8_t* data, size_t size, const std::string& file);

}  // namespace retroinfer::io
