// Context snapshots on the tiny model fixture: a snapshot saved from one session and loaded by another gives the
// greedy tokens of a cold prefill for every method; the loader refuses another model, KV dtype, attention
// configuration, format version, a truncated or corrupt file, saying which; a failed or killed write leaves the
// old file or none, never one that loads. The format tests need no model; the others skip without the fixture.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <vector>

#include "retroinfer/error.h"
#include "retroinfer/fault_injection.h"
#include "retroinfer/generate.h"
#include "retroinfer/model.h"
#include "retroinfer/snapshot.h"

#include "error_of.h"
#include "tiny_model_util.h"

namespace retroinfer {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed at the end.
struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("retroinfer_snapshot_" + std::to_string(::getpid()) + "_" +
                                        testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// A snapshot of `tokens` tokens with recognisable K/V, without a model.
Snapshot synthetic(int64_t tokens, uint8_t fill, int layers = 2, DType dtype = DType::kF32) {
  auto kv = std::make_shared<KvBlock>();
  kv->num_layers = layers;
  kv->num_heads_kv = 2;
  kv->head_dim = 8;
  kv->dtype = dtype;
  kv->tokens = tokens;
  kv->bytes.assign(2 * layers * 2 * kv->run_bytes(), fill);
  Snapshot s;
  s.model = {0xabcdef0123456789ULL, "llama, synthetic"};
  s.attention.kind = AttentionKind::kRetro;
  for (int64_t t = 0; t < tokens; ++t) s.context.tokens.push_back(static_cast<int32_t>(t % 500));
  s.context.blocks.push_back(std::move(kv));
  return s;
}

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}
void write_bytes(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), b.size());
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

TEST(Snapshot, RoundTripKeepsEverything) {
  TempDir dir;
  const Snapshot s = synthetic(50, 7);
  save_snapshot(dir.file("a.snapshot"), s);
  const Snapshot r = load_snapshot(dir.file("a.snapshot"));
  EXPECT_EQ(r.version, kSnapshotVersion);
  EXPECT_EQ(r.model.hash, s.model.hash);
  EXPECT_EQ(r.model.description, s.model.description);
  EXPECT_EQ(r.context.tokens, s.context.tokens);
  EXPECT_EQ(r.context.blocks.at(0)->bytes, s.context.blocks[0]->bytes);
  EXPECT_EQ(r.context.blocks[0]->num_layers, 2);
  EXPECT_EQ(r.attention.kind, AttentionKind::kRetro);
  check_snapshot(r, s.model, DType::kF32, s.attention, "a");  // no throw
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1) << "no temporary file left";
}

