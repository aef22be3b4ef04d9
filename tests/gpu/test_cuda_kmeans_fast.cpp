// The fast k-means kernels (kernels.h KMeansAssignVariant a, KMeansUpdateVariant fast: the defaults) against
// the v1 kernels on the same inputs, through the raw launchers. Every variant does the same f32 arithmetic in the
// same order (assignment: the same mma.sync chain per score, first strict maximum in ascending cluster
// order; update / finalize: the same f32 adds per dimension in ascending member order, the norm reduced in
// v1's lane layout), so the outputs must be identical bit for bit: assignments, sort keys, centroids (f32
// and bf16), value sums and sizes. Shapes: D 64 and 128, 1 / 2 / 3 / 8 flat heads, segment tails (last
// segment short), cluster counts that are not multiples of 8 / 64 / 128, n < 256, exact score ties
// (keys without noise: duplicated initial centroids), and a short full run (3 segment + 1 global
// iterations) per variant. Outputs are poisoned before every launch.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>

#include "kernels/kernels.h"
#include "index/cuda/kmeans_run.h"
#include "gpu_test_util.h"
#include "retroinfer/error.h"

namespace retroinfer {
namespace {

using cuda::DeviceBuffer;
namespace dt = cuda::detail;

struct FastCase {
  int heads, d;
  int64_t n;         // indexed tokens per head
  int seg_tokens;    // tokens per segment (the last one may be short)
  int tpc;           // tokens per cluster: max(1, ceil(L / tpc)) clusters per segment (kmeans.h)
  float spread;      // key noise around 8 centres (0: exact duplicates, many exact score ties)
};

// Workspace of one k-means run over the keys [idx_begin, idx_begin + n) of `heads` flat heads: the
// buffers, sizes and parameters of RetroLayer's runs (kmeans_run.h), over keys with NaN rows around.
struct Work : dt::KMeansRun {
  FastCase c;
  int64_t idx_begin = 3, stride = 0;
  std::vector<int> seg_t, seg_c;
  gputest::KvData kv;
  DeviceBuffer k, v;
  dt::KMeansParams p;

