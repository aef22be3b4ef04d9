// Context snapshot files (include/retroinfer/snapshot.h): the writer (temporary file, fsync, rename) and the
// checked reader. Depends on core only, so that the fuzz target (fuzz/fuzz_snapshot.cpp) compiles it alone.
#include "retroinfer/snapshot.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <vector>
#include <sstream>

#include "retroinfer/attention_params.h"
#include "retroinfer/error.h"
#include "retroinfer/fault_injection.h"

namespace retroinfer {
namespace {

constexpr char kMagic[8] = {'R', 'I', 'S', 'N', 'A', 'P', 'S', 'H'};
constexpr uint32_t kTagMeta = 0x4154454d;  // "META"
constexpr uint32_t kTagTokens = 0x534b4f54;  // "TOKS"
constexpr uint32_t kTagKv = 0x5444564b;  // "KVDT"
constexpr size_t kHeaderBytes = 16, kSectionHeadBytes = 24;

std::string tag_name(uint32_t tag) {
  std::string s(4, ' ');
  for (int i = 0; i < 4; ++i) {
    const char c = static_cast<char>((tag >> (8 * i)) & 0xff);
    s[i] = (c >= 32 && c < 127) ? c : '?';
  }
  return s;
}

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// A 64-bit checksum of 32-byte stripes in four lanes (xxHash64's round and merge), several GB/s.
uint64_t stripe_checksum(const uint8_t* p, size_t n) {
  constexpr uint64_t P1 = 11400714785074694791ULL, P2 = 14029467366897019727ULL, P3 = 1609587929392839161ULL;
  uint64_t v[4] = {P1 + P2, P2, 0, 0 - P1};
  auto round = [&](uint64_t acc, uint64_t in) { return rotl(acc + in * P2, 31) * P1; };
  size_t i = 0;
  for (; i + 32 <= n; i += 32)
    for (int l = 0; l < 4; ++l) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * l, 8);
      v[l] = round(v[l], w);
    }
  uint64_t h = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
  for (int l = 0; l < 4; ++l) h = (h ^ round(0, v[l])) * P1 + P3;
  h += n;
  for (; i < n; ++i) h = rotl(h ^ (p[i] * P3), 11) * P1;
  h ^= h >> 33;
  h *= P2;
  h ^= h >> 29;
  return h;
}

// A section's checksum: stripe_checksum of the section below kChecksumChunk bytes; above, the stripe checksum
// of its chunks' stripe checksums (and the length), the chunks hashed in parallel: the K/V section of a long
// context is gigabytes (16 GiB at 128K tokens of Llama-3-8B), one thread would take seconds.
constexpr size_t kChecksumChunk = size_t{16} << 20;
uint64_t checksum(const uint8_t* p, size_t n) {
  if (n <= kChecksumChunk) return stripe_checksum(p, n);
  const int64_t chunks = static_cast<int64_t>((n + kChecksumChunk - 1) / kChecksumChunk);
  std::vector<uint64_t> sums(static_cast<size_t>(chunks) + 1);
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t at = static_cast<size_t>(c) * kChecksumChunk;
    sums[static_cast<size_t>(c)] = stripe_checksum(p + at, std::min(kChecksumChunk, n - at));
  }
  sums.back() = n;
  return stripe_checksum(reinterpret_cast<const uint8_t*>(sums.data()), sums.size() * sizeof(uint64_t));
}

// dst = src over n bytes, in parallel spans (a snapshot's K/V is gigabytes).
void parallel_copy(uint8_t* dst, const uint8_t* src, size_t n) {
  constexpr size_t kSpan = size_t{8} << 20;
  const int64_t spans = static_cast<int64_t>((n + kSpan - 1) / kSpan);
#pragma omp parallel for schedule(dynamic, 1) if (spans > 1)
  for (int64_t i = 0; i < spans; ++i) {
    const size_t at = static_cast<size_t>(i) * kSpan;
    std::memcpy(dst + at, src + at, std::min(kSpan, n - at));
  }
}

}  // namespace

uint64_t snapshot_checksum(const void* data, size_t n) { return checksum(static_cast<const uint8_t*>(data), n); }

std::string snapshot_hex(uint64_t h) {
  char b[17];
  std::snprintf(b, sizeof b, "%016llx", static_cast<unsigned long long>(h));
  return b;
}

