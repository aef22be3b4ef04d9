// Host-side pieces of the decode paths, on the CPU (CUDA builds, no device needed): the RETROINFER_DECODE
// switch (decode_path: run 6 / 8 / 9 / 10 and the names removed after run 15) and the phase-stamp summary
// (summarize_phases) on synthetic stamps.
#if defined(RETROINFER_WITH_CUDA)
#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <string>

#include "attention/cuda/layer_common.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda::detail {
namespace {

TEST(CudaDecodePath, EnvironmentSwitch) {
  const char* old = std::getenv("RETROINFER_DECODE");
  const std::string saved = old ? old : "";
  unsetenv("RETROINFER_DECODE");
  DecodePath p = decode_path();
  EXPECT_TRUE(p.pdl && p.early_loads && p.prefetch && p.balance);
  // The default: run 9 + run 10's score formation (layer_common.h kRun9IsDefault, kRun10FormIsDefault) and,
  // since run 17, combine_states chained by PDL instead of the fused merge (kRun10CombineIsDefault).
  EXPECT_EQ(p.form_scores && p.fused_estimate, kRun9IsDefault);
  EXPECT_EQ(p.form_in_score, kRun9IsDefault && kRun10FormIsDefault);
  EXPECT_EQ(p.combine_pdl, kRun9IsDefault && kRun10FormIsDefault && kRun10CombineIsDefault);
  EXPECT_EQ(p.fused_merge, !p.combine_pdl);
  // Since run 25 the bins selection forms the scores (kRun25SelectFormsIsDefault; launch_zone_decode keeps the
  // score grid's formation where that does not apply).
  EXPECT_EQ(p.select_forms, p.combine_pdl && kRun25SelectFormsIsDefault);
  for (const char* name : {"run10", "run10form"}) {
    setenv("RETROINFER_DECODE", name, 1);
    p = decode_path();
    EXPECT_TRUE(p.fused_merge && p.pdl && p.early_loads && p.prefetch && p.balance) << name;
    EXPECT_TRUE(p.form_scores && p.fused_estimate && p.form_in_score) << name;
  }
  EXPECT_FALSE(p.combine_pdl);  // run10 keeps the fused merge
  // Run 17's run10c: run 10 with combine_states chained by PDL instead of the fused merge.
  for (const char* name : {"run10c", "run10c+split64"}) {
    setenv("RETROINFER_DECODE", name, 1);
    p = decode_path();
    EXPECT_TRUE(p.form_scores && p.fused_estimate && p.form_in_score && p.combine_pdl && p.pdl) << name;
    EXPECT_FALSE(p.fused_merge || p.select_forms) << name;
  }
  // Run 25's run10s: run10c with the scores formed by the bins selection.
  for (const char* name : {"run10s", "run10s+split64"}) {
    setenv("RETROINFER_DECODE", name, 1);
    p = decode_path();
    EXPECT_TRUE(p.form_scores && p.fused_estimate && p.combine_pdl && p.select_forms && p.pdl) << name;
    EXPECT_FALSE(p.fused_merge) << name;
  }
  setenv("RETROINFER_DECODE", "run9", 1);
  p = decode_path();
  EXPECT_TRUE(p.form_scores && p.fused_estimate);
  EXPECT_FALSE(p.form_in_score);
  setenv("RETROINFER_DECODE", "run8", 1);
  p = decode_path();
  EXPECT_TRUE(p.fused_merge && p.pdl && p.early_loads && p.prefetch && p.balance);
  EXPECT_FALSE(p.form_scores || p.fused_estimate || p.form_in_score);
  // Removed after run 15: a clear error, not a silent other path.
  for (const char* name : {"run10select", "run10list", "run11", "run11-x2-c64"}) {
    setenv("RETROINFER_DECODE", name, 1);
    EXPECT_THROW(decode_path(), Error) << name;
  }
  for (const char* name : {"run11x2", "bogus", "RUN9", "run9 "}) {  // unknown names: a clear error too
    setenv("RETROINFER_DECODE", name, 1);
    EXPECT_THROW(decode_path(), Error) << name;
  }
  setenv("RETROINFER_DECODE", "", 1);  // empty: the default, as unset
  p = decode_path();
  EXPECT_TRUE(p.form_scores && p.fused_estimate && p.form_in_score);
  EXPECT_EQ(p.combine_pdl, kRun10CombineIsDefault);
  EXPECT_EQ(p.select_forms, kRun10CombineIsDefault && kRun25SelectFormsIsDefault);
  setenv("RETROINFER_DECODE", "run6", 1);
  p = decode_path();
  EXPECT_FALSE(p.fused_merge || p.pdl || p.early_loads || p.prefetch || p.balance);
  setenv("RETROINFER_DECODE", "fused", 1);
  p = decode_path();
  EXPECT_TRUE(p.fused_merge);
  EXPECT_FALSE(p.pdl || p.early_loads || p.prefetch || p.balance);
  setenv("RETROINFER_DECODE", "nopdl", 1);
  p = decode_path();
  EXPECT_TRUE(p.fused_merge && p.early_loads && p.prefetch && p.balance);
  EXPECT_FALSE(p.pdl);
  if (old != nullptr) setenv("RETROINFER_DECODE", saved.c_str(), 1);
  else unsetenv("RETROINFER_DECODE");
}

// Two heads; times in ns from t0 = 1e9. Head 0's selection runs 10 us at 2 ns per cycle, head 1's 12 us.
TEST(CudaDecodePath, PhaseSummary) {
  constexpr uint64_t kUnset = ~uint64_t{0}, t0 = 1000000000ull;
  std::vector<uint64_t> raw(2 * kPhaseSlots, kUnset);
  auto head = [&](int h) { return raw.data() + size_t(h) * kPhaseSlots; };
  const uint64_t sel_len[2] = {10000, 12000};
  for (int h = 0; h < 2; ++h) {
    uint64_t* r = head(h);
    r[0] = t0 + 100 * h;                 // score first start
    r[1] = ~(t0 + 20000 + 500 * h);       // score last end (complement)
    const uint64_t s0 = t0 + 21000 + 1000 * h;
    for (int j = 0; j < kSelPhases; ++j) {
      r[2 + j] = s0 + sel_len[h] * j / (kSelPhases - 1);                // globaltimer
      r[2 + kSelPhases + j] = 5000 + (sel_len[h] / 2) * j / (kSelPhases - 1);  // clock64, 2 ns per cycle
    }
    r[kSlotExact] = t0 + 34000;
    r[kSlotExact + 1] = ~(t0 + 45000 + 1000 * h);
    r[kSlotEst] = t0 + 34500;
    r[kSlotEst + 1] = ~(t0 + 44000);
    r[kSlotMerge] = ~(t0 + 47000);
    r[kSlotScore + 4] = t0 + 2000 + 100 * h;      // first tile landed: earliest
    r[kSlotScore] = ~(t0 + 4000 + 300 * h);       // ... latest
    r[kSlotScore + 1] = t0 + 15000 + 1000 * h;    // tile loops done: earliest
    r[kSlotScore + 2] = ~(t0 + 18000 + 1000 * h); // ... latest
    r[kSlotScore + 3] = ~(t0 + 19000 + 200 * h);  // past the grid barrier: latest
    // CTA spans: exact CTAs of head h start at the latest at 35 + h us, end first at 40 + h us; the sums and
    // counts are stored minus 1 (added to ~0): head 0 three CTAs of 6 us in all, head 1 one CTA of 10 us.
    r[kSlotSpan] = ~(t0 + 35000 + 1000 * h);
    r[kSlotSpan + 1] = t0 + 40000 + 1000 * h;
    r[kSlotSpan + 2] = (h == 0 ? 6000 : 10000) - 1;
    r[kSlotSpan + 3] = (h == 0 ? 3 : 1) - 1;
  }
  const auto out = summarize_phases(raw, 2);
  std::map<std::string, double> us;
  for (const auto& [name, ms] : out) us[name] = ms * 1e3;
  EXPECT_NEAR(us.at("phase.score_end"), 20.5, 1e-3);      // the later head's end
  EXPECT_NEAR(us.at("phase.select_start"), 21.0, 1e-3);
  EXPECT_NEAR(us.at("phase.select_end"), 34.0, 1e-3);     // head 1: 22 + 12
  EXPECT_NEAR(us.at("phase.exact_start"), 34.0, 1e-3);
  EXPECT_NEAR(us.at("phase.exact_end"), 46.0, 1e-3);
  EXPECT_NEAR(us.at("phase.estimate_start"), 34.5, 1e-3);
  EXPECT_NEAR(us.at("phase.estimate_end"), 44.0, 1e-3);
  EXPECT_NEAR(us.at("phase.merge_end"), 47.0, 1e-3);
  EXPECT_NEAR(us.at("phase.score_first_tile_first"), 2.0, 1e-3);
  EXPECT_NEAR(us.at("phase.score_first_tile_last"), 4.3, 1e-3);
  EXPECT_NEAR(us.at("phase.score_loop_end_first"), 15.0, 1e-3);
  EXPECT_NEAR(us.at("phase.score_loop_end_last"), 19.0, 1e-3);
  EXPECT_NEAR(us.at("phase.score_barrier_last"), 19.2, 1e-3);
  EXPECT_NEAR(us.at("phase.exact_start_last"), 36.0, 1e-3);
  EXPECT_NEAR(us.at("phase.exact_end_first"), 40.0, 1e-3);
  EXPECT_NEAR(us.at("phase.exact_cta_mean"), 4.0, 1e-3);  // 16 us over 4 CTAs
  EXPECT_NEAR(us.at("phase.exact_ctas"), 4e3, 1e-3);       // a count (x 1e3 by the conversion above)
  EXPECT_EQ(us.count("phase.estimate_cta_mean"), 0u);      // no estimation CTA stamped its span
  // Per-head totals 10 and 12 us: the median of two is the upper one; each of the 7 phases is 1/7 of it
  // (cycles converted at the heads' mean ratio, 2 ns per cycle).
  EXPECT_NEAR(us.at("phase.select_head_total"), 12.0, 1e-3);
  EXPECT_NEAR(us.at("phase.select_expansion"), 12.0 / 7, 5e-3);  // integer cycle stamps
  // Nothing stamped: no entries.
  std::vector<uint64_t> none(2 * kPhaseSlots, kUnset);
  EXPECT_TRUE(summarize_phases(none, 2).empty());
}

}  // namespace
}  // namespace retroinfer::cuda::detail
#endif