  explicit Work(const FastCase& fc, uint64_t seed) : c(fc) {
    stride = idx_begin + c.n + 5;  // rows past idx_begin + n are NaN (make_kv): a read past the range poisons
    seg_t.push_back(0);
    seg_c.push_back(0);
    for (int64_t b = 0; b < c.n; b += c.seg_tokens) {
      const int64_t L = std::min<int64_t>(c.seg_tokens, c.n - b);
      seg_t.push_back(static_cast<int>(b + L));
      seg_c.push_back(seg_c.back() + static_cast<int>(std::max<int64_t>(1, (L + c.tpc - 1) / c.tpc)));
    }
    kv = gputest::make_kv(c.heads, idx_begin + c.n, stride, c.d, seed, 8, c.spread);
    k = gputest::upload(kv.k);
    v = gputest::upload(kv.v);
    all_operands = true;  // bf16 and int8 assignment operands: the tests switch variants
    prepare(c.heads, c.d, idx_begin, c.n, seg_t, seg_c, nullptr);  // sets S, C, max_seg
    p = params(k.as<uint16_t>(), v.as<uint16_t>(), stride, c.heads, c.d);
  }
  std::string shape() const {
    return "H=" + std::to_string(c.heads) + " D=" + std::to_string(c.d) + " n=" + std::to_string(c.n) +
           " S=" + std::to_string(S) + " C=" + std::to_string(C) + " spread=" + std::to_string(c.spread);
  }
};

// Raw bytes of a device buffer (bitwise comparisons: f32 / bf16 / int alike).
std::vector<uint8_t> bytes_of(const DeviceBuffer& b) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint8_t> h(b.bytes());
  b.download(h.data(), h.size());
  return h;
}
void restore(DeviceBuffer& b, const std::vector<uint8_t>& h) { b.upload(h.data(), h.size()); }
// Count of differing 4-byte words (or 2-byte for bf16 buffers: `word` bytes).
int64_t differing(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b, size_t word) {
  EXPECT_EQ(a.size(), b.size());
  int64_t n = 0;
  for (size_t i = 0; i + word <= std::min(a.size(), b.size()); i += word) n += std::memcmp(&a[i], &b[i], word) != 0;
  return n;
}

// Differences from v1 of one case (all must be 0), printed as one line.
struct Summary {
  int64_t assign[dt::kAssignVariants] = {};  // assignments + sort keys over 4 passes (2 states x segment/global)
  int64_t full[dt::kAssignVariants] = {};    // half-words of the full run's outputs
  int64_t update = 0, finalize = 0;          // elements (f32 and bf16 outputs)
};

void check(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

// Assignment (segment and global passes) of every variant on the state `w` is in (centroids as they are).
void compare_assign(Work& w, Summary& sum) {
  for (bool global : {false, true}) {
    w.p.assign_variant = dt::kAssignV1;
    w.assignment.fill_bytes(0xff);
    w.sort_keys.fill_bytes(0xff);
    check(dt::kmeans_assign(w.p, global, nullptr), "assign v1");
    const auto ref_a = bytes_of(w.assignment), ref_k = bytes_of(w.sort_keys);
    // v1 itself: every token assigned inside its range.
    std::vector<int32_t> a(size_t(w.c.heads) * w.c.n);
    std::memcpy(a.data(), ref_a.data(), a.size() * 4);
    for (int h = 0; h < w.c.heads; ++h)
      for (int s = 0; s < w.S; ++s)
        for (int64_t t = w.seg_t[s]; t < w.seg_t[s + 1]; ++t) {
          const int32_t x = a[size_t(h) * w.c.n + t];
          ASSERT_GE(x, global ? 0 : w.seg_c[s]) << "head " << h << " token " << t;
          ASSERT_LT(x, global ? w.C : w.seg_c[s + 1]) << "head " << h << " token " << t;
        }
    for (int v = dt::kAssignA; v < dt::kAssignBf16Variants; ++v) {
      w.p.assign_variant = v;
      w.assignment.fill_bytes(0xff);
      w.sort_keys.fill_bytes(0xff);
      check(dt::kmeans_assign(w.p, global, nullptr), dt::kmeans_assign_variant_name(v));
      const int64_t da = differing(bytes_of(w.assignment), ref_a, 4), dk = differing(bytes_of(w.sort_keys), ref_k, 4);
      sum.assign[v] += da + dk;
      EXPECT_EQ(da, 0) << "variant " << dt::kmeans_assign_variant_name(v) << (global ? " global" : " segment");
      EXPECT_EQ(dk, 0) << "variant " << dt::kmeans_assign_variant_name(v) << (global ? " global" : " segment");
    }
    w.p.assign_variant = dt::kAssignV1;
  }
  // Leave the v1 segment assignment in place (the grouping of the next update).
  check(dt::kmeans_assign(w.p, false, nullptr), "assign v1");
}

// Update (spherical and plain mean) and finalize of v1 and fast from the same grouping and centroids.
void compare_update(Work& w, Summary& sum) {
  check(dt::kmeans_group(w.p, nullptr), "group");
  const auto c0 = bytes_of(w.centroids), cb0 = bytes_of(w.centroids_bf16);
  for (bool spherical : {true, false}) {
    std::vector<uint8_t> ref_c, ref_cb;
    for (int u : {int(dt::kUpdateV1), int(dt::kUpdateFast)}) {
      restore(w.centroids, c0);
      restore(w.centroids_bf16, cb0);
      w.p.update_variant = u;
      check(dt::kmeans_update(w.p, spherical, nullptr), "update");
      const auto c = bytes_of(w.centroids), cb = bytes_of(w.centroids_bf16);
      if (u == dt::kUpdateV1) {
        ref_c = c;
        ref_cb = cb;
        // The plain mean of centred keys differs from the unit centroids it replaces (non-vacuous test).
        if (!spherical) {
          EXPECT_NE(differing(c, c0, 4), 0) << "the update changed nothing: a vacuous comparison";
        }
        continue;
      }
      const int64_t dc = differing(c, ref_c, 4), dcb = differing(cb, ref_cb, 2);
      EXPECT_EQ(dc, 0) << (spherical ? "spherical" : "mean");
      EXPECT_EQ(dcb, 0) << (spherical ? "spherical" : "mean");
      sum.update += dc + dcb;
    }
  }
  // Finalize from the spherical update's centroids (as after a segment iteration).
  restore(w.centroids, c0);
  restore(w.centroids_bf16, cb0);
  w.p.update_variant = dt::kUpdateV1;
  check(dt::kmeans_update(w.p, true, nullptr), "update");
  const auto c1 = bytes_of(w.centroids), cb1 = bytes_of(w.centroids_bf16);
  std::vector<std::vector<uint8_t>> ref;
  for (int u : {int(dt::kUpdateV1), int(dt::kUpdateFast)}) {
    restore(w.centroids, c1);
    restore(w.centroids_bf16, cb1);
    for (auto* b : {&w.value_sums, &w.value_sums_bf16, &w.sizes}) b->fill_bytes(0xff);
    w.p.update_variant = u;
    check(dt::kmeans_finalize(w.p, nullptr), "finalize");
    std::vector<std::vector<uint8_t>> got{bytes_of(w.value_sums), bytes_of(w.value_sums_bf16), bytes_of(w.sizes),
                                          bytes_of(w.centroids), bytes_of(w.centroids_bf16)};
    if (u == dt::kUpdateV1) {
      ref = std::move(got);
      continue;
    }
    const size_t words[] = {4, 2, 4, 4, 2};
    const char* names[] = {"value_sums", "value_sums_bf16", "sizes", "centroids", "centroids_bf16"};
    int64_t total = 0;
    for (int i = 0; i < 5; ++i) {
      const int64_t d = differing(got[i], ref[i], words[i]);
      EXPECT_EQ(d, 0) << names[i];
      total += d;
    }
    sum.finalize += total;
  }
  // The finalize with the last plain-mean update fused in (fast, kmeans_run's order after a global pass)
  // against v1's update then finalize, from the same grouping and spherical centroids: the same outputs.
  ref.clear();
  for (int u : {int(dt::kUpdateV1), int(dt::kUpdateFast)}) {
    restore(w.centroids, c1);
    restore(w.centroids_bf16, cb1);
    for (auto* b : {&w.value_sums, &w.value_sums_bf16, &w.sizes}) b->fill_bytes(0xff);
    w.p.update_variant = u;
    check(dt::kmeans_finalize(w.p, nullptr, true), "finalize with mean");
    std::vector<std::vector<uint8_t>> got{bytes_of(w.value_sums), bytes_of(w.value_sums_bf16), bytes_of(w.sizes),
                                          bytes_of(w.centroids), bytes_of(w.centroids_bf16)};
    if (u == dt::kUpdateV1) {
      EXPECT_NE(differing(got[3], c1, 4), 0) << "the fused mean changed nothing: a vacuous comparison";
      ref = std::move(got);
      continue;
    }
    const size_t words[] = {4, 2, 4, 4, 2};
    const char* names[] = {"value_sums", "value_sums_bf16", "sizes", "centroids", "centroids_bf16"};
    for (int i = 0; i < 5; ++i) {
      const int64_t d = differing(got[i], ref[i], words[i]);
      EXPECT_EQ(d, 0) << "finalize with mean: " << names[i];
      sum.finalize += d;
    }
  }
}

// A short full run (init, 3 spherical segment iterations, 1 global plain-mean iteration, finalize) with
// the given variants; returns the outputs' bytes.
std::vector<std::vector<uint8_t>> full_run(Work& w, int assign_variant, int update_variant) {
  w.p.assign_variant = assign_variant;
  w.p.update_variant = update_variant;
  for (auto* b : {&w.centroids, &w.centroids_bf16, &w.value_sums, &w.sizes, &w.assignment, &w.members, &w.offsets})
    b->fill_bytes(0xff);
  check(dt::kmeans_init(w.p, nullptr), "init");
  for (int it = 0; it < 3; ++it) {
    check(dt::kmeans_assign(w.p, false, nullptr), "assign");
    check(dt::kmeans_group(w.p, nullptr), "group");
    check(dt::kmeans_update(w.p, true, nullptr), "update");
  }
  check(dt::kmeans_assign(w.p, true, nullptr), "assign global");
  check(dt::kmeans_group(w.p, nullptr), "group");
  check(dt::kmeans_update(w.p, false, nullptr), "update mean");
  check(dt::kmeans_finalize(w.p, nullptr), "finalize");
  return {bytes_of(w.assignment), bytes_of(w.members), bytes_of(w.offsets), bytes_of(w.sizes),
          bytes_of(w.centroids), bytes_of(w.centroids_bf16), bytes_of(w.value_sums)};
}

void run_case(const FastCase& fc, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "heads=" << fc.heads << " d=" << fc.d << " n=" << fc.n << " seg="
                                  << fc.seg_tokens << " tpc=" << fc.tpc << " spread=" << fc.spread << " seed=" << seed);
  Work w(fc, seed);
  Summary sum;
  check(dt::kmeans_mean(w.p, nullptr), "mean");
  check(dt::kmeans_init(w.p, nullptr), "init");
  compare_assign(w, sum);  // initial centroids
  // One v1 spherical iteration, then the comparisons again on iterated centroids.
  check(dt::kmeans_group(w.p, nullptr), "group");
  w.p.update_variant = dt::kUpdateV1;
  check(dt::kmeans_update(w.p, true, nullptr), "update");
  compare_assign(w, sum);  // iterated centroids
  compare_update(w, sum);
  const auto ref = full_run(w, dt::kAssignV1, dt::kUpdateV1);
  for (int v = dt::kAssignA; v < dt::kAssignBf16Variants; ++v) {
    const auto got = full_run(w, v, dt::kUpdateFast);
    int64_t d = 0;
    for (size_t i = 0; i < ref.size(); ++i) d += differing(got[i], ref[i], 2);
    EXPECT_EQ(d, 0) << "full run, variant " << dt::kmeans_assign_variant_name(v);
    sum.full[v] = d;
  }
  std::string line = "[kmeans fast] " + w.shape() + ": differing from v1: assign (4 passes x " +
                     std::to_string(int64_t(fc.heads) * fc.n) + " tokens)";
  for (int v = dt::kAssignA; v < dt::kAssignBf16Variants; ++v)
    line += std::string(" ") + dt::kmeans_assign_variant_name(v) + " " + std::to_string(sum.assign[v]);
  line += "; update fast " + std::to_string(sum.update) + ", finalize fast " + std::to_string(sum.finalize) +
          "; full run (3+1 iterations, update fast)";
  for (int v = dt::kAssignA; v < dt::kAssignBf16Variants; ++v)
    line += std::string(" ") + dt::kmeans_assign_variant_name(v) + " " + std::to_string(sum.full[v]);
  std::printf("%s\n", line.c_str());
}

TEST(CudaKMeansFast, VariantsMatchV1) {
  RETROINFER_REQUIRE_GPU();
  const FastCase cases[] = {
      {1, 128, 100, 64, 16, 0.5f},     // n < 256: segments of 64 + 36 tokens, 4 + 3 clusters
      {1, 64, 100, 64, 16, 0.5f},
      {8, 128, 9192, 8192, 16, 0.5f},  // the paper's segment (512 clusters) + a 1000-token tail (63): C 575
      {1, 64, 9192, 8192, 16, 0.5f},
      {8, 64, 3000, 1000, 16, 0.5f},   // 63 clusters per segment (not a multiple of 8), C 189
      {2, 128, 5000, 2048, 16, 0.0f},  // keys = 8 exact centres: duplicated centroids, exact ties
      {3, 128, 300, 300, 5, 0.5f},     // one segment of 300 tokens (2 CTAs, the second partial), 60 clusters
      {1, 128, 20000, 8192, 24, 0.5f}, // 342 + 342 + 151 clusters; global pass over 835
  };
  uint64_t seed = 4242;
  for (const auto& c : cases) run_case(c, seed++);
}

// The environment switches (no device needed): names map to the variants, unset or empty to the default
// (kmeans.cu kDefaultAssignVariant: q8 since run 26, a in runs 15-25), unknown names throw. (The explicit KMeansParams fields
// are what VariantsMatchV1 uses.)
TEST(CudaKMeansFast, VariantSwitches) {
  const char* saved_a = std::getenv("RETROINFER_KMEANS_ASSIGN");
  const char* saved_u = std::getenv("RETROINFER_KMEANS_UPDATE");
  const std::string keep_a = saved_a ? saved_a : "", keep_u = saved_u ? saved_u : "";
  unsetenv("RETROINFER_KMEANS_ASSIGN");
  unsetenv("RETROINFER_KMEANS_UPDATE");
  const int dflt_a = dt::kmeans_assign_variant_from_env(), dflt_u = dt::kmeans_update_variant_from_env();
  EXPECT_GE(dflt_a, 0);
  EXPECT_LT(dflt_a, int(dt::kAssignVariants));
  EXPECT_GE(dflt_u, 0);
  EXPECT_LT(dflt_u, int(dt::kUpdateVariants));
  for (int v = 0; v < dt::kAssignVariants; ++v) {
    setenv("RETROINFER_KMEANS_ASSIGN", dt::kmeans_assign_variant_name(v), 1);
    EXPECT_EQ(dt::kmeans_assign_variant_from_env(), v) << dt::kmeans_assign_variant_name(v);
  }
  EXPECT_EQ(int(dt::kAssignVariants), 3);  // v1, a and q8 (b-f were removed after run 15)
  for (const char* gone : {"bogus", "b", "c", "d", "e", "f", "A"}) {  // unknown or removed: a clear error
    setenv("RETROINFER_KMEANS_ASSIGN", gone, 1);
    EXPECT_THROW(dt::kmeans_assign_variant_from_env(), retroinfer::Error) << gone;
  }
  setenv("RETROINFER_KMEANS_ASSIGN", "", 1);  // empty: the default, as unset
  EXPECT_EQ(dt::kmeans_assign_variant_from_env(), dflt_a);
  setenv("RETROINFER_KMEANS_UPDATE", "slow", 1);
  EXPECT_THROW(dt::kmeans_update_variant_from_env(), retroinfer::Error);
  EXPECT_EQ(dflt_a, int(dt::kAssignQ8));
  EXPECT_EQ(dflt_u, int(dt::kUpdateFast));
  {
    const char* saved_g = std::getenv("RETROINFER_KMEANS_GROUP");
    const std::string keep_g = saved_g ? saved_g : "";
    unsetenv("RETROINFER_KMEANS_GROUP");
    EXPECT_EQ(dt::kmeans_group_variant_from_env(), int(dt::kGroupCount));
    setenv("RETROINFER_KMEANS_GROUP", "radix", 1);
    EXPECT_EQ(dt::kmeans_group_variant_from_env(), int(dt::kGroupRadix));
    setenv("RETROINFER_KMEANS_GROUP", "sort", 1);
    EXPECT_THROW(dt::kmeans_group_variant_from_env(), retroinfer::Error);
    EXPECT_STREQ(dt::kmeans_group_variant_name(dt::kGroupCount), "count");
    EXPECT_STREQ(dt::kmeans_group_variant_name(dt::kGroupVariants), "?");
    if (saved_g) setenv("RETROINFER_KMEANS_GROUP", keep_g.c_str(), 1);
    else unsetenv("RETROINFER_KMEANS_GROUP");
  }
  {  // the raw launcher refuses another variant or head_dim before any CUDA call
    dt::KMeansParams p;
    p.head_dim = 128;
    EXPECT_EQ(dt::kmeans_assign_variant(p, false, dt::kAssignVariants, nullptr), cudaErrorInvalidValue);
    EXPECT_EQ(dt::kmeans_assign_variant(p, true, -1, nullptr), cudaErrorInvalidValue);
    p.head_dim = 96;
    EXPECT_EQ(dt::kmeans_assign_variant(p, false, dt::kAssignA, nullptr), cudaErrorInvalidValue);
    p.head_dim = 128;  // q8 without its int8 operands
    EXPECT_EQ(dt::kmeans_assign_variant(p, false, dt::kAssignQ8, nullptr), cudaErrorInvalidValue);
    p.max_seg_clusters = dt::kGroupCountMaxBins + 1;  // the counting sort refuses more bins than it holds
    p.num_segments = 1;
    EXPECT_EQ(dt::kmeans_group_segments(p, nullptr), cudaErrorInvalidValue);
  }
  setenv("RETROINFER_KMEANS_UPDATE", "fast", 1);
  EXPECT_EQ(dt::kmeans_update_variant_from_env(), int(dt::kUpdateFast));
  setenv("RETROINFER_KMEANS_UPDATE", "v1", 1);
  EXPECT_EQ(dt::kmeans_update_variant_from_env(), int(dt::kUpdateV1));
  EXPECT_STREQ(dt::kmeans_assign_variant_name(dt::kAssignVariants), "?");
  if (saved_a) setenv("RETROINFER_KMEANS_ASSIGN", keep_a.c_str(), 1);
  else unsetenv("RETROINFER_KMEANS_ASSIGN");
  if (saved_u) setenv("RETROINFER_KMEANS_UPDATE", keep_u.c_str(), 1);
  else unsetenv("RETROINFER_KMEANS_UPDATE");
}

// ---- q8 (kernels.h kAssignQ8) and the counting-sort grouping (kGroupCount) ----

// The kernels' per-row quantization on the host (the same IEEE operations: m = max |x|, inv = 127 / m,
// rint of x * inv; scale m / 127). Returns the scale.
float quantize_host(const float* x, int d, int8_t* q) {
  float mx = 0.0f;
  for (int i = 0; i < d; ++i) mx = std::max(mx, std::fabs(x[i]));
  const float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
  for (int i = 0; i < d; ++i)
    q[i] = static_cast<int8_t>(static_cast<int>(std::min(127.0f, std::max(-127.0f, std::nearbyint(x[i] * inv)))));
  return mx / 127.0f;
}

template <typename T>
std::vector<T> download_as(const DeviceBuffer& b, size_t count) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<T> h(count);
  b.download(h.data(), count * sizeof(T));
  return h;
}

