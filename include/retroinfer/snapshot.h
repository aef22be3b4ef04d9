// Context snapshots (docs/prefix-cache.md): a prefilled context saved to a file and loaded in another
// process, so that questions about one long document skip its prefill.
//
// File (little-endian): a 16-byte header — magic "RISNAPSH", u32 format version, u32 section count — then the
// sections, each a 24-byte head (u32 tag, u32 zero, u64 payload bytes, u64 checksum of the payload) and its
// payload:
//   META  key=value lines: the model identity (hash and description), the KV dtype and shape, the token count,
//         the attention configuration (every parameter's keyword);
//   TOKS  the context's token ids, i32 each;
//   KVDT  the K/V of every layer: one KvBlock's bytes (sequence_session.h).
// The writer writes a temporary file beside the target, syncs it and renames it over the target (atomic: a
// crash leaves the old file or none, never a partial one under the target's name). The reader refuses, with an
// Error that says which, a file that is not a snapshot, another format version, a truncated or corrupt
// section (checksum), and (check_snapshot) another model, KV dtype or attention configuration.
//
// The wave index and the other methods' state are not stored: a session that loads the snapshot builds them
// over the whole context after its prompt's new tokens (SequenceSession::load_prefix), as a cold prefill does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>

#include "retroinfer/attention_config.h"
#include "retroinfer/model.h"
#include "retroinfer/sequence_session.h"

namespace retroinfer {

class Tokenizer;

constexpr uint32_t kSnapshotVersion = 2;  // 2: sections above 16 MiB checksummed by chunks

// What a snapshot's K/V depends on besides the tokens: the config, a sample of the weights (the embedding and
// the final norm: models of one shape with other weights differ) and the tokenizer's vocabulary.
struct ModelIdentity {
  uint64_t hash = 0;
  std::string description;  // "llama, 30 layers, 3 KV heads x 64, vocab 49152" (for the error messages)
};
// tokenizer: optional (nullptr: the identity covers the model alone, e.g. token-id workloads).
ModelIdentity model_identity(const Model& model, const Tokenizer* tokenizer);

struct Snapshot {
  uint32_t version = kSnapshotVersion;
  ModelIdentity model;
  AttentionConfig attention;
  KvPrefix context;  // tokens + one block of their K/V
};

// A snapshot of positions [0, tokens.size()) of a prefilled session (export_kv).
Snapshot make_snapshot(const SequenceSession& session, std::span<const int32_t> tokens, const ModelIdentity& model);

// Called after each section is written to the temporary file, with the bytes written so far (progress; the
// crash-safety test kills the writer here).
using SnapshotWriteProgress = std::function<void(int64_t bytes_written)>;
// Writes `snap` to `path` atomically (see above). Throws Error naming the path when the directory is not
// writable or a write fails (the temporary file is removed, the old file stays).
void save_snapshot(const std::string& path, const Snapshot& snap, const SnapshotWriteProgress& progress = {});

// Reads and checks a snapshot file (`where` names it in errors). Throws Error for a file that is not a
// snapshot, of another version, truncated or corrupt, saying which.
Snapshot parse_snapshot(std::span<const uint8_t> bytes, std::string_view where);
Snapshot load_snapshot(const std::string& path);

// A section's checksum (64 bits; above 16 MiB, of its 16 MiB chunks' checksums, computed in parallel), which
// model_identity hashes with too; a hash as 16 hex digits.
uint64_t snapshot_checksum(const void* data, size_t n);
std::string snapshot_hex(uint64_t h);

// Throws Error unless the snapshot was made with this model (identity), this KV dtype and this attention
// configuration, naming what differs.
void check_snapshot(const Snapshot& snap, const ModelIdentity& model, DType kv_dtype, const AttentionConfig& attention,
                    std::string_view where);

}  // namespace retroinfer
