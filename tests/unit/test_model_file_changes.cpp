// Model files that are truncated, or change while they are mapped (docs/reliability.md): a truncated file is
// an Error at open; a file that shrinks after open is an Error at the next tensor read (the check before
// each conversion), not a SIGBUS; a file replaced by rename keeps the old mapping; a file rewritten in place at
// the same size is read as it is now (no checksum). What the check cannot cover — a truncation between the
// check and the read — still faults, and a death test pins that down.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "io_test_files.h"
#include "retroinfer/error.h"
#include "retroinfer/model.h"
#include "retroinfer/model_file.h"

namespace retroinfer {
namespace {

using namespace retroinfer::testing;

// A tiny llama as config.json + model.safetensors (f32) in `d`; returns the safetensors bytes.
std::vector<uint8_t> write_tiny_safetensors(const TempDir& d, uint32_t value_seed = 0) {
  TinyLlama m;
  m.layers = 1;
  write_text(d.file("config.json"), m.config_json());
  SafetensorsWriter w;
  for (const auto& [name, sv] : m.weights()) {
    std::vector<float> v = sv.second;
    for (float& x : v) x += static_cast<float>(value_seed);
    w.tensor(name, "F32", sv.first, f32_bytes(v));
  }
  const std::vector<uint8_t> bytes = w.bytes();
  write_file(d.file("model.safetensors"), bytes);
  return bytes;
}

std::string error_of_open(const std::string& path) {
  try {
    (void)ModelFile::open(path);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelFileChanges, TruncatedSafetensorsFileIsAnError) {
  TempDir d;
  const std::vector<uint8_t> full = write_tiny_safetensors(d);
  ASSERT_GT(full.size(), 8192u);
  const std::string p = d.file("model.safetensors");
  // Cut points over the header and the data, and the last byte (every byte is covered in memory by
  // Safetensors.EveryTruncationAndRandomFlipsAreErrorsNotCrashes).
  for (size_t n : {size_t{0}, size_t{4}, size_t{8}, size_t{100}, full.size() / 2, full.size() - 1}) {
    write_file(p, std::vector<uint8_t>(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(n)));
    EXPECT_FALSE(error_of_open(d.path().string()).empty()) << "truncated at " << n << " of " << full.size();
  }
}

TEST(ModelFileChanges, ShrunkAfterOpenIsAnErrorAtTheNextRead) {
  TempDir d;
  write_tiny_safetensors(d);
  const auto f = ModelFile::open(d.path().string());
  ASSERT_EQ(::truncate(d.file("model.safetensors").c_str(), 4096), 0);
  try {
    (void)f->to_f32(f->get("model.embed_tokens.weight"));
    ADD_FAILURE() << "reading a shrunk file did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("shrank"), std::string::npos) << e.what();
  }
  EXPECT_THROW(Model::load(*f), Error);  // the loader goes through the same check
}

TEST(ModelFileChanges, ReplacedByRenameKeepsTheOldMapping) {
  TempDir d, next;
  write_tiny_safetensors(d, 0);
  const auto f = ModelFile::open(d.path().string());
  const std::vector<float> before = f->to_f32(f->get("model.norm.weight"));
  write_tiny_safetensors(next, 7);  // other values, same layout
  std::filesystem::rename(next.file("model.safetensors"), d.file("model.safetensors"));
  EXPECT_EQ(f->to_f32(f->get("model.norm.weight")), before);
  f->check_files_unchanged();  // the mapped inode is whole
}

TEST(ModelFileChanges, RewrittenInPlaceIsReadAsItIsNow) {
  TempDir d, next;
  write_tiny_safetensors(d, 0);
  const auto f = ModelFile::open(d.path().string());
  const std::vector<float> before = f->to_f32(f->get("model.norm.weight"));
  const std::vector<uint8_t> other = write_tiny_safetensors(next, 7);
  write_file(d.file("model.safetensors"), other);  // truncate + write: same size when done
  // Linux shows a MAP_PRIVATE mapping's unwritten pages as the file is now: the new values, no checksum.
  const std::vector<float> after = f->to_f32(f->get("model.norm.weight"));
  ASSERT_EQ(after.size(), before.size());
  EXPECT_FLOAT_EQ(after[0], before[0] + 7.0f);
}

// The window the check leaves: a read of the mapping past a new end raises SIGBUS (the process dies; under
// ASan, its SIGBUS report and a non-zero exit).
TEST(ModelFileChangesDeathTest, ReadPastANewEndFaults) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  TempDir d;
  write_tiny_safetensors(d);
  const std::string p = d.file("model.safetensors");
  EXPECT_DEATH(
      {
        const auto f = ModelFile::open(d.path().string());
        const TensorInfo& t = f->get("model.embed_tokens.weight");
        if (::truncate(p.c_str(), 0) != 0) std::_Exit(0);  // no fault without the truncation: the test fails
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < t.nbytes; i += 4096) sink = sink + t.data[i];
        std::_Exit(0);
      },
      "");
}

}  // namespace
}  // namespace retroinfer
