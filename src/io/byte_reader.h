// Bounds-checked little-endian cursor over a byte range. Every read checks the remaining size first and
// throws Error naming the file, the field and the offset. Internal to src/io.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

#include "retroinfer/error.h"

namespace retroinfer::io {

static_assert(std::endian::native == std::endian::little, "the GGUF/safetensors readers assume a little-endian host");

class ByteReader {
 public:
  ByteReader(const uint8_t* data, size_t size, const std::string& file) : data_(data), size_(size), file_(file) {}

  size_t pos() const { return pos_; }
  size_t size() const { return size_; }
  size_t remaining() const { return size_ - pos_; }
  const std::string& file() const { return file_; }

  // Throws unless n more bytes are available. `what` names the field being read.
  template <typename What>
  void need(size_t n, const What& what) const {
    if (n > remaining())
      RETROINFER_FAIL(file_, ": ", what, " at offset ", pos_, " needs ", n, " bytes, only ", remaining(),
                      " left (file size ", size_, "): the file is truncated or corrupt");
  }

  template <typename T, typename What>
  T read(const What& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));  // little-endian host assumed (x86-64, aarch64)
    pos_ += sizeof(T);
    return v;
  }

  // A string as a uint64 byte length followed by the bytes (GGUF); the length is checked against the
  // remaining bytes before anything is allocated.
  template <typename What>
  std::string read_string(const What& what) {
    const uint64_t n = read<uint64_t>(what);
    if (n > remaining())
      RETROINFER_FAIL(file_, ": ", what, " at offset ", pos_ - 8, ": string length ", n, " exceeds the ",
                      remaining(), " bytes left (file size ", size_, ")");
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }

  template <typename What>
  void skip(size_t n, const What& what) {
    need(n, what);
    pos_ += n;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  const std::string& file_;
};

}  // namespace retroinfer::io
