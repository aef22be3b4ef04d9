// The prefix cache's GPU tier (docs/prefix-cache.md): device copies of the K/V blocks a CUDA session exports
// (CudaSession::export_kv), so that a later prefix hit copies them inside GPU memory (CudaSession::load_prefix)
// instead of relaying them from host memory over PCIe (at 128K tokens of the Llama-3-8B shape, 16 GiB: ~0.5 s
// over the link, ~10 ms inside the GPU). The host block stays the cache's content: a block whose copy was
// dropped, or never made, loads from its host bytes.
//
// Capacity: at most capacity_bytes of copies; making one drops the least recently used copies that no load is
// reading (leased) until it fits. A copy is owned by its block (KvBlock::device_copy) and frees its memory
// with it. Sessions plan their memory with the unused part of the capacity held back (held_back_bytes), so
// the copies never take the room a session was planned with.
//
// Threading contract: every member may be called from any thread (one mutex); a copy's memory stays valid
// while leased.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>

#include "retroinfer/cuda_device.h"
#include "retroinfer/sequence_session.h"

namespace retroinfer::cuda {

class GpuPrefixTier;

// One block's device copy: the block's bytes in its layout ([layer][K or V][kv head][token][head_dim]).
class GpuBlockCopy final : public KvBlockCopy {
 public:
  ~GpuBlockCopy() override;
  const GpuPrefixTier* tier() const { return tier_.get(); }

 private:
  friend class GpuPrefixTier;
  std::shared_ptr<GpuPrefixTier> tier_;
  DeviceBuffer memory_;  // empty once dropped for room
  int leases_ = 0;
  std::list<GpuBlockCopy*>::iterator lru_;
};

class GpuPrefixTier : public std::enable_shared_from_this<GpuPrefixTier> {
 public:
  // Throws Error for capacity_bytes < 1.
  static std::shared_ptr<GpuPrefixTier> make(int64_t capacity_bytes);

  // A copy of `bytes` device bytes, leased (the caller fills it, then release()s it), or null when the
  // capacity cannot make room (every held copy leased) or the device has no memory for it.
  std::shared_ptr<GpuBlockCopy> make_copy(int64_t bytes);
  // The device bytes of `copy` leased until release(), or null when `copy` is null, belongs to another tier or
  // was dropped. Counts a loaded or relayed block.
  uint8_t* lease(const KvBlockCopy* copy);
  void release(const KvBlockCopy* copy);
  // The device bytes of a copy this caller holds leased (make_copy's, to fill it).
  uint8_t* data_of(const GpuBlockCopy& copy) const;

  int64_t held_back_bytes() const;  // capacity not held by copies: what sessions leave free for the tier
  PrefixGpuTierStats stats() const;

 private:
  explicit GpuPrefixTier(int64_t capacity_bytes);
  friend class GpuBlockCopy;
  void forget(GpuBlockCopy* c);  // the copy's destructor
  const int64_t capacity_;
  mutable std::mutex mu_;
  std::list<GpuBlockCopy*> lru_;  // copies holding memory, most recently used first
  PrefixGpuTierStats stats_;
};

// Releases a set of leased copies on scope exit (load_prefix / export_kv keep them while the copies run).
class GpuCopyLeases {
 public:
  explicit GpuCopyLeases(GpuPrefixTier* tier) : tier_(tier) {}
  ~GpuCopyLeases();
  GpuCopyLeases(const GpuCopyLeases&) = delete;
  GpuCopyLeases& operator=(const GpuCopyLeases&) = delete;
  // lease() on the tier, remembered for release; null as lease() gives it.
  uint8_t* take(const KvBlockCopy* copy);
  // A copy leased by make_copy, remembered for release.
  void adopt(const KvBlockCopy* copy) { held_.push_back(copy); }

 private:
  GpuPrefixTier* tier_;
  std::vector<const KvBlockCopy*> held_;
};

}  // namespace retroinfer::cuda