// A K/V section above the 16 MiB checksum chunk (checksummed by chunks, in parallel) round-trips, and a byte
// changed in its second chunk is caught.
TEST(Snapshot, LargeSectionChecksummedByChunks) {
  TempDir dir;
  Snapshot s = synthetic(40000, 0, 8);  // 8 layers x 2 x 2 heads x 40000 x 8 x 4 B = 40.96 MB
  auto kv = std::make_shared<KvBlock>(*s.context.blocks[0]);
  for (size_t i = 0; i < kv->bytes.size(); ++i) kv->bytes[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  s.context.blocks[0] = kv;
  ASSERT_GT(kv->bytes.size(), size_t{32} << 20);
  const std::string path = dir.file("big.snapshot");
  save_snapshot(path, s);
  const Snapshot r = load_snapshot(path);
  EXPECT_TRUE(r.context.blocks.at(0)->bytes == kv->bytes);
  std::vector<uint8_t> b = read_bytes(path);
  b[b.size() - (size_t{20} << 20)] ^= 0x10;  // inside the K/V section's second 16 MiB chunk
  write_bytes(dir.file("bad.snapshot"), b);
  EXPECT_TRUE(contains(test::error_of([&] { load_snapshot(dir.file("bad.snapshot")); }), "section KVDT is corrupt"));
}

// 8-bit key rows are stored relative to the model's key calibration; a snapshot whose META does not say so (an
// earlier build stored the raw keys) is refused, saying why.
TEST(Snapshot, RefusesEightBitKeysWithoutTheKeyCalibration) {
  TempDir dir;
  const std::string path = dir.file("int8.snapshot");
  save_snapshot(path, synthetic(30, 5, 2, DType::kI8));
  EXPECT_EQ(load_snapshot(path).context.blocks.at(0)->dtype, DType::kI8);
  std::vector<uint8_t> b = read_bytes(path);
  // META is the first section: its 24-byte head follows the 16-byte file head; drop the key_rows line and write
  // the section again with its checksum.
  const std::string line = "key_rows=calibrated\n";
  uint64_t meta_bytes = 0;
  std::memcpy(&meta_bytes, b.data() + 16 + 8, 8);
  std::string meta(b.begin() + 40, b.begin() + 40 + static_cast<std::ptrdiff_t>(meta_bytes));
  const size_t at = meta.find(line);
  ASSERT_NE(at, std::string::npos) << meta;
  meta.erase(at, line.size());
  std::vector<uint8_t> old(b.begin(), b.begin() + 40);
  const uint64_t n = meta.size(), sum = snapshot_checksum(meta.data(), meta.size());
  std::memcpy(old.data() + 16 + 8, &n, 8);
  std::memcpy(old.data() + 16 + 16, &sum, 8);
  old.insert(old.end(), meta.begin(), meta.end());
  old.insert(old.end(), b.begin() + 40 + static_cast<std::ptrdiff_t>(meta_bytes), b.end());
  write_bytes(path, old);
  const std::string why = test::error_of([&] { load_snapshot(path); });
  EXPECT_TRUE(contains(why, "without the key calibration")) << why;
}

TEST(Snapshot, RefusesWhatIsNotItsOwnSayingWhich) {
  TempDir dir;
  const Snapshot s = synthetic(40, 3);
  const std::string path = dir.file("a.snapshot");
  save_snapshot(path, s);
  const std::vector<uint8_t> good = read_bytes(path);
  auto load_error = [&](const std::vector<uint8_t>& b) {
    write_bytes(dir.file("b.snapshot"), b);
    return test::error_of([&] { load_snapshot(dir.file("b.snapshot")); });
  };
  EXPECT_TRUE(contains(load_error({'h', 'e', 'l', 'l', 'o'}), "not a retroinfer snapshot"));
  std::vector<uint8_t> b = good;
  b[8] = static_cast<uint8_t>(kSnapshotVersion + 1);  // the format version
  EXPECT_TRUE(contains(load_error(b), "format version " + std::to_string(kSnapshotVersion + 1) +
                                          ", this build reads version " + std::to_string(kSnapshotVersion)));
  for (size_t cut : {size_t{20}, size_t{100}, good.size() / 2, good.size() - 1})
    EXPECT_TRUE(contains(load_error(std::vector<uint8_t>(good.begin(), good.begin() + cut)), "truncated")) << cut;
  b = good;
  b[b.size() - 10] ^= 0x40;  // inside the K/V
  EXPECT_TRUE(contains(load_error(b), "section KVDT is corrupt"));
  b = good;
  b[40] ^= 0x01;  // inside META
  EXPECT_TRUE(contains(load_error(b), "section META is corrupt"));
  b = good;
  b.push_back(0);
  EXPECT_TRUE(contains(load_error(b), "bytes after the last section"));
  EXPECT_TRUE(contains(test::error_of([&] { load_snapshot(dir.file("missing")); }), "cannot open"));

  const Snapshot r = load_snapshot(path);
  ModelIdentity other = s.model;
  other.hash ^= 1;
  other.description = "qwen2, other";
  const std::string e = test::error_of([&] { check_snapshot(r, other, DType::kF32, s.attention, "a"); });
  EXPECT_TRUE(contains(e, "made with another model (llama, synthetic")) << e;
  EXPECT_TRUE(contains(e, "than this one (qwen2, other")) << e;
  EXPECT_TRUE(contains(test::error_of([&] { check_snapshot(r, s.model, DType::kBF16, s.attention, "a"); }),
                       "holds f32 K/V but this session's KV cache is bf16"));
  AttentionConfig full = s.attention;
  full.kind = AttentionKind::kFull;
  full.window_tokens = 32;
  const std::string a = test::error_of([&] { check_snapshot(r, s.model, DType::kF32, full, "a"); });
  EXPECT_TRUE(contains(a, "another attention configuration: attention=retro (this session: full)")) << a;
  EXPECT_TRUE(contains(a, "attention.window_tokens=64 (this session: 32)")) << a;
}

TEST(Snapshot, AFailedWriteLeavesTheOldFile) {
  TempDir dir;
  const std::string path = dir.file("a.snapshot");
  save_snapshot(path, synthetic(30, 1));
  {
    fault::ScopedFault f(fault::Point::kSnapshotWrite, /*skip=*/1);
    EXPECT_TRUE(contains(test::error_of([&] { save_snapshot(path, synthetic(60, 2)); }), "injected fault snapshot_write"));
    EXPECT_EQ(f.fired(), 1);
  }
  EXPECT_EQ(load_snapshot(path).context.size(), 30) << "the old snapshot stays";
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1) << "the temporary file is removed";
  EXPECT_TRUE(contains(test::error_of([&] { save_snapshot(dir.file("no/such/dir/a.snapshot"), synthetic(3, 1)); }),
                       "cannot create"));
}