// The int8 operands made by kmeans_mean (keys) and store_centroid (centroids) equal the host's
// quantization of the device's own f32 inputs (mean key, f32 centroids), element for element.
void check_q8_operands(Work& w) {
  const int H = w.c.heads, D = w.c.d;
  const int64_t n = w.c.n;
  const auto mean = download_as<float>(w.mean, size_t(H) * D);
  const auto kq = download_as<int8_t>(w.centred_q8, size_t(H) * n * D);
  const auto cf = download_as<float>(w.centroids, size_t(H) * w.C * D);
  const auto cq = download_as<int8_t>(w.centroids_q8, size_t(H) * w.C * D);
  const auto cs = download_as<float>(w.centroid_scale, size_t(H) * w.C);
  std::vector<float> x(D);
  std::vector<int8_t> q(D);
  int64_t bad_k = 0, bad_c = 0, nonzero = 0;
  for (int h = 0; h < H; ++h)
    for (int64_t t = 0; t < n; ++t) {
      for (int j = 0; j < D; ++j) x[j] = w.kv.key(h, w.idx_begin + t, j) - mean[size_t(h) * D + j];
      quantize_host(x.data(), D, q.data());
      for (int j = 0; j < D; ++j) {
        bad_k += q[j] != kq[(size_t(h) * n + t) * D + j];
        nonzero += q[j] != 0;
      }
    }
  for (int64_t r = 0; r < int64_t(H) * w.C; ++r) {
    const float s = quantize_host(&cf[size_t(r) * D], D, q.data());
    bad_c += std::memcmp(&s, &cs[r], 4) != 0;
    for (int j = 0; j < D; ++j) bad_c += q[j] != cq[size_t(r) * D + j];
  }
  EXPECT_EQ(bad_k, 0) << "int8 keys differing from the host quantization";
  EXPECT_EQ(bad_c, 0) << "int8 centroids / scales differing from the host quantization";
  EXPECT_GT(nonzero, int64_t(H) * n * D / 4) << "almost all-zero int8 keys: a vacuous comparison";
}

