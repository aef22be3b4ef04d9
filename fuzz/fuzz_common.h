// Shared by the fuzz targets: a per-process scratch file for the path-based entry points.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

namespace retroinfer::fuzz {

// Writes [size] bytes to a scratch file named after this process and returns its path.
inline std::string scratch_file(const uint8_t* data, size_t size, const char* ext) {
  const std::string path = "/tmp/retroinfer_fuzz_" + std::to_string(::getpid()) + ext;
  FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return path;
  if (size > 0) std::fwrite(data, 1, size, f);
  std::fclose(f);
  return path;
}

}  // namespace retroinfer::fuzz