namespace {

void put_u32(std::string& s, uint32_t v) { s.append(reinterpret_cast<const char*>(&v), 4); }
void put_u64(std::string& s, uint64_t v) { s.append(reinterpret_cast<const char*>(&v), 8); }

std::string attention_text(const AttentionConfig& a) {
  std::ostringstream o;
  o << "attention=" << attention_kind_name(a.kind) << "\n";
  for (const AttentionParam& p : attention_params()) o << "attention." << p.keyword << "=" << attention_param_text(a, p) << "\n";
  return o.str();
}

struct Meta {
  std::map<std::string, std::string> kv;
  const std::string& at(const std::string& k, std::string_view where) const {
    const auto it = kv.find(k);
    RETROINFER_CHECK(it != kv.end(), "snapshot ", where, ": the META section has no '", k,
                     "' (corrupt or written by another program)");
    return it->second;
  }
  int64_t num(const std::string& k, std::string_view where) const {
    const std::string& v = at(k, where);
    char* end = nullptr;
    errno = 0;
    const long long x = std::strtoll(v.c_str(), &end, 10);
    RETROINFER_CHECK(!v.empty() && errno == 0 && end == v.c_str() + v.size() && x >= 0, "snapshot ", where,
                     ": META's '", k, "' is '", v, "', not a count");
    return x;
  }
};

}  // namespace

void save_snapshot(const std::string& path, const Snapshot& snap, const SnapshotWriteProgress& progress) {
  RETROINFER_CHECK(snap.context.blocks.size() == 1 && snap.context.blocks[0] != nullptr &&
                       snap.context.blocks[0]->tokens == snap.context.size() && snap.context.size() > 0,
                   "snapshot: save_snapshot needs a context of one K/V block covering its tokens (make_snapshot)");
  const KvBlock& kv = *snap.context.blocks[0];
  std::ostringstream meta;
  meta << "model_identity=" << snapshot_hex(snap.model.hash) << "\nmodel=" << snap.model.description << "\nkv_dtype="
       << dtype_name(kv.dtype) << "\nlayers=" << kv.num_layers << "\nkv_heads=" << kv.num_heads_kv
       << "\nhead_dim=" << kv.head_dim << "\ntokens=" << kv.tokens << "\n"
       << (is_scaled_8bit(kv.dtype) ? "key_rows=calibrated\n" : "") << attention_text(snap.attention);
  const std::string meta_s = meta.str();
  struct Section {
    uint32_t tag;
    const uint8_t* data;
    size_t size;
  };
  const Section sections[] = {
      {kTagMeta, reinterpret_cast<const uint8_t*>(meta_s.data()), meta_s.size()},
      {kTagTokens, reinterpret_cast<const uint8_t*>(snap.context.tokens.data()), snap.context.tokens.size() * 4},
      {kTagKv, kv.bytes.data(), kv.bytes.size()},
  };
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  RETROINFER_CHECK(fd >= 0, "snapshot: cannot create ", tmp, ": ", std::strerror(errno),
                   "; check that the directory of --out exists and is writable");
  int64_t written = 0;
  auto fail = [&](const std::string& what) {
    ::close(fd);
    ::unlink(tmp.c_str());
    RETROINFER_FAIL("snapshot: writing ", path, " failed (", what, "); the old file, if any, is unchanged");
  };
  auto write_all = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd, b, std::min<size_t>(n, size_t{1} << 30));
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) fail(std::strerror(errno));
      b += w;
      n -= static_cast<size_t>(w);
      written += w;
    }
  };
  std::string head(kMagic, 8);
  put_u32(head, kSnapshotVersion);
  put_u32(head, static_cast<uint32_t>(std::size(sections)));
  write_all(head.data(), head.size());
  for (const Section& s : sections) {
    std::string sh;
    put_u32(sh, s.tag);
    put_u32(sh, 0);
    put_u64(sh, s.size);
    put_u64(sh, checksum(s.data, s.size));
    write_all(sh.data(), sh.size());
    write_all(s.data, s.size);
    if (fault::should_fail(fault::Point::kSnapshotWrite)) fail("injected fault snapshot_write");
    if (progress) progress(written);
  }
  if (::fsync(fd) != 0) fail(std::string("fsync: ") + std::strerror(errno));
  if (::close(fd) != 0) {
    ::unlink(tmp.c_str());
    RETROINFER_FAIL("snapshot: closing ", tmp, " failed: ", std::strerror(errno));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    RETROINFER_FAIL("snapshot: renaming ", tmp, " to ", path, " failed: ", std::strerror(e));
  }
  // The rename is durable once the directory is synced.
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

