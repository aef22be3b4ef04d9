// splitmix64: a small, portable generator (the same numbers on every platform and standard library),
// shared by the synthetic attention data and the accuracy tasks.
#pragma once

#include <cstdint>

namespace retroinfer::eval {

// Advances `state` and returns the next 64-bit output.
inline uint64_t splitmix64_next(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace retroinfer::eval
