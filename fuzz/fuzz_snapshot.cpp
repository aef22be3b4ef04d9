// libFuzzer target: the context snapshot loader (parse_snapshot: header, section heads, checksums, META,
// tokens, K/V shape). Any outcome other than success or retroinfer::Error is a bug; a snapshot that parses
// passes check_snapshot against its own identity and configuration, and writes and reads back the same.
#include <cstdlib>
#include <cstring>
#include <span>

#include "fuzz_common.h"
#include "retroinfer/error.h"
#include "retroinfer/snapshot.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace retroinfer;
  Snapshot s;
  try {
    s = parse_snapshot(std::span<const uint8_t>(data, size), "fuzz input");
  } catch (const Error&) {
    return 0;
  }
  const KvBlock& kv = *s.context.blocks.at(0);
  check_snapshot(s, s.model, kv.dtype, s.attention, "fuzz input");  // must not throw
  const std::string path = fuzz::scratch_file(nullptr, 0, ".snapshot");
  save_snapshot(path, s);
  const Snapshot back = load_snapshot(path);
  if (back.context.tokens != s.context.tokens || back.context.blocks.at(0)->bytes != kv.bytes ||
      back.model.hash != s.model.hash)
    std::abort();
  return 0;
}