Snapshot parse_snapshot(std::span<const uint8_t> bytes, std::string_view where) {
  RETROINFER_CHECK(bytes.size() >= kHeaderBytes && std::memcmp(bytes.data(), kMagic, 8) == 0, "snapshot ", where,
                   ": not a retroinfer snapshot (no RISNAPSH header; ", bytes.size(), " bytes)");
  uint32_t version = 0, count = 0;
  std::memcpy(&version, bytes.data() + 8, 4);
  std::memcpy(&count, bytes.data() + 12, 4);
  RETROINFER_CHECK(version == kSnapshotVersion, "snapshot ", where, ": format version ", version,
                   ", this build reads version ", kSnapshotVersion, "; save the snapshot again with this build");
  std::map<uint32_t, std::span<const uint8_t>> sections;
  size_t at = kHeaderBytes;
  for (uint32_t i = 0; i < count; ++i) {
    RETROINFER_CHECK(bytes.size() - at >= kSectionHeadBytes, "snapshot ", where, ": truncated (", bytes.size(),
                     " bytes: the head of section ", i + 1, " of ", count, " is cut off)");
    uint32_t tag = 0;
    uint64_t size = 0, sum = 0;
    std::memcpy(&tag, bytes.data() + at, 4);
    std::memcpy(&size, bytes.data() + at + 8, 8);
    std::memcpy(&sum, bytes.data() + at + 16, 8);
    at += kSectionHeadBytes;
    RETROINFER_CHECK(size <= bytes.size() - at, "snapshot ", where, ": truncated (section ", tag_name(tag), " has ",
                     size, " bytes but only ", bytes.size() - at, " are left in the file)");
    const auto payload = bytes.subspan(at, size);
    RETROINFER_CHECK(checksum(payload.data(), payload.size()) == sum, "snapshot ", where, ": section ",
                     tag_name(tag), " is corrupt (its checksum does not match)");
    RETROINFER_CHECK(sections.emplace(tag, payload).second, "snapshot ", where, ": section ", tag_name(tag),
                     " appears twice");
    at += size;
  }
  RETROINFER_CHECK(at == bytes.size(), "snapshot ", where, ": ", bytes.size() - at,
                   " bytes after the last section (corrupt)");
  for (uint32_t tag : {kTagMeta, kTagTokens, kTagKv})
    RETROINFER_CHECK(sections.count(tag) == 1, "snapshot ", where, ": no ", tag_name(tag), " section");

  Meta meta;
  {
    const auto m = sections[kTagMeta];
    std::istringstream in(std::string(reinterpret_cast<const char*>(m.data()), m.size()));
    for (std::string line; std::getline(in, line);) {
      const size_t eq = line.find('=');
      RETROINFER_CHECK(eq != std::string::npos, "snapshot ", where, ": META line '", line, "' has no '='");
      meta.kv[line.substr(0, eq)] = line.substr(eq + 1);
    }
  }
  Snapshot s;
  s.version = version;
  {
    const std::string& h = meta.at("model_identity", where);
    char* end = nullptr;
    s.model.hash = std::strtoull(h.c_str(), &end, 16);
    RETROINFER_CHECK(h.size() == 16 && end == h.c_str() + 16, "snapshot ", where, ": META's model_identity '", h,
                     "' is not 16 hex digits");
  }
  s.model.description = meta.at("model", where);
  s.attention.kind = parse_attention_kind(meta.at("attention", where));
  for (const AttentionParam& p : attention_params())
    set_attention_param(s.attention, p, meta.at("attention." + std::string(p.keyword), where));
  auto kv = std::make_shared<KvBlock>();
  const std::string& dt = meta.at("kv_dtype", where);
  RETROINFER_CHECK(dt == "f32" || dt == "bf16" || dt == "int8" || dt == "fp8", "snapshot ", where,
                   ": META's kv_dtype '", dt, "' is not f32, bf16, int8 or fp8");
  kv->dtype = parse_dtype(dt);
  // 8-bit key rows are stored relative to the model's key calibration (KeyCalibration); earlier builds stored
  // the raw keys, which this build would misread.
  RETROINFER_CHECK(!is_scaled_8bit(kv->dtype) || (meta.kv.count("key_rows") && meta.kv.at("key_rows") == "calibrated"),
                   "snapshot ", where, ": its ", dt, " key rows were written without the key calibration this build ",
                   "stores 8-bit keys with (an earlier build); save the snapshot again with this build");
  const int64_t layers = meta.num("layers", where), heads = meta.num("kv_heads", where), d = meta.num("head_dim", where);
  const int64_t tokens = meta.num("tokens", where);
  RETROINFER_CHECK(layers >= 1 && layers <= 4096 && heads >= 1 && heads <= 4096 && d >= 1 && d <= 4096 &&
                       tokens >= 1 && tokens <= (int64_t{1} << 32),
                   "snapshot ", where, ": META's shape (", layers, " layers, ", heads, " KV heads, head_dim ", d, ", ",
                   tokens, " tokens) is out of range");
  kv->num_layers = static_cast<int>(layers);
  kv->num_heads_kv = static_cast<int>(heads);
  kv->head_dim = static_cast<int>(d);
  kv->tokens = tokens;
  const auto toks = sections[kTagTokens];
  RETROINFER_CHECK(static_cast<int64_t>(toks.size()) == tokens * 4, "snapshot ", where, ": TOKS holds ", toks.size(),
                   " bytes, not the ", tokens * 4, " of ", tokens, " tokens");
  s.context.tokens.resize(tokens);
  std::memcpy(s.context.tokens.data(), toks.data(), toks.size());
  for (int32_t t : s.context.tokens)
    RETROINFER_CHECK(t >= 0, "snapshot ", where, ": TOKS holds a negative token id ", t);
  const auto kvb = sections[kTagKv];
  // Per token first: the whole product could overflow for a crafted META.
  const uint64_t per_token = 2ULL * layers * heads * static_cast<uint64_t>(kv->row_bytes());
  RETROINFER_CHECK(kvb.size() % per_token == 0 && kvb.size() / per_token == static_cast<uint64_t>(tokens), "snapshot ",
                   where, ": KVDT holds ", kvb.size(), " bytes, not ", tokens, " tokens x ", per_token,
                   " bytes of its META shape");
  kv->bytes.resize(kvb.size());
  parallel_copy(kv->bytes.data(), kvb.data(), kvb.size());
  s.context.blocks.push_back(std::move(kv));
  return s;
}

