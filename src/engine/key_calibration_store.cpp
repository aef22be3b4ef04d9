// The on-disk store of Model::key_calibration (include/retroinfer/key_calibration_store.h). A file: 8 bytes
// "RIKEYCAL", u32 format version, u32 layers, u32 KV heads, u32 head_dim, then per layer the means and the
// factors (f32, [KV heads x head_dim] each), then a u64 checksum (snapshot_checksum) of everything before it.
#include "retroinfer/key_calibration_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "retroinfer/error.h"
#include "retroinfer/model.h"
#include "retroinfer/snapshot.h"

namespace retroinfer {

namespace {

constexpr char kMagic[8] = {'R', 'I', 'K', 'E', 'Y', 'C', 'A', 'L'};
constexpr uint32_t kVersion = 1;

void put(std::string& s, const void* p, size_t n) { s.append(static_cast<const char*>(p), n); }

// The store's key of this model: see load_or_compute_key_calibration.
uint64_t store_key(const Model& model, const Tokenizer* tokenizer) {
  std::string k = model.path();
  struct stat st {};
  if (::stat(model.path().c_str(), &st) == 0) {
    const int64_t size = st.st_size, mtime_ns = int64_t(st.st_mtim.tv_sec) * 1000000000LL + st.st_mtim.tv_nsec;
    put(k, &size, sizeof size);
    put(k, &mtime_ns, sizeof mtime_ns);
  }
  const uint64_t id = model_identity(model, tokenizer).hash;
  const int64_t tokens = Model::kKeyCalibrationTokens;
  put(k, &id, sizeof id);
  put(k, &tokens, sizeof tokens);
  put(k, &kVersion, sizeof kVersion);
  return snapshot_checksum(k.data(), k.size());
}

std::string encode(const Model& model, const std::vector<KeyCalibration>& cal) {
  const ModelConfig& c = model.config();
  std::string s(kMagic, sizeof kMagic);
  const uint32_t head[4] = {kVersion, uint32_t(c.num_layers), uint32_t(c.num_heads_kv), uint32_t(c.head_dim)};
  put(s, head, sizeof head);
  for (const KeyCalibration& k : cal) {
    put(s, k.mean.data(), k.mean.size() * sizeof(float));
    put(s, k.factor.data(), k.factor.size() * sizeof(float));
  }
  const uint64_t sum = snapshot_checksum(s.data(), s.size());
  put(s, &sum, sizeof sum);
  return s;
}

// The calibration in `bytes` when it is a whole store file of this model's shape; empty otherwise.
std::vector<KeyCalibration> decode(const Model& model, const std::string& bytes) {
  const ModelConfig& c = model.config();
  const size_t n = size_t(c.num_heads_kv) * c.head_dim, head = sizeof kMagic + 16;
  const size_t body = size_t(c.num_layers) * 2 * n * sizeof(float);
  if (bytes.size() != head + body + 8 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) return {};
  uint32_t h[4];
  std::memcpy(h, bytes.data() + sizeof kMagic, sizeof h);
  if (h[0] != kVersion || h[1] != uint32_t(c.num_layers) || h[2] != uint32_t(c.num_heads_kv) ||
      h[3] != uint32_t(c.head_dim))
    return {};
  uint64_t sum = 0;
  std::memcpy(&sum, bytes.data() + head + body, sizeof sum);
  if (sum != snapshot_checksum(bytes.data(), head + body)) return {};
  std::vector<KeyCalibration> cal(static_cast<size_t>(c.num_layers));
  const char* p = bytes.data() + head;
  for (KeyCalibration& k : cal) {
    k.mean.resize(n);
    k.factor.resize(n);
    std::memcpy(k.mean.data(), p, n * sizeof(float));
    std::memcpy(k.factor.data(), p + n * sizeof(float), n * sizeof(float));
    p += 2 * n * sizeof(float);
    for (size_t i = 0; i < n; ++i)
      if (!(k.factor[i] > 0.0f) || !std::isfinite(k.factor[i]) || !std::isfinite(k.mean[i])) return {};
  }
  return cal;
}

}  // namespace

std::string default_key_calibration_dir() {
  namespace fs = std::filesystem;
  if (const char* d = std::getenv("RETROINFER_KEY_CALIBRATION_DIR"); d != nullptr && *d != '\0') return d;
  if (const char* c = std::getenv("XDG_CACHE_HOME"); c != nullptr && *c != '\0')
    return (fs::path(c) / "retroinfer" / "key-calibration").string();
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    return (fs::path(home) / ".cache" / "retroinfer" / "key-calibration").string();
  return "";
}

KeyCalibrationLoad load_or_compute_key_calibration(const Model& model, const Tokenizer* tokenizer,
                                                    const std::string& dir) {
  namespace fs = std::filesystem;
  KeyCalibrationLoad r;
  if (dir.empty()) {
    model.key_calibration();
    return r;
  }
  char name[32];
  std::snprintf(name, sizeof name, "%016llx.keycal", static_cast<unsigned long long>(store_key(model, tokenizer)));
  r.file = (fs::path(dir) / name).string();
  {
    std::ifstream f(r.file, std::ios::binary);
    if (f.good()) {
      const std::string bytes{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
      std::vector<KeyCalibration> cal = decode(model, bytes);
      if (!cal.empty()) {
        r.from_disk = model.adopt_key_calibration(std::move(cal));
        return r;
      }
      r.warning = r.file + " is not a key calibration of this model (rewritten)";
    }
  }
  const std::string bytes = encode(model, model.key_calibration());
  std::error_code ec;
  fs::create_directories(dir, ec);
  // Written to a temporary name and renamed, so that a process reading the store never sees half a file.
  const std::string tmp = r.file + ".tmp." + std::to_string(::getpid());
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out.good() || std::rename(tmp.c_str(), r.file.c_str()) != 0) {
    std::remove(tmp.c_str());
    r.warning = "cannot write " + r.file + " (the next process calibrates again)";
  }
  return r;
}

}  // namespace retroinfer