// The q8 assignment equals the host argmax over the same int8 operands (exact int dot, f32(dot) * scale,
// first strict maximum in ascending cluster order), bit for bit; segment and global passes. Returns the
// count of tokens whose best two scores tie exactly (the ties-to-lowest-id rule at work).
int64_t check_q8_assign(Work& w) {
  const int H = w.c.heads, D = w.c.d;
  const int64_t n = w.c.n;
  const auto kq = download_as<int8_t>(w.centred_q8, size_t(H) * n * D);
  const auto cq = download_as<int8_t>(w.centroids_q8, size_t(H) * w.C * D);
  const auto cs = download_as<float>(w.centroid_scale, size_t(H) * w.C);
  int64_t ties = 0;
  for (bool global : {false, true}) {
    w.p.assign_variant = dt::kAssignQ8;
    w.assignment.fill_bytes(0xff);
    w.sort_keys.fill_bytes(0xff);
    check(dt::kmeans_assign(w.p, global, nullptr), "assign q8");
    const auto a = download_as<int32_t>(w.assignment, size_t(H) * n);
    const auto k = download_as<uint32_t>(w.sort_keys, size_t(H) * n);
    int64_t bad = 0;
    for (int h = 0; h < H; ++h)
      for (int s = 0; s < w.S; ++s)
        for (int64_t t = w.seg_t[s]; t < w.seg_t[s + 1]; ++t) {
          const int c0 = global ? 0 : w.seg_c[s], c1 = global ? w.C : w.seg_c[s + 1];
          float best = -INFINITY;
          int bi = c0, at_best = 0;
          for (int c = c0; c < c1; ++c) {
            int dot = 0;
            for (int j = 0; j < D; ++j)
              dot += int(kq[(size_t(h) * n + t) * D + j]) * int(cq[(size_t(h) * w.C + c) * D + j]);
            const float v = static_cast<float>(dot) * cs[size_t(h) * w.C + c];
            if (v > best) {
              best = v;
              bi = c;
              at_best = 1;
            } else if (v == best) {
              ++at_best;
            }
          }
          ties += at_best > 1;
          const size_t at = size_t(h) * n + t;
          bad += a[at] != bi || k[at] != uint32_t(h) * uint32_t(w.C) + uint32_t(bi);
        }
    EXPECT_EQ(bad, 0) << (global ? "global" : "segment") << " pass: q8 assignments differing from the host";
  }
  return ties;
}

