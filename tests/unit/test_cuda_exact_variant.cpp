// The RETROINFER_EXACT switch of run 9's exact + estimation grid (kernels.h ExactVariant,
// layer_attention_zones.cpp exact_variant_from_env) on the CPU (CUDA builds, no device needed): the names,
// the unset / empty default, unknown values throwing, the "+X" suffix of RETROINFER_DECODE taking
// precedence (kernel_bench --paths run10,run10+split) while decode_path reads the part before it, and the
// estimation chunk of each variant within the slots the layers size (ceil(n_e / kEstimateChunk)).
#if defined(RETROINFER_WITH_CUDA)
#include <gtest/gtest.h>

#include <cstdlib>
#include <iterator>
#include <string>

#include "attention/cuda/layer_common.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda::detail {
namespace {

// Sets (or unsets, nullptr) a variable for the scope, restoring it after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    set(value);
  }
  ~ScopedEnv() { set(had_ ? old_.c_str() : nullptr); }
  void set(const char* value) {
    if (value == nullptr) unsetenv(name_);
    else setenv(name_, value, 1);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

TEST(CudaExactVariant, EnvironmentSwitch) {
  ScopedEnv dec("RETROINFER_DECODE", nullptr);
  ScopedEnv ex("RETROINFER_EXACT", nullptr);
  EXPECT_EQ(exact_variant_from_env(), kExactDefault);
  ex.set("");
  EXPECT_EQ(exact_variant_from_env(), kExactDefault);
  EXPECT_EQ(kExactDefault, kExactSplit64R);  // run 17's measured default
  for (int v = 0; v < kExactVariants; ++v) {
    ex.set(exact_variant_name(v));
    EXPECT_EQ(exact_variant_from_env(), v) << exact_variant_name(v);
  }
  EXPECT_STREQ(exact_variant_name(kExactV1), "v1");
  EXPECT_STREQ(exact_variant_name(kExactSplit), "split");
  EXPECT_STREQ(exact_variant_name(kExactSplit64), "split64");
  EXPECT_STREQ(exact_variant_name(kExactSplit64R), "split64r");
  EXPECT_STREQ(exact_variant_name(kExactSplit64I), "split64i");
  EXPECT_STREQ(exact_variant_name(kExactSplit64RI), "split64ri");
  EXPECT_STREQ(exact_variant_name(kExactSplit64RH), "split64rh");
  EXPECT_STREQ(exact_variant_name(kExactSplit64RIH), "split64rih");
  EXPECT_STREQ(exact_variant_name(kExactSplit64E), "split64e");
  EXPECT_STREQ(exact_variant_name(kExactSplit64ERI), "split64eri");
  EXPECT_STREQ(exact_variant_name(kExactSplit64EP), "split64ep");
  EXPECT_STREQ(exact_variant_name(kExactSplit64ERP), "split64erp");
  EXPECT_STREQ(exact_variant_name(kExactVariants), "?");
  for (const char* bad : {"V1", "split ", "split32", "v2", "run10", "+split", "split64ir", "split64R", "split64er",
                          "split64pe", "split64eip", "split64p"}) {
    ex.set(bad);
    EXPECT_THROW(exact_variant_from_env(), Error) << bad;
  }
  // The suffix of RETROINFER_DECODE wins over RETROINFER_EXACT; decode_path ignores it.
  ex.set("bogus");
  dec.set("run10+split64");
  EXPECT_EQ(exact_variant_from_env(), kExactSplit64);
  DecodePath p = decode_path();
  EXPECT_TRUE(p.form_scores && p.fused_estimate && p.form_in_score);
  dec.set("run10+split64eri");  // kernel_bench --paths run10+split64,run10+split64eri
  EXPECT_EQ(exact_variant_from_env(), kExactSplit64ERI);
  dec.set("run10+split64erp");  // kernel_bench --paths ...,run10+split64ep,run10+split64erp
  EXPECT_EQ(exact_variant_from_env(), kExactSplit64ERP);
  dec.set("run9+v1");
  EXPECT_EQ(exact_variant_from_env(), kExactV1);
  p = decode_path();
  EXPECT_TRUE(p.form_scores && p.fused_estimate);
  EXPECT_FALSE(p.form_in_score);
  dec.set("+split");  // the default path
  EXPECT_EQ(exact_variant_from_env(), kExactSplit);
  p = decode_path();
  EXPECT_EQ(p.fused_estimate, kRun9IsDefault);
  for (const char* bad : {"run10+", "run10+splitx", "run10+split+v1"}) {
    dec.set(bad);
    EXPECT_THROW(exact_variant_from_env(), Error) << bad;
  }
  dec.set("bogus+split");  // a bad path stays an error
  EXPECT_THROW(decode_path(), Error);
}

TEST(CudaExactVariant, EstimationChunksFitTheLayersSlots) {
  for (int v = 0; v < kExactVariants; ++v) {
    const int chunk = exact_est_chunk(v);
    EXPECT_EQ(chunk % kEstimateChunk, 0) << exact_variant_name(v);  // ceil(n / chunk) <= ceil(n / 64)
    for (int n_e = 1; n_e < 5000; n_e += 37)
      EXPECT_LE(ceil_div(n_e, chunk), ceil_div(n_e, kEstimateChunk)) << exact_variant_name(v) << " n_e " << n_e;
  }
  EXPECT_EQ(exact_est_chunk(kExactV1), kEstimateFusedChunk);
  EXPECT_EQ(exact_est_chunk(kExactSplit), kEstimateFusedChunk);
  EXPECT_EQ(exact_est_chunk(kExactSplit64), kEstimateChunk);
  for (int v = kExactSplit64R; v < kExactVariants; ++v) EXPECT_EQ(exact_est_chunk(v), kEstimateChunk) << v;
}

// Run 17's variants: which of the changes each carries (decode.cu dispatches on these). The pre-merge (p) only
// on est-first grids (the estimation must finish before the exact grid for it to leave the critical path).
TEST(CudaExactVariant, Run17Properties) {
  struct Row {
    int v;
    bool cap, ids, halves, first, premerge;
  };
  const Row rows[] = {{kExactV1, false, false, false, false, false},
                      {kExactSplit, false, false, false, false, false},
                      {kExactSplit64, false, false, false, false, false},
                      {kExactSplit64R, true, false, false, false, false},
                      {kExactSplit64I, false, true, false, false, false},
                      {kExactSplit64RI, true, true, false, false, false},
                      {kExactSplit64RH, true, false, true, false, false},
                      {kExactSplit64RIH, true, true, true, false, false},
                      {kExactSplit64E, false, false, false, true, false},
                      {kExactSplit64ERI, true, true, false, true, false},
                      {kExactSplit64EP, false, false, false, true, true},
                      {kExactSplit64ERP, true, false, false, true, true}};
  static_assert(std::size(rows) == kExactVariants, "one row per variant");
  for (const Row& r : rows) {
    EXPECT_EQ(exact_caps_registers(r.v), r.cap) << exact_variant_name(r.v);
    EXPECT_EQ(exact_ids_ahead(r.v), r.ids) << exact_variant_name(r.v);
    EXPECT_EQ(exact_est_halves(r.v), r.halves) << exact_variant_name(r.v);
    EXPECT_EQ(exact_est_first(r.v), r.first) << exact_variant_name(r.v);
    EXPECT_EQ(exact_premerges(r.v), r.premerge) << exact_variant_name(r.v);
    if (exact_premerges(r.v)) {
      EXPECT_TRUE(exact_est_first(r.v)) << exact_variant_name(r.v);
    }
  }
  EXPECT_EQ(kPremergeSlots, 1);  // one pre-merged estimation state per head
}

}  // namespace
}  // namespace retroinfer::cuda::detail
#endif  // RETROINFER_WITH_CUDA
