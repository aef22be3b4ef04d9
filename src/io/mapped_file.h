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
  // Throws Error naming the file when it is now shorter than size() (truncated or rewritten in place since
  // it was mapped; a read of the mapping past the new end would raise SIGBUS). Checks the mapped inode (the
  // descriptor stays open), so a file replaced by rename passes: its old inode stays mapped and whole.
  void check_unchanged() const;
  // Drops the resident pages wholly inside [p, p + n) from this process (madvise MADV_DONTNEED): a caller that
  // copied the bytes lets them leave its resident set; a later read faults them back in from the file. Bytes
  // outside the mapping are ignored.
  void release_pages(const uint8_t* p, size_t n) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;  // kept open for check_unchanged()
};

}  // namespace retroinfer::io
