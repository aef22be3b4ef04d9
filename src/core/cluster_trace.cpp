// Cluster traces (include/retroinfer/cluster_trace.h): the binary format of docs/formats.md#cluster-traces.
#include "retroinfer/cluster_trace.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>

#include "retroinfer/error.h"

namespace retroinfer {
namespace {

static_assert(std::endian::native == std::endian::little, "cluster traces are written little-endian as stored");

constexpr char kMagic[8] = {'R', 'I', 'C', 'L', 'T', 'R', 'C', '\0'};
constexpr uint32_t kFormatVersion = 1;
constexpr size_t kHeaderFixedBytes = 8 + 4 * 5;  // magic, version, layers, heads, head_dim, source length
constexpr size_t kRecordFixedBytes = 32;         // see the record layout in docs/formats.md
// Bounds that reject garbage early: no model has more layers / heads than this.
constexpr int kMaxLayers = 4096, kMaxHeads = 4096, kMaxHeadDim = 4096;

template <typename T>
void put(std::string& b, T v) {
  char raw[sizeof(T)];
  std::memcpy(raw, &v, sizeof(T));
  b.append(raw, sizeof(T));
}

template <typename T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

void validate_header(const ClusterTraceHeader& h, const std::string& where) {
  RETROINFER_CHECK(h.num_layers >= 1 && h.num_layers <= kMaxLayers, where, ": num_layers ", h.num_layers,
                   " outside [1, ", kMaxLayers, "]");
  RETROINFER_CHECK(h.num_heads_kv >= 1 && h.num_heads_kv <= kMaxHeads, where, ": num_heads_kv ", h.num_heads_kv,
                   " outside [1, ", kMaxHeads, "]");
  RETROINFER_CHECK(h.head_dim >= 1 && h.head_dim <= kMaxHeadDim, where, ": head_dim ", h.head_dim, " outside [1, ",
                   kMaxHeadDim, "]");
  RETROINFER_CHECK(h.source.size() <= ClusterTraceHeader::kMaxSourceBytes, where, ": source text of ",
                   h.source.size(), " bytes exceeds ", ClusterTraceHeader::kMaxSourceBytes);
}

}  // namespace

void validate_cluster_trace_record(const ClusterTraceHeader& h, const ClusterTraceRecord& r, const std::string& where) {
  RETROINFER_CHECK(r.step >= 0, where, ": negative step ", r.step);
  RETROINFER_CHECK(r.layer >= 0 && r.layer < h.num_layers, where, ": layer ", r.layer, " outside [0, ", h.num_layers,
                   ")");
  RETROINFER_CHECK(r.head >= 0 && r.head < h.num_heads_kv, where, ": head ", r.head, " outside [0, ", h.num_heads_kv,
                   ")");
  RETROINFER_CHECK(r.seq >= 0, where, ": negative sequence ", r.seq);
  RETROINFER_CHECK(r.num_clusters >= 0, where, ": negative cluster count ", r.num_clusters);
  RETROINFER_CHECK(r.context_tokens >= 1, where, ": context_tokens ", r.context_tokens, " < 1");
  RETROINFER_CHECK(r.ids.size() == r.sizes.size(), where, ": ", r.ids.size(), " ids but ", r.sizes.size(), " sizes");
  RETROINFER_CHECK(static_cast<int64_t>(r.ids.size()) <= r.num_clusters, where, ": ", r.ids.size(),
                   " selected clusters of ", r.num_clusters);
  for (size_t j = 0; j < r.ids.size(); ++j) {
    RETROINFER_CHECK(r.ids[j] >= 0 && r.ids[j] < r.num_clusters, where, ": cluster id ", r.ids[j], " outside [0, ",
                     r.num_clusters, ")");
    RETROINFER_CHECK(j == 0 || r.ids[j] > r.ids[j - 1], where, ": cluster ids not strictly ascending (", r.ids[j - 1],
                     " then ", r.ids[j], ")");
    RETROINFER_CHECK(r.sizes[j] >= 0 && r.sizes[j] <= r.context_tokens, where, ": cluster ", r.ids[j], " has size ",
                     r.sizes[j], " outside [0, context_tokens ", r.context_tokens, "]");
  }
}

ClusterTraceWriter::ClusterTraceWriter(const std::string& path, const ClusterTraceHeader& header)
    : path_(path), header_(header) {
  validate_header(header_, "cluster trace '" + path + "'");
  out_.open(path, std::ios::binary | std::ios::trunc);
  RETROINFER_CHECK(out_.good(), "cluster trace: cannot create '", path, "'; check the directory exists and is writable");
  std::string b(kMagic, sizeof(kMagic));
  put<uint32_t>(b, kFormatVersion);
  put<uint32_t>(b, static_cast<uint32_t>(header_.num_layers));
  put<uint32_t>(b, static_cast<uint32_t>(header_.num_heads_kv));
  put<uint32_t>(b, static_cast<uint32_t>(header_.head_dim));
  put<uint32_t>(b, static_cast<uint32_t>(header_.source.size()));
  b += header_.source;
  out_.write(b.data(), static_cast<std::streamsize>(b.size()));
  RETROINFER_CHECK(out_.good(), "cluster trace: write to '", path, "' failed");
}

ClusterTraceWriter::~ClusterTraceWriter() {
  std::lock_guard<std::mutex> lock(mu_);
  out_.flush();  // no throw: errors are reported by flush() / write()
}

void ClusterTraceWriter::write(const ClusterTraceRecord& r) {
  validate_cluster_trace_record(header_, r, "cluster trace '" + path_ + "': record of step " + std::to_string(r.step));
  std::string b;
  b.reserve(kRecordFixedBytes + 8 * r.ids.size());
  put<uint32_t>(b, static_cast<uint32_t>(r.step));
  put<uint16_t>(b, static_cast<uint16_t>(r.layer));
  put<uint16_t>(b, static_cast<uint16_t>(r.head));
  put<uint32_t>(b, static_cast<uint32_t>(r.seq));
  put<uint32_t>(b, static_cast<uint32_t>(r.num_clusters));
  put<int64_t>(b, r.context_tokens);
  put<uint32_t>(b, static_cast<uint32_t>(r.ids.size()));
  put<uint32_t>(b, 0);  // reserved
  for (int32_t id : r.ids) put<int32_t>(b, id);
  for (int32_t s : r.sizes) put<int32_t>(b, s);
  std::lock_guard<std::mutex> lock(mu_);
  out_.write(b.data(), static_cast<std::streamsize>(b.size()));
  RETROINFER_CHECK(out_.good(), "cluster trace: write to '", path_, "' failed (disk full?)");
  ++records_;
}

void ClusterTraceWriter::flush() {
  std::lock_guard<std::mutex> lock(mu_);
  out_.flush();
  RETROINFER_CHECK(out_.good(), "cluster trace: flushing '", path_, "' failed (disk full?)");
}

int64_t ClusterTraceWriter::records_written() const {
  std::lock_guard<std::mutex> lock(mu_);
  return records_;
}

ClusterTrace read_cluster_trace(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  RETROINFER_CHECK(f.good(), "cluster trace: cannot open '", path, "'");
  const std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  const std::string where = "cluster trace '" + path + "'";
  RETROINFER_CHECK(data.size() >= kHeaderFixedBytes, where, ": truncated header (", data.size(), " bytes, need ",
                   kHeaderFixedBytes, ")");
  RETROINFER_CHECK(std::memcmp(data.data(), kMagic, sizeof(kMagic)) == 0, where,
                   ": not a cluster trace (bad magic; record one with `retroinfer generate --record-trace`)");
  const char* p = data.data() + sizeof(kMagic);
  const uint32_t version = get<uint32_t>(p);
  RETROINFER_CHECK(version == kFormatVersion, where, ": format version ", version, ", this build reads version ",
                   kFormatVersion);
  ClusterTrace t;
  const uint32_t layers = get<uint32_t>(p + 4), heads = get<uint32_t>(p + 8), dim = get<uint32_t>(p + 12);
  const uint32_t src_len = get<uint32_t>(p + 16);
  RETROINFER_CHECK(layers <= uint32_t(kMaxLayers) && heads <= uint32_t(kMaxHeads) && dim <= uint32_t(kMaxHeadDim), where,
                   ": header fields out of range (layers ", layers, ", heads ", heads, ", head_dim ", dim, ")");
  t.header.num_layers = static_cast<int>(layers);
  t.header.num_heads_kv = static_cast<int>(heads);
  t.header.head_dim = static_cast<int>(dim);
  RETROINFER_CHECK(src_len <= ClusterTraceHeader::kMaxSourceBytes, where, ": source length ", src_len, " exceeds ",
                   ClusterTraceHeader::kMaxSourceBytes);
  RETROINFER_CHECK(data.size() >= kHeaderFixedBytes + src_len, where, ": truncated header (source text of ", src_len,
                   " bytes, file has ", data.size() - kHeaderFixedBytes, " after the fixed header)");
  t.header.source.assign(data.data() + kHeaderFixedBytes, src_len);
  validate_header(t.header, where);
  size_t at = kHeaderFixedBytes + src_len;
  while (at < data.size()) {
    const std::string rwhere = where + ": record " + std::to_string(t.records.size()) + " at byte " + std::to_string(at);
    RETROINFER_CHECK(data.size() - at >= kRecordFixedBytes, rwhere, ": truncated (", data.size() - at,
                     " bytes left, a record needs ", kRecordFixedBytes, " + 8 per cluster)");
    const char* r = data.data() + at;
    ClusterTraceRecord rec;
    const uint32_t step = get<uint32_t>(r), seq = get<uint32_t>(r + 8), nc = get<uint32_t>(r + 12);
    const uint32_t n = get<uint32_t>(r + 24), reserved = get<uint32_t>(r + 28);
    RETROINFER_CHECK(step <= INT32_MAX && seq <= INT32_MAX && nc <= INT32_MAX, rwhere, ": field out of range");
    RETROINFER_CHECK(reserved == 0, rwhere, ": reserved field ", reserved, " is not 0 (corrupt file?)");
    rec.step = static_cast<int32_t>(step);
    rec.layer = get<uint16_t>(r + 4);
    rec.head = get<uint16_t>(r + 6);
    rec.seq = static_cast<int32_t>(seq);
    rec.num_clusters = static_cast<int32_t>(nc);
    rec.context_tokens = get<int64_t>(r + 16);
    RETROINFER_CHECK(n <= nc, rwhere, ": ", n, " selected clusters of ", nc);
    const size_t need = kRecordFixedBytes + size_t{8} * n;
    RETROINFER_CHECK(data.size() - at >= need, rwhere, ": truncated (", data.size() - at, " bytes left, the record needs ",
                     need, ")");
    rec.ids.resize(n);
    rec.sizes.resize(n);
    if (n > 0) {
      std::memcpy(rec.ids.data(), r + kRecordFixedBytes, 4 * size_t{n});
      std::memcpy(rec.sizes.data(), r + kRecordFixedBytes + 4 * size_t{n}, 4 * size_t{n});
    }
    validate_cluster_trace_record(t.header, rec, rwhere);
    t.records.push_back(std::move(rec));
    at += need;
  }
  return t;
}

}  // namespace retroinfer