// Counting-sort grouping (segment pass) against the radix sort: identical members and offsets.
void check_group_count(Work& w) {
  w.p.assign_variant = dt::kAssignQ8;
  check(dt::kmeans_assign(w.p, false, nullptr), "assign q8");
  w.members.fill_bytes(0xff);
  w.offsets.fill_bytes(0xff);
  check(dt::kmeans_group(w.p, nullptr), "group radix");
  const auto m_ref = bytes_of(w.members), o_ref = bytes_of(w.offsets);
  w.members.fill_bytes(0xff);
  w.offsets.fill_bytes(0xff);
  if (w.max_seg_c > dt::kGroupCountMaxBins) {
    EXPECT_EQ(dt::kmeans_group_segments(w.p, nullptr), cudaErrorInvalidValue);
    w.p.group_variant = dt::kGroupCount;  // the pass falls back to the radix sort
    check(dt::kmeans_group_pass(w.p, false, nullptr), "group pass (fallback)");
  } else {
    check(dt::kmeans_group_segments(w.p, nullptr), "group count");
  }
  const size_t items = size_t(w.c.heads) * w.c.n, flat = size_t(w.c.heads) * w.C;
  const auto m = bytes_of(w.members), o = bytes_of(w.offsets);
  EXPECT_EQ(std::memcmp(m.data(), m_ref.data(), items * 4), 0) << "members";
  EXPECT_EQ(std::memcmp(o.data(), o_ref.data(), (flat + 1) * 4), 0) << "offsets";
}

