// Cluster traces: which retrieval-zone clusters retro selects at every decode step, layer, sequence and KV
// head, with each selected cluster's size, so that a block cache can be replayed offline
// (include/retroinfer/cache_replay.h) and benchmarks can follow a real decode's selections.
// File format: docs/formats.md#cluster-traces.
#pragma once

#include <cstdint>
#include <fstream>
#include <mutex>
#include <unordered_map>
#include <string>
#include <vector>

namespace retroinfer {

struct ClusterTraceHeader {
  int num_layers = 0;    // layers of the model that recorded the trace
  int num_heads_kv = 0;  // KV heads per layer
  int head_dim = 0;
  std::string source;    // free text: model, attention parameters, prompt (at most kMaxSourceBytes)
  static constexpr uint32_t kMaxSourceBytes = 1 << 20;
};

// One (decode step, layer, sequence, KV head).
struct ClusterTraceRecord {
  int32_t step = 0;            // decode step of this (sequence, layer) since its index was built, from 0
  int32_t layer = 0;
  int32_t seq = 0;             // sequence within the session (0 for a one-sequence session)
  int32_t head = 0;            // KV head
  int32_t num_clusters = 0;    // clusters of this head's index at this step (grows with index updates)
  int64_t context_tokens = 0;  // tokens in the layer's cache at this step, the current one included
  std::vector<int32_t> ids;    // [n] selected retrieval clusters, strictly ascending, in [0, num_clusters)
  std::vector<int32_t> sizes;  // [n] tokens of each selected cluster (a cluster's size never changes)
};

struct ClusterTrace {
  ClusterTraceHeader header;
  std::vector<ClusterTraceRecord> records;  // in file order
};

// Appends records to a trace file (the header is written at construction).
// Threading contract: write() and flush() may be called from any thread (a mutex orders them); records
// land in the file in the order of the write() calls.
class ClusterTraceWriter {
 public:
  // Throws Error if the file cannot be created or the header is invalid.
  ClusterTraceWriter(const std::string& path, const ClusterTraceHeader& header);
  ~ClusterTraceWriter();  // flushes; never throws
  ClusterTraceWriter(const ClusterTraceWriter&) = delete;
  ClusterTraceWriter& operator=(const ClusterTraceWriter&) = delete;

  // Throws Error on a record that does not fit the header or the format's rules, or on a write error.
  void write(const ClusterTraceRecord& r);
  void flush();
  const ClusterTraceHeader& header() const { return header_; }
  const std::string& path() const { return path_; }
  int64_t records_written() const;

 private:
  std::string path_;
  ClusterTraceHeader header_;
  mutable std::mutex mu_;
  std::ofstream out_;     // guarded by mu_
  int64_t records_ = 0;   // guarded by mu_
};

// Reads and validates a whole trace. Throws Error naming the file, the byte offset and the record on a bad
// magic or version, a truncated header or record, or a record that breaks the format's rules.
ClusterTrace read_cluster_trace(const std::string& path);

// A trace as the query source of a benchmark of another model shape: each step's retrieval clusters of a
// target (layer, flat head) with its own cluster count and retrieval budget, following the recorded
// selections (docs/wave-buffer.md#cluster-traces gives the rule; rule() states it for JSON reports).
// Threading contract: its mapping is fixed at construction; retrieval_ids may be called from any thread (its
// memo of mapped records is guarded by a mutex).
class ClusterTraceSchedule {
 public:
  // Uses the records of sequence 0. Throws Error if the trace has none, or a (layer, head) of the trace's
  // shape has no records.
  explicit ClusterTraceSchedule(const ClusterTrace& trace);

  // Writes ids [n_r] for decode step `step` of target layer `layer`, flat head `head` (sequence * KV heads +
  // KV head), whose index holds num_clusters clusters: strictly ascending ids in [0, num_clusters), then -1
  // padding. Mapping: trace layer layer % L, trace head head % H (L, H: the trace's shape); trace step
  // (step + kHeadStepOffset * (head / H) + kLayerStepOffset * (layer / L)) modulo that head's recorded
  // steps; trace cluster c of C_t clusters becomes the target clusters [floor(c * C / C_t),
  // floor((c + 1) * C / C_t)) (at least floor(c * C / C_t)); more than n_r of them: n_r evenly spaced.
  // A record mapped once for a (C, n_r) is remembered: the target heads of one trace head replay the same
  // records a few steps apart, so a benchmark step maps ~2 new records per layer instead of one per head
  // (mapping every head took ~130 us per layer of 64 flat heads, about the device's time for that layer).
  void retrieval_ids(int layer, int head, int64_t step, int num_clusters, int n_r, int32_t* ids) const;
  std::string rule() const;  // the mapping above in one line, with the trace's shape
  int num_layers() const { return layers_; }
  int num_heads_kv() const { return heads_; }

  static constexpr int kHeadStepOffset = 16;  // steps between two target heads on one trace head
  static constexpr int kLayerStepOffset = 8;  // steps between two target layers on one trace layer

 private:
  int layers_ = 0, heads_ = 0;
  std::vector<std::vector<ClusterTraceRecord>> steps_;  // [layer * heads + head]: records in step order
  // Mapped records: key (trace (layer, head), record, C, n_r) -> ids [n_r]; cleared when it holds
  // kMemoEntries (a few MB).
  static constexpr size_t kMemoEntries = size_t{1} << 15;
  struct MemoKey {
    int64_t series = 0, record = 0;
    int num_clusters = 0, n_r = 0;
    bool operator==(const MemoKey&) const = default;
  };
  struct MemoHash {
    size_t operator()(const MemoKey& k) const {
      uint64_t h = uint64_t(k.series) * 0x9E3779B97F4A7C15ull ^ uint64_t(k.record) * 0xC2B2AE3D27D4EB4Full;
      h ^= (uint64_t(uint32_t(k.num_clusters)) << 32 | uint32_t(k.n_r)) * 0x165667B19E3779F9ull;
      return size_t(h ^ (h >> 29));
    }
  };
  mutable std::mutex memo_mu_;
  mutable std::unordered_map<MemoKey, std::vector<int32_t>, MemoHash> memo_;  // guarded by memo_mu_
};

// Checks one record against a header (the rules of docs/formats.md#cluster-traces); throws Error naming
// `where` on a violation.
void validate_cluster_trace_record(const ClusterTraceHeader& h, const ClusterTraceRecord& r, const std::string& where);

}  // namespace retroinfer
