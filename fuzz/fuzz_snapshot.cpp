// libFuzzer target: the context snapshot loader (parse_snapshot: header, section heads, checksums, META,
// tokens, K/V shape). Each input is parsed as it is, then with every section's checksum recomputed (a mutation
// almost never forges a 64-bit checksum, so the copy is what reaches the META, token and K/V checks). Any
// outcome other than success or retroinfer::Error is a bug; a snapshot that parses passes check_snapshot
// against its own identity and configuration, and writes and reads back the same.
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "fuzz_common.h"
#include "retroinfer/error.h"
#include "retroinfer/snapshot.h"

namespace {

void parse_and_round_trip(std::span<const uint8_t> bytes) {
  using namespace retroinfer;
  Snapshot s;
  try {
    s = parse_snapshot(bytes, "fuzz input");
  } catch (const Error&) {
    return;
  }
  const KvBlock& kv = *s.context.blocks.at(0);
  check_snapshot(s, s.model, kv.dtype, s.attention, "fuzz input");  // must not throw
  const std::string path = fuzz::scratch_file(nullptr, 0, ".snapshot");
  save_snapshot(path, s);
  const Snapshot back = load_snapshot(path);
  if (back.context.tokens != s.context.tokens || back.context.blocks.at(0)->bytes != kv.bytes ||
      back.model.hash != s.model.hash)
    std::abort();
}

// The input with each section head's checksum set to its payload's (as far as the heads and payloads are whole).
std::vector<uint8_t> with_checksums(const uint8_t* data, size_t size) {
  std::vector<uint8_t> b(data, data + size);
  size_t at = 16;
  while (at + 24 <= b.size()) {
    uint64_t n = 0;
    std::memcpy(&n, b.data() + at + 8, 8);
    if (n > b.size() - at - 24) break;
    const uint64_t sum = retroinfer::snapshot_checksum(b.data() + at + 24, n);
    std::memcpy(b.data() + at + 16, &sum, 8);
    at += 24 + n;
  }
  return b;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  parse_and_round_trip(std::span<const uint8_t>(data, size));
  parse_and_round_trip(with_checksums(data, size));
  return 0;
}