TEST(CudaKMeansQ8, OperandsAssignmentAndGroupingExact) {
  RETROINFER_REQUIRE_GPU();
  const FastCase cases[] = {
      {1, 128, 100, 64, 16, 0.5f},      // n < 256: segments of 64 + 36 tokens
      {1, 64, 100, 64, 16, 0.5f},
      {8, 128, 9192, 8192, 16, 0.5f},   // 512 clusters + a tail segment (63): C 575
      {2, 64, 9192, 8192, 16, 0.5f},
      {8, 64, 3000, 1000, 16, 0.5f},    // 63 clusters per segment
      {2, 128, 5000, 2048, 16, 0.0f},   // exact duplicate keys: exact score ties
      {3, 128, 300, 300, 5, 0.5f},      // 60 clusters, a partial CTA
      {1, 128, 20000, 8192, 8, 0.5f},   // 1024 clusters per segment: the counting sort's largest
      {1, 128, 9000, 8192, 7, 0.5f},    // 1171 clusters: past it (the radix sort takes the pass)
  };
  uint64_t seed = 777;
  for (const auto& fc : cases) {
    SCOPED_TRACE(testing::Message() << "heads=" << fc.heads << " d=" << fc.d << " n=" << fc.n << " seg="
                                    << fc.seg_tokens << " tpc=" << fc.tpc << " spread=" << fc.spread);
    Work w(fc, seed++);
    w.centred_q8.fill_bytes(0x55);
    w.centroids_q8.fill_bytes(0x55);
    w.centroid_scale.fill_bytes(0xff);
    check(dt::kmeans_mean(w.p, nullptr), "mean");
    check(dt::kmeans_init(w.p, nullptr), "init");
    check_q8_operands(w);
    int64_t ties = check_q8_assign(w);  // initial centroids
    check_group_count(w);
    w.p.update_variant = dt::kUpdateFast;
    check(dt::kmeans_update(w.p, true, nullptr), "update");  // iterated centroids (from the count grouping)
    check_q8_operands(w);
    ties += check_q8_assign(w);
    check_group_count(w);
    std::printf("[kmeans q8] %s: operands, assignments and grouping exact (%lld exact ties)\n", w.shape().c_str(),
                static_cast<long long>(ties));
  }
}

}  // namespace
}  // namespace retroinfer