namespace retroinfer {

ClusterTraceSchedule::ClusterTraceSchedule(const ClusterTrace& trace)
    : layers_(trace.header.num_layers), heads_(trace.header.num_heads_kv) {
  steps_.resize(size_t(layers_) * size_t(heads_));
  for (const ClusterTraceRecord& r : trace.records)
    if (r.seq == 0) steps_[size_t(r.layer) * heads_ + r.head].push_back(r);
  for (int l = 0; l < layers_; ++l)
    for (int h = 0; h < heads_; ++h) {
      auto& v = steps_[size_t(l) * heads_ + h];
      RETROINFER_CHECK(!v.empty(), "cluster trace: layer ", l, " head ", h, " of sequence 0 has no records; a query "
                       "schedule needs every (layer, KV head) of the trace");
      std::stable_sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
    }
}

void ClusterTraceSchedule::retrieval_ids(int layer, int head, int64_t step, int num_clusters, int n_r,
                                         int32_t* ids) const {
  RETROINFER_CHECK(layer >= 0 && head >= 0 && step >= 0 && num_clusters >= 0 && n_r >= 0 && (ids != nullptr || n_r == 0),
                   "ClusterTraceSchedule::retrieval_ids: bad arguments (layer ", layer, ", head ", head, ", step ", step,
                   ", clusters ", num_clusters, ", n_r ", n_r, ")");
  const size_t series = size_t(layer % layers_) * heads_ + size_t(head % heads_);
  const auto& v = steps_[series];
  const int64_t shifted = step + int64_t{kHeadStepOffset} * (head / heads_) + int64_t{kLayerStepOffset} * (layer / layers_);
  const int64_t record = shifted % int64_t(v.size());
  const ClusterTraceRecord& r = v[size_t(record)];
  const MemoKey key{int64_t(series), record, num_clusters, n_r};
  {
    std::lock_guard<std::mutex> lock(memo_mu_);
    if (auto it = memo_.find(key); it != memo_.end()) {
      std::copy(it->second.begin(), it->second.end(), ids);
      return;
    }
  }
  std::vector<int32_t> mapped;
  const int64_t ct = std::max(r.num_clusters, 1), cb = num_clusters;
  for (int32_t c : r.ids) {
    const int64_t lo = c * cb / ct, hi = std::max((c + 1) * cb / ct, lo + 1);
    for (int64_t x = lo; x < hi && x < cb; ++x)
      if (mapped.empty() || mapped.back() < x) mapped.push_back(static_cast<int32_t>(x));
  }
  const size_t n = mapped.size();
  int j = 0;
  if (n <= size_t(n_r)) {
    for (; j < int(n); ++j) ids[j] = mapped[size_t(j)];
  } else {
    for (; j < n_r; ++j) ids[j] = mapped[size_t(j) * n / size_t(n_r)];  // evenly spaced, still ascending
  }
  for (; j < n_r; ++j) ids[j] = -1;
  std::lock_guard<std::mutex> lock(memo_mu_);
  if (memo_.size() >= kMemoEntries) memo_.clear();
  memo_.emplace(key, std::vector<int32_t>(ids, ids + n_r));
}

std::string ClusterTraceSchedule::rule() const {
  return "layer l -> trace layer l % " + std::to_string(layers_) + ", flat head h -> trace head h % " +
         std::to_string(heads_) + " at step (t + " + std::to_string(kHeadStepOffset) + " * (h / " +
         std::to_string(heads_) + ") + " + std::to_string(kLayerStepOffset) + " * (l / " + std::to_string(layers_) +
         ")) mod recorded steps; trace cluster c of C_t -> clusters [floor(c C / C_t), floor((c + 1) C / C_t)), n_r "
         "evenly spaced if more; estimation zone as the benchmark's own queries select it";
}

}  // namespace retroinfer