// The writer killed (SIGKILL) after its first section: the target holds the old snapshot, or nothing when there
// was none, and what the killed writer left does not load.
TEST(Snapshot, AKilledWriterLeavesTheOldFileOrNone) {
  TempDir dir;
  for (bool had_old : {true, false}) {
    SCOPED_TRACE(had_old ? "an old snapshot" : "no old snapshot");
    const std::string path = dir.file(had_old ? "old.snapshot" : "new.snapshot");
    if (had_old) save_snapshot(path, synthetic(30, 1));
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      const Snapshot big = synthetic(20000, 9, 8);  // 20 MB of K/V
      save_snapshot(path, big, [](int64_t) { ::raise(SIGKILL); });
      ::_exit(0);  // not reached
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
    if (had_old) {
      EXPECT_EQ(load_snapshot(path).context.size(), 30);
    } else {
      EXPECT_FALSE(fs::exists(path));
    }
    int leftovers = 0;
    for (const auto& e : fs::directory_iterator(dir.path)) {
      if (e.path().string() == path || e.path().filename() == "old.snapshot") continue;
      ++leftovers;
      EXPECT_TRUE(contains(test::error_of([&] { load_snapshot(e.path().string()); }), "truncated")) << e.path();
      fs::remove(e.path());
    }
    EXPECT_EQ(leftovers, 1) << "the killed writer's temporary file";
  }
}

TEST(Snapshot, GenerationAfterLoadingGivesTheColdTokensForEveryMethod) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  TempDir dir;
  const EngineModel engine(*m);
  const ModelIdentity id = model_identity(*m, nullptr);
  EXPECT_EQ(model_identity(*m, nullptr).hash, id.hash) << "deterministic";
  const std::vector<int32_t> doc = test::token_stream(170, 4);
  std::vector<int32_t> prompt = doc;
  for (int32_t t : test::token_stream(15, 6)) prompt.push_back(t);
  GenerateOptions g;
  g.max_new_tokens = 10;
  g.ignore_eos = true;
  for (AttentionKind kind : {AttentionKind::kFull, AttentionKind::kRetro, AttentionKind::kQuest,
                             AttentionKind::kStreaming, AttentionKind::kOracle}) {
    SCOPED_TRACE(testing::Message() << "method " << attention_kind_name(kind));
    const SessionOptions so = test::tiny_session_options(kind);
    {
      Session s(*m, so);
      s.prefill(doc);
      save_snapshot(dir.file("doc.snapshot"), make_snapshot(s, doc, id));
    }
    const Snapshot snap = load_snapshot(dir.file("doc.snapshot"));
    check_snapshot(snap, id, so.kv_dtype, so.attention, "doc.snapshot");
    const GenerateSummary cold = generate(engine, so, prompt, g);
    const GenerateSummary warm = generate(engine, so, prompt, g, {}, nullptr, &snap.context);
    EXPECT_EQ(warm.tokens, cold.tokens);
    EXPECT_EQ(warm.reused_tokens, 170);
    std::vector<int32_t> other = prompt;
    other[0] ^= 1;
    EXPECT_TRUE(contains(test::error_of([&] { generate(engine, so, other, g, {}, nullptr, &snap.context); }),
                         "does not continue the snapshot's context: they differ at token 0"));
    // The prompt is the context itself: all but its last token are loaded.
    const GenerateSummary same_cold = generate(engine, so, doc, g);
    const GenerateSummary same = generate(engine, so, doc, g, {}, nullptr, &snap.context);
    EXPECT_EQ(same.tokens, same_cold.tokens);
    EXPECT_EQ(same.reused_tokens, 169);
  }
}

}  // namespace
}  // namespace retroinfer
