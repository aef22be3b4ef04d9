// The phase-stamp summary of a decode (layer_common.h summarize_phases: the diagnostics of
// RetroLayer::decode_stage_ms) on synthetic stamps, on the CPU (CUDA builds, no device needed).
#if defined(RETROINFER_WITH_CUDA)
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "attention/cuda/layer_common.h"

namespace retroinfer::cuda::detail {
namespace {

// Two heads; times in ns from t0 = 1e9. Head 0's selection runs 10 us at 2 ns per cycle, head 1's 12 us.
TEST(CudaPhaseSummary, TimelineAndSelectionPhases) {
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
