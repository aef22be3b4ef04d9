// Open-addressing hash tables for the tokenizer's two big lookups (string -> id, id pair -> merge): one flat
// array each, linear probing, load factor <= 1/2. About twice as fast to build and probe as
// std::unordered_map for 100K-300K entries (no node allocations, one cache line per probe).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace retroinfer::tokenizer {

inline uint64_t mix64(uint64_t x) {  // splitmix64 finaliser: full avalanche for sequential keys
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline uint64_t hash_bytes(std::string_view s) {  // FNV-1a, then mixed
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ULL;
  return mix64(h);
}

inline size_t table_capacity(size_t n) {  // power of two >= 2n
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  return cap;
}

// uint64 key -> Value. Keys must not be kEmpty.
template <typename Value>
class FlatU64Map {
 public:
  static constexpr uint64_t kEmpty = ~0ULL;
  void reserve(size_t n) {
    keys_.assign(table_capacity(n), kEmpty);
    values_.resize(keys_.size());
  }
  // Inserts if absent; returns false (and keeps the old value) if present.
  bool insert(uint64_t key, const Value& v) {
    if (2 * (size_ + 1) > keys_.size()) grow();
    size_t i = mix64(key) & (keys_.size() - 1);
    while (keys_[i] != kEmpty) {
      if (keys_[i] == key) return false;
      i = (i + 1) & (keys_.size() - 1);
    }
    keys_[i] = key;
    values_[i] = v;
    ++size_;
    return true;
  }
  const Value* find(uint64_t key) const {
    if (keys_.empty()) return nullptr;
    size_t i = mix64(key) & (keys_.size() - 1);
    while (keys_[i] != kEmpty) {
      if (keys_[i] == key) return &values_[i];
      i = (i + 1) & (keys_.size() - 1);
    }
    return nullptr;
  }
  size_t size() const { return size_; }

 private:
  void grow() {
    std::vector<uint64_t> old_keys = std::move(keys_);
    std::vector<Value> old_values = std::move(values_);
    reserve(old_keys.empty() ? 8 : old_keys.size());
    size_ = 0;
    for (size_t i = 0; i < old_keys.size(); ++i) {
      if (old_keys[i] != kEmpty) insert(old_keys[i], old_values[i]);
    }
  }
  std::vector<uint64_t> keys_;
  std::vector<Value> values_;
  size_t size_ = 0;
};

// string -> int32 id, where the strings live elsewhere (texts[id]) and must outlive the index and stay put.
class StringIdIndex {
 public:
  explicit StringIdIndex(const std::vector<std::string>* texts = nullptr) : texts_(texts) {}
  void reset(const std::vector<std::string>* texts, size_t expected) {
    texts_ = texts;
    slots_.assign(table_capacity(expected), -1);
    size_ = 0;
  }
  // Maps (*texts)[id] to id; if that string is already present, overwrite decides who wins.
  void insert(int32_t id, bool overwrite) {
    if (2 * (size_ + 1) > slots_.size()) rehash(table_capacity(size_ + 1));
    const std::string& s = (*texts_)[id];
    size_t i = hash_bytes(s) & (slots_.size() - 1);
    while (slots_[i] >= 0) {
      if ((*texts_)[slots_[i]] == s) {
        if (overwrite) slots_[i] = id;
        return;
      }
      i = (i + 1) & (slots_.size() - 1);
    }
    slots_[i] = id;
    ++size_;
  }
  int32_t find(std::string_view s) const {
    if (slots_.empty()) return -1;
    size_t i = hash_bytes(s) & (slots_.size() - 1);
    while (slots_[i] >= 0) {
      if ((*texts_)[slots_[i]] == s) return slots_[i];
      i = (i + 1) & (slots_.size() - 1);
    }
    return -1;
  }
  size_t size() const { return size_; }

 private:
  void rehash(size_t cap) {
    std::vector<int32_t> old = std::move(slots_);
    slots_.assign(cap, -1);
    size_ = 0;
    for (int32_t id : old) {
      if (id >= 0) insert(id, false);
    }
  }
  const std::vector<std::string>* texts_;
  std::vector<int32_t> slots_;  // [capacity] token id or -1
  size_t size_ = 0;
};

}  // namespace retroinfer::tokenizer