// The file mapped read-only (pages read ahead by the kernel: MAP_POPULATE), parsed straight from the mapping:
// no copy of the whole file in memory, the K/V copied once into its block.
Snapshot load_snapshot(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  RETROINFER_CHECK(fd >= 0, "snapshot: cannot open ", path, ": ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    RETROINFER_FAIL("snapshot: cannot read the size of ", path, ": ", std::strerror(e));
  }
  const size_t n = static_cast<size_t>(st.st_size);
  if (n == 0) {
    ::close(fd);
    return parse_snapshot({}, path);
  }
  void* map = ::mmap(nullptr, n, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  const int e = errno;
  ::close(fd);
  RETROINFER_CHECK(map != MAP_FAILED, "snapshot: cannot map ", path, " (", n, " bytes): ", std::strerror(e));
  struct Unmap {
    void* p;
    size_t n;
    ~Unmap() { ::munmap(p, n); }
  } unmap{map, n};
  return parse_snapshot(std::span<const uint8_t>(static_cast<const uint8_t*>(map), n), path);
}

void check_snapshot(const Snapshot& snap, const ModelIdentity& model, DType kv_dtype, const AttentionConfig& attention,
                    std::string_view where) {
  RETROINFER_CHECK(snap.model.hash == model.hash, "snapshot ", where, " was made with another model (", snap.model.description,
                   ", identity ", snapshot_hex(snap.model.hash), ") than this one (", model.description, ", identity ",
                   snapshot_hex(model.hash), "); save it again with this model");
  const DType got = snap.context.blocks.at(0)->dtype;
  RETROINFER_CHECK(got == kv_dtype, "snapshot ", where, " holds ", dtype_name(got), " K/V but this session's KV cache is ",
                   dtype_name(kv_dtype), "; use --kv-dtype ", dtype_name(got), " or save it again");
  const std::string a = attention_text(snap.attention), b = attention_text(attention);
  if (a != b) {
    std::istringstream ia(a), ib(b);
    std::string diff;
    for (std::string la, lb; std::getline(ia, la) && std::getline(ib, lb);)
      if (la != lb) diff += (diff.empty() ? "" : ", ") + la + " (this session: " + lb.substr(lb.find('=') + 1) + ")";
    RETROINFER_FAIL("snapshot ", where, " was made with another attention configuration: ", diff,
                    "; pass the same attention flags or save it again");
  }
}

}  // namespace retroinfer
