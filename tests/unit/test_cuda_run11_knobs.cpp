// Host-side pieces of run 11's decode path, on the CPU (CUDA builds, no device needed): the
// RETROINFER_DECODE names (decode_path), the knobs from the variables and the path-name tokens
// (run11_knobs: values, precedence, errors) and the partial-state slots the layers allocate
// (zone_state_slots: within the planner's 1024-CTA bound).
#if defined(RETROINFER_WITH_CUDA)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "backend/cuda/layer_common.h"
#include "buffer/session_planner.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr const char* kVars[] = {"RETROINFER_DECODE", "RETROINFER_RUN11_SPLITS", "RETROINFER_RUN11_EST_CHUNK",
                                 "RETROINFER_RUN11_ORDER"};

// Saves the four variables, unsets them, restores them at the end of the test.
class Run11Env : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) {
      const char* old = std::getenv(v);
      saved_.emplace_back(old != nullptr, old != nullptr ? old : "");
      unsetenv(v);
    }
  }
  void TearDown() override {
    for (size_t i = 0; i < saved_.size(); ++i) {
      if (saved_[i].first) setenv(kVars[i], saved_[i].second.c_str(), 1);
      else unsetenv(kVars[i]);
    }
  }
  static void set(const char* name, const char* value) { setenv(name, value, 1); }

 private:
  std::vector<std::pair<bool, std::string>> saved_;
};

TEST_F(Run11Env, PathNames) {
  set("RETROINFER_DECODE", "run11");
  DecodePath p = decode_path();
  EXPECT_TRUE(p.run11 && p.form_scores && p.fused_estimate && p.fused_merge && p.pdl && p.balance);
  EXPECT_FALSE(p.form_in_score || p.smem_offsets || p.list_ahead);
  set("RETROINFER_DECODE", "run11-x2-c64-oest");
  EXPECT_TRUE(decode_path().run11);
  set("RETROINFER_DECODE", "run9");
  EXPECT_FALSE(decode_path().run11);
  unsetenv("RETROINFER_DECODE");
  EXPECT_FALSE(decode_path().run11);  // run 9 stays the default
  set("RETROINFER_DECODE", "run11x2");  // not a run 11 name
  EXPECT_FALSE(decode_path().run11);
}

TEST_F(Run11Env, KnobDefaultsAndVariables) {
  Run11Knobs k = run11_knobs(12);
  EXPECT_EQ(k.splits, kRun11DefaultSplitsX * 12);
  EXPECT_EQ(k.est_chunk, 128);
  EXPECT_EQ(k.order, kRun11OrderExactFirst);
  set("RETROINFER_RUN11_SPLITS", "x3");
  set("RETROINFER_RUN11_EST_CHUNK", "64");
  set("RETROINFER_RUN11_ORDER", "head");
  k = run11_knobs(12);
  EXPECT_EQ(k.splits, 36);
  EXPECT_EQ(k.est_chunk, 64);
  EXPECT_EQ(k.order, kRun11OrderHead);
  set("RETROINFER_RUN11_SPLITS", "20");
  set("RETROINFER_RUN11_ORDER", "est");
  k = run11_knobs(12);
  EXPECT_EQ(k.splits, 20);
  EXPECT_EQ(k.order, kRun11OrderEstFirst);
}

TEST_F(Run11Env, PathTokensOverrideVariables) {
  set("RETROINFER_RUN11_SPLITS", "x3");
  set("RETROINFER_RUN11_EST_CHUNK", "64");
  set("RETROINFER_DECODE", "run11-x2-c128-oest");
  Run11Knobs k = run11_knobs(5);
  EXPECT_EQ(k.splits, 10);
  EXPECT_EQ(k.est_chunk, 128);
  EXPECT_EQ(k.order, kRun11OrderEstFirst);
  set("RETROINFER_DECODE", "run11-n7");  // only the splits from the name; the chunk from the variable
  k = run11_knobs(5);
  EXPECT_EQ(k.splits, 7);
  EXPECT_EQ(k.est_chunk, 64);
}

TEST_F(Run11Env, BadValuesThrow) {
  const std::pair<const char*, const char*> bad[] = {
      {"RETROINFER_RUN11_SPLITS", "x0"},     {"RETROINFER_RUN11_SPLITS", "x5"},   {"RETROINFER_RUN11_SPLITS", "0"},
      {"RETROINFER_RUN11_SPLITS", "2a"},     {"RETROINFER_RUN11_SPLITS", "x"},    {"RETROINFER_RUN11_EST_CHUNK", "96"},
      {"RETROINFER_RUN11_ORDER", "random"},  {"RETROINFER_DECODE", "run11-q3"},   {"RETROINFER_DECODE", "run11-c32"},
      {"RETROINFER_DECODE", "run11-x2--c64"}, {"RETROINFER_DECODE", "run11-n"},
  };
  for (const auto& [name, value] : bad) {
    set(name, value);
    EXPECT_THROW(run11_knobs(4), Error) << name << "=" << value;
    unsetenv(name);
  }
}

// Exact slots per head: at least run 9's attn_splits, up to kRun11MaxSplitsX times it, and over all heads
// no more than the planner's bound (or H when one split per head is already more).
TEST(Run11Slots, WithinThePlannersBound) {
  for (const int H : {1, 6, 8, 16, 32, 128, 396, 2000})
    for (const int attn : {1, 3, 12, 49, 396})
      for (const int est : {0, 8, 30}) {
        const int slots = zone_state_slots(attn, est, H);
        const int exact = slots - est;
        EXPECT_GE(exact, attn) << "H=" << H << " attn=" << attn;
        EXPECT_LE(exact, std::max(attn, kRun11MaxSplitsX * attn));
        if (int64_t{attn} * H <= buffer::kDecodeCtaBound) {  // run 9's one wave: within the bound, so is run 11
          EXPECT_LE(int64_t{exact} * H, buffer::kDecodeCtaBound) << "H=" << H << " attn=" << attn;
        }
      }
  EXPECT_EQ(zone_state_slots(12, 30, 32), 32 + 30);  // 128K batch 4 on the H200: 1024 / 32 exact slots
  EXPECT_EQ(zone_state_slots(3, 30, 128), 8 + 30);   // batch 16
}

}  // namespace
}  // namespace retroinfer::cuda::detail
#endif
