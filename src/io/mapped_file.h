// A whole file mapped read-only into memory (mmap). Internal to src/io.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace retroinfer::io {

// Threading contract: immutable after construction; readable from any thread.
class MappedFile {
 public:
  // Maps `path` read-only. Throws Error naming the file when it is missing, not a regular file, or
  // cannot be mapped. An empty file maps to size() == 0 and data() == nullptr.
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }  // [size()] bytes
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace retroinfer::io
