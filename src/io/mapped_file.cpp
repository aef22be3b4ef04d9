#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "retroinfer/error.h"

namespace retroinfer::io {

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  RETROINFER_CHECK(fd >= 0, path_, ": cannot open: ", std::strerror(errno),
                   " (check the path; scripts/setup.sh installs the default model)");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    RETROINFER_FAIL(path_, ": cannot stat: ", std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    RETROINFER_FAIL(path_, ": not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    const int e = errno;
    if (p == MAP_FAILED) ::close(fd);
    RETROINFER_CHECK(p != MAP_FAILED, path_, ": mmap of ", size_, " bytes failed: ", std::strerror(e));
    data_ = static_cast<const uint8_t*>(p);
  }
  fd_ = fd;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  if (fd_ >= 0) ::close(fd_);
}

void MappedFile::check_unchanged() const {
  struct stat st {};
  RETROINFER_CHECK(::fstat(fd_, &st) == 0, path_, ": cannot stat the mapped file: ", std::strerror(errno));
  RETROINFER_CHECK(static_cast<size_t>(st.st_size) >= size_, path_, ": the file shrank from ", size_, " to ",
                   st.st_size, " bytes while it was being read (truncated or rewritten in place); wait until it "
                   "is complete and load it again (replace model files by rename, not in place)");
}

void MappedFile::release_pages(const uint8_t* p, size_t n) const {
  if (data_ == nullptr || p + n <= data_ || p >= data_ + size_) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t lo = std::max(reinterpret_cast<uintptr_t>(p), reinterpret_cast<uintptr_t>(data_));
  const uintptr_t hi = std::min(reinterpret_cast<uintptr_t>(p + n), reinterpret_cast<uintptr_t>(data_ + size_));
  const uintptr_t first = (lo + page - 1) / page * page, last = hi / page * page;
  // Advice only: a failure leaves the pages resident, which costs memory and nothing else.
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

}  // namespace retroinfer::io
