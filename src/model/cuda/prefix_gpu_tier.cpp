// GpuPrefixTier: the prefix cache's device copies, their LRU and leases (prefix_gpu_tier.h).
#include "model/cuda/prefix_gpu_tier.h"

#include "retroinfer/error.h"

namespace retroinfer::cuda {

GpuBlockCopy::~GpuBlockCopy() {
  if (tier_) tier_->forget(this);
}

std::shared_ptr<GpuPrefixTier> GpuPrefixTier::make(int64_t capacity_bytes) {
  RETROINFER_CHECK(capacity_bytes >= 1, "prefix cache: the GPU tier's capacity must be > 0 bytes, got ", capacity_bytes,
                   " (--prefix-cache-gpu-mb)");
  return std::shared_ptr<GpuPrefixTier>(new GpuPrefixTier(capacity_bytes));
}

GpuPrefixTier::GpuPrefixTier(int64_t capacity_bytes) : capacity_(capacity_bytes) { stats_.capacity_bytes = capacity_bytes; }

std::shared_ptr<GpuBlockCopy> GpuPrefixTier::make_copy(int64_t bytes) {
  if (bytes < 1 || bytes > capacity_) return nullptr;
  std::lock_guard<std::mutex> lk(mu_);
  // Drop the least recently used copies no load is reading until the new one fits.
  for (auto it = lru_.end(); stats_.held_bytes + bytes > capacity_ && it != lru_.begin();) {
    --it;
    GpuBlockCopy* c = *it;
    if (c->leases_ > 0) continue;
    stats_.held_bytes -= static_cast<int64_t>(c->memory_.bytes());
    --stats_.copies;
    ++stats_.dropped;
    c->memory_ = DeviceBuffer();
    c->lru_ = {};
    it = lru_.erase(it);
  }
  if (stats_.held_bytes + bytes > capacity_) return nullptr;
  auto copy = std::shared_ptr<GpuBlockCopy>(new GpuBlockCopy);
  try {
    copy->memory_ = DeviceBuffer(static_cast<size_t>(bytes));
  } catch (const Error&) {
    return nullptr;  // the device is full: the block stays in host memory only
  }
  copy->tier_ = shared_from_this();
  copy->leases_ = 1;
  lru_.push_front(copy.get());
  copy->lru_ = lru_.begin();
  stats_.held_bytes += bytes;
  ++stats_.copies;
  ++stats_.made;
  return copy;
}

uint8_t* GpuPrefixTier::lease(const KvBlockCopy* copy) {
  const auto* c = dynamic_cast<const GpuBlockCopy*>(copy);
  std::lock_guard<std::mutex> lk(mu_);
  if (c == nullptr || c->tier_.get() != this || c->memory_.data() == nullptr) {
    ++stats_.relayed;
    return nullptr;
  }
  auto* m = const_cast<GpuBlockCopy*>(c);  // leases and LRU position are the tier's bookkeeping, not content
  ++m->leases_;
  lru_.splice(lru_.begin(), lru_, m->lru_);
  ++stats_.loaded;
  return static_cast<uint8_t*>(m->memory_.data());
}

void GpuPrefixTier::release(const KvBlockCopy* copy) {
  std::lock_guard<std::mutex> lk(mu_);
  auto* c = const_cast<GpuBlockCopy*>(static_cast<const GpuBlockCopy*>(copy));
  RETROINFER_CHECK(c->leases_ > 0, "GpuPrefixTier::release of a copy that is not leased");
  --c->leases_;
}

uint8_t* GpuPrefixTier::data_of(const GpuBlockCopy& copy) const {
  std::lock_guard<std::mutex> lk(mu_);
  RETROINFER_CHECK(copy.leases_ > 0 && copy.tier_.get() == this, "GpuPrefixTier::data_of a copy not leased here");
  return static_cast<uint8_t*>(copy.memory_.data());
}

void GpuPrefixTier::forget(GpuBlockCopy* c) {
  std::lock_guard<std::mutex> lk(mu_);
  if (c->memory_.data() == nullptr) return;
  stats_.held_bytes -= static_cast<int64_t>(c->memory_.bytes());
  --stats_.copies;
  lru_.erase(c->lru_);
  c->memory_ = DeviceBuffer();
}

int64_t GpuPrefixTier::held_back_bytes() const {
  std::lock_guard<std::mutex> lk(mu_);
  return capacity_ - stats_.held_bytes;
}

PrefixGpuTierStats GpuPrefixTier::stats() const {
  std::lock_guard<std::mutex> lk(mu_);
  return stats_;
}

GpuCopyLeases::~GpuCopyLeases() {
  for (const KvBlockCopy* c : held_) tier_->release(c);
}

uint8_t* GpuCopyLeases::take(const KvBlockCopy* copy) {
  uint8_t* p = tier_->lease(copy);
  if (p != nullptr) held_.push_back(copy);
  return p;
}

}  // namespace retroinfer::cuda