namespace retroinfer {
namespace {
// top_sizes_sum (RetroLayer's retrieval capacity) against the host's sum of the k largest, on sizes that
// take one histogram pass (all below 4096), two or three (spreads up to 2^24), all-equal sizes, zeros, k = 1
// and k = C; bad arguments are refused before any launch.
TEST(CudaTopSizes, SumOfLargestMatchesHost) {
  RETROINFER_REQUIRE_GPU();
  struct Case {
    int heads, clusters, k, spread;
  };
  const Case cases[] = {{8, 2044, 37, 40}, {3, 100, 100, 4000}, {2, 5000, 1, 1 << 24}, {1, 1, 1, 7},
                        {4, 8188, 148, 1 << 20}, {2, 3000, 55, 0}, {5, 777, 300, 5000}};
  std::mt19937_64 rng(99);
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::Message() << "heads=" << c.heads << " C=" << c.clusters << " k=" << c.k);
    std::vector<int32_t> sz(size_t(c.heads) * c.clusters);
    std::uniform_int_distribution<int> small(0, 40), big(0, std::max(c.spread, 1));
    for (size_t i = 0; i < sz.size(); ++i) sz[i] = c.spread == 0 ? 16 : (i % 7 == 0 ? big(rng) : small(rng));
    cuda::DeviceBuffer d(sz.size() * 4), out(size_t(c.heads) * 8);
    d.upload(sz.data(), sz.size() * 4);
    out.fill_bytes(0xff);
    ASSERT_EQ(cuda::detail::top_sizes_sum(d.as<int>(), c.heads, c.clusters, c.k, out.as<long long>(), nullptr),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<long long> got(c.heads);
    out.download(got.data(), got.size() * 8);
    for (int h = 0; h < c.heads; ++h) {
      std::vector<int32_t> one(sz.begin() + int64_t(h) * c.clusters, sz.begin() + int64_t(h + 1) * c.clusters);
      std::sort(one.begin(), one.end(), std::greater<>());
      const long long want = std::accumulate(one.begin(), one.begin() + c.k, 0LL);
      EXPECT_EQ(got[h], want) << "head " << h;
    }
  }
  cuda::DeviceBuffer d(64), out(64);
  EXPECT_EQ(cuda::detail::top_sizes_sum(d.as<int>(), 1, 4, 5, out.as<long long>(), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::detail::top_sizes_sum(d.as<int>(), 1, 4, 0, out.as<long long>(), nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cuda::detail::top_sizes_sum(d.as<int>(), 0, 4, 1, out.as<long long>(), nullptr), cudaErrorInvalidValue);
}
}  // namespace
}  // namespace retroinfer
