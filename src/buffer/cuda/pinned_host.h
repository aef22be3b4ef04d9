// Pinned, device-mapped host memory for the wave buffer's stores (GiB per layer at long contexts).
//
// cudaHostAlloc zero-fills and pins every 4 KiB page in the calling thread: ~1.3 GB/s measured on the
// H200 machine, ~4 s per 5 GiB layer, which made a 128K batch-10 split session spend its time limit
// allocating. Above kRegisterPinBytes, PinnedHost instead maps anonymous memory, asks for transparent huge
// pages, faults it in from several threads at once (the zeroing runs in parallel) and registers it with
// cudaHostRegister (mapped, portable), which then pins pages already present. Below the threshold, or
// when registration fails, it falls back to cudaHostAlloc. The contents are unspecified (the wave buffer
// writes every byte it reads).
//
// Threading contract: one object per owner; construction and destruction on any one thread.
#pragma once

#include <cstddef>

namespace retroinfer::cuda {

inline constexpr size_t kRegisterPinBytes = size_t{64} << 20;
// The size from which PinnedHost takes the mmap + register path (default kRegisterPinBytes); tests lower it
// to run the wave buffer's host tier through that path.
size_t register_pin_threshold();
void set_register_pin_threshold(size_t bytes);

class PinnedHost {
 public:
  PinnedHost() = default;
  // Throws Error (with the byte count and what to do) when neither path can provide the memory.
  // threads: workers that fault the pages in (0: hardware concurrency, at most 16).
  explicit PinnedHost(size_t bytes, bool allow_register = true, int threads = 0);
  ~PinnedHost();
  PinnedHost(PinnedHost&& o) noexcept;
  PinnedHost& operator=(PinnedHost&& o) noexcept;
  PinnedHost(const PinnedHost&) = delete;
  PinnedHost& operator=(const PinnedHost&) = delete;

  void* host() const { return host_; }
  void* device() const { return dev_; }  // the device's pointer to the same memory (UVA)
  size_t bytes() const { return bytes_; }
  bool registered() const { return registered_; }  // true: the mmap + cudaHostRegister path

 private:
  void release() noexcept;
  void* host_ = nullptr;
  void* dev_ = nullptr;
  size_t bytes_ = 0;
  size_t mapped_ = 0;  // mmap length (registered path)
  bool registered_ = false;
};

}  // namespace retroinfer::cuda
