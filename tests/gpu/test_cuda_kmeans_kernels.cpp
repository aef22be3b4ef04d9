// The k-means kernels (kmeans_kernels.h) through their raw launchers, against exact host recomputations
// from the same device inputs, bit for bit:
//   - the int8 operands (keys and centroids quantized per row) and the int8 assignment (exact integer dots,
//     f32(dot) * scale, the first strict maximum in ascending cluster order), segment and global passes;
//   - the counting-sort grouping of a segment pass against the radix sort, and the size fallback to it;
//   - the centroid update (spherical and plain mean: f32 sums in ascending member order, the norm reduced
//     in the warp order of kmeans.cu update_centroid) with its bf16 and int8 copies, and the finalize
//     (value sums, sizes, de-centred centroids), with and without the last plain-mean update fused in;
//   - the fused finalize against a separate update then finalize, and KMeansRun::run (the production
//     launch sequence) against the same steps launched one by one with the radix grouping.
// Shapes: D 64 and 128, 1 / 2 / 3 / 8 flat heads, segment tails (last segment short), cluster counts that are
// not multiples of 8 / 64 / 128, n < 256, exact score ties (keys without noise: duplicated initial
// centroids, empty clusters). Outputs are poisoned before every launch.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>

#include "gpu_test_util.h"
#include "index/cuda/kmeans_run.h"
#include "kernels/kernels.h"
#include "retroinfer/dtype.h"

namespace retroinfer {
namespace {

using cuda::DeviceBuffer;
namespace dt = cuda::detail;

struct KMeansCase {
  int heads, d;
  int64_t n;         // indexed tokens per head
  int seg_tokens;    // tokens per segment (the last one may be short)
  int tpc;           // tokens per cluster: max(1, ceil(L / tpc)) clusters per segment (kmeans.h)
  float spread;      // key noise around 8 centres (0: exact duplicates, many exact score ties)
};

// Workspace of one k-means run over the keys [idx_begin, idx_begin + n) of `heads` flat heads: the
// buffers, sizes and parameters of RetroLayer's runs (kmeans_run.h), over keys with NaN rows around.
struct Work : dt::KMeansRun {
  KMeansCase c;
  int64_t idx_begin = 3, stride = 0;
  std::vector<int> seg_t, seg_c;
  gputest::KvData kv;
  DeviceBuffer k, v;
  dt::KMeansKernelParams p;

  explicit Work(const KMeansCase& kc, uint64_t seed) : c(kc) {
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
    prepare(c.heads, c.d, idx_begin, c.n, seg_t, seg_c, nullptr);  // sets S, C, max_seg
    p = params(k.as<uint16_t>(), v.as<uint16_t>(), stride, c.heads, c.d);
  }
  std::string shape() const {
    return "H=" + std::to_string(c.heads) + " D=" + std::to_string(c.d) + " n=" + std::to_string(c.n) +
           " S=" + std::to_string(S) + " C=" + std::to_string(C) + " spread=" + std::to_string(c.spread);
  }
  size_t flat() const { return size_t(c.heads) * C; }
};

void check(cudaError_t e, const char* what) { ASSERT_EQ(e, cudaSuccess) << what << ": " << cudaGetErrorString(e); }

template <typename T>
std::vector<T> download_as(const DeviceBuffer& b, size_t count) {
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<T> h(count);
  b.download(h.data(), count * sizeof(T));
  return h;
}
// Raw bytes of a device buffer (bitwise comparisons: f32 / bf16 / int alike).
std::vector<uint8_t> bytes_of(const DeviceBuffer& b) { return download_as<uint8_t>(b, b.bytes()); }
void restore(DeviceBuffer& b, const std::vector<uint8_t>& h) { b.upload(h.data(), h.size()); }
// Count of differing `word`-byte words of the first `count` words.
int64_t differing(const void* a, const void* b, size_t count, size_t word) {
  int64_t n = 0;
  for (size_t i = 0; i < count; ++i)
    n += std::memcmp(static_cast<const uint8_t*>(a) + i * word, static_cast<const uint8_t*>(b) + i * word, word) != 0;
  return n;
}
template <typename T>
int64_t differing(const std::vector<T>& a, const std::vector<T>& b) {
  EXPECT_EQ(a.size(), b.size());
  return differing(a.data(), b.data(), std::min(a.size(), b.size()), sizeof(T));
}

// Single IEEE operations the compiler may not fuse (the kernels' __fmul_rn / __fadd_rn and their plain f32
// operations outside a multiply-add).
float mul_rn(float a, float b) {
  volatile float r = a * b;
  return r;
}
float add_rn(float a, float b) {
  volatile float r = a + b;
  return r;
}

// The kernels' per-row quantization on the host (the same IEEE operations: m = max |x|, inv = 127 / m,
// rint of x * inv; scale m / 127). Returns the scale.
float quantize_host(const float* x, int d, int8_t* q) {
  float mx = 0.0f;
  for (int i = 0; i < d; ++i) mx = std::max(mx, std::fabs(x[i]));
  const float inv = mx > 0.0f ? 127.0f / mx : 0.0f;
  for (int i = 0; i < d; ++i)
    q[i] = static_cast<int8_t>(
        static_cast<int>(std::min(127.0f, std::max(-127.0f, std::nearbyint(mul_rn(x[i], inv))))));
  return mx / 127.0f;
}

// ---- int8 operands, assignment and grouping ----

// The int8 operands made by kmeans_mean (keys) and the centroid writes (centroids) equal the host's
// quantization of the device's own f32 inputs (mean key, f32 centroids), element for element.
void check_q8_operands(Work& w) {
  const int H = w.c.heads, D = w.c.d;
  const int64_t n = w.c.n;
  const auto mean = download_as<float>(w.mean, size_t(H) * D);
  const auto kq = download_as<int8_t>(w.centred_q8, size_t(H) * n * D);
  const auto cf = download_as<float>(w.centroids, w.flat() * D);
  const auto cq = download_as<int8_t>(w.centroids_q8, w.flat() * D);
  const auto cs = download_as<float>(w.centroid_scale, w.flat());
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
  for (size_t r = 0; r < w.flat(); ++r) {
    const float s = quantize_host(&cf[r * D], D, q.data());
    bad_c += std::memcmp(&s, &cs[r], 4) != 0;
    for (int j = 0; j < D; ++j) bad_c += q[j] != cq[r * D + j];
  }
  EXPECT_EQ(bad_k, 0) << "int8 keys differing from the host quantization";
  EXPECT_EQ(bad_c, 0) << "int8 centroids / scales differing from the host quantization";
  EXPECT_GT(nonzero, int64_t(H) * n * D / 4) << "almost all-zero int8 keys: a vacuous comparison";
}

// The assignment equals the host argmax over the same int8 operands (exact int dot, f32(dot) * scale,
// first strict maximum in ascending cluster order), bit for bit; segment and global passes. Returns the
// count of tokens whose best two scores tie exactly (the ties-to-lowest-id rule at work).
int64_t check_assign(Work& w) {
  const int H = w.c.heads, D = w.c.d;
  const int64_t n = w.c.n;
  const auto kq = download_as<int8_t>(w.centred_q8, size_t(H) * n * D);
  const auto cq = download_as<int8_t>(w.centroids_q8, w.flat() * D);
  const auto cs = download_as<float>(w.centroid_scale, w.flat());
  int64_t ties = 0;
  for (bool global : {false, true}) {
    w.assignment.fill_bytes(0xff);
    w.sort_keys.fill_bytes(0xff);
    check(dt::kmeans_assign(w.p, global, nullptr), "assign");
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
    EXPECT_EQ(bad, 0) << (global ? "global" : "segment") << " pass: assignments differing from the host";
  }
  return ties;
}

// Counting-sort grouping (segment pass) against the radix sort: identical members and offsets; where a
// segment has more clusters than the counting sort holds, kmeans_group_pass falls back to the radix sort.
void check_group_count(Work& w) {
  check(dt::kmeans_assign(w.p, false, nullptr), "assign");
  w.members.fill_bytes(0xff);
  w.offsets.fill_bytes(0xff);
  check(dt::kmeans_group(w.p, nullptr), "group radix");
  const auto m_ref = bytes_of(w.members), o_ref = bytes_of(w.offsets);
  w.members.fill_bytes(0xff);
  w.offsets.fill_bytes(0xff);
  if (w.max_seg_c > dt::kGroupCountMaxBins) {
    EXPECT_EQ(dt::kmeans_group_segments(w.p, nullptr), cudaErrorInvalidValue);
    check(dt::kmeans_group_pass(w.p, false, nullptr), "group pass (fallback)");
  } else {
    check(dt::kmeans_group_segments(w.p, nullptr), "group count");
  }
  const size_t items = size_t(w.c.heads) * w.c.n;
  const auto m = bytes_of(w.members), o = bytes_of(w.offsets);
  EXPECT_EQ(std::memcmp(m.data(), m_ref.data(), items * 4), 0) << "members";
  EXPECT_EQ(std::memcmp(o.data(), o_ref.data(), (w.flat() + 1) * 4), 0) << "offsets";
}

const KMeansCase kCases[] = {
    {1, 128, 100, 64, 16, 0.5f},      // n < 256: segments of 64 + 36 tokens
    {1, 64, 100, 64, 16, 0.5f},
    {8, 128, 9192, 8192, 16, 0.5f},   // 512 clusters + a tail segment (63): C 575
    {2, 64, 9192, 8192, 16, 0.5f},
    {8, 64, 3000, 1000, 16, 0.5f},    // 63 clusters per segment
    {2, 128, 5000, 2048, 16, 0.0f},   // exact duplicate keys: exact score ties, empty clusters
    {3, 128, 300, 300, 5, 0.5f},      // 60 clusters, a partial CTA
    {1, 128, 20000, 8192, 8, 0.5f},   // 1024 clusters per segment: the counting sort's largest
    {1, 128, 9000, 8192, 7, 0.5f},    // 1171 clusters: past it (the radix sort takes the pass)
};

TEST(CudaKMeansKernels, Int8OperandsAssignmentAndGroupingExact) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 777;
  for (const auto& kc : kCases) {
    SCOPED_TRACE(testing::Message() << "heads=" << kc.heads << " d=" << kc.d << " n=" << kc.n << " seg="
                                    << kc.seg_tokens << " tpc=" << kc.tpc << " spread=" << kc.spread);
    Work w(kc, seed++);
    w.centred_q8.fill_bytes(0x55);
    w.centroids_q8.fill_bytes(0x55);
    w.centroid_scale.fill_bytes(0xff);
    check(dt::kmeans_mean(w.p, nullptr), "mean");
    check(dt::kmeans_init(w.p, nullptr), "init");
    check_q8_operands(w);
    int64_t ties = check_assign(w);  // initial centroids
    check_group_count(w);
    check(dt::kmeans_update(w.p, true, nullptr), "update");  // iterated centroids (from the count grouping)
    check_q8_operands(w);
    ties += check_assign(w);
    check_group_count(w);
    std::printf("[kmeans int8] %s: operands, assignments and grouping exact (%lld exact ties)\n", w.shape().c_str(),
                static_cast<long long>(ties));
  }
}

// ---- update and finalize ----

// The centroid buffers (f32, bf16, int8 and scales) on the host.
struct Centroids {
  std::vector<float> f32, scale;
  std::vector<uint16_t> bf16;
  std::vector<int8_t> q8;
};
Centroids download_centroids(Work& w) {
  const size_t rows = w.flat(), D = size_t(w.c.d);
  return {download_as<float>(w.centroids, rows * D), download_as<float>(w.centroid_scale, rows),
          download_as<uint16_t>(w.centroids_bf16, rows * D), download_as<int8_t>(w.centroids_q8, rows * D)};
}
// kmeans.cu store_centroid: row r = c, its bf16 copy, its int8 copy and scale.
void store_centroid(Centroids& out, size_t r, const float* c, int D) {
  for (int j = 0; j < D; ++j) {
    out.f32[r * D + j] = c[j];
    out.bf16[r * D + j] = f32_to_bf16(c[j]);
  }
  out.scale[r] = quantize_host(c, D, &out.q8[r * D]);
}
int64_t differing(const Centroids& a, const Centroids& b) {
  return differing(a.f32, b.f32) + differing(a.scale, b.scale) + differing(a.bf16, b.bf16) + differing(a.q8, b.q8);
}

// Per flat cluster: the members (from the device's grouping) and the f32 sums of their centred keys and of
// their values, in ascending member order (kmeans.cu member_sum: s += x - shift per dimension).
struct MemberSums {
  std::vector<int> count;
  std::vector<float> keys, values;  // [H * C, D]
};
MemberSums member_sums(Work& w) {
  const int H = w.c.heads, D = w.c.d;
  const auto mean = download_as<float>(w.mean, size_t(H) * D);
  const auto off = download_as<int32_t>(w.offsets, w.flat() + 1);
  const auto mem = download_as<uint32_t>(w.members, size_t(H) * w.c.n);
  MemberSums ms;
  ms.count.assign(w.flat(), 0);
  ms.keys.assign(w.flat() * D, 0.0f);
  ms.values.assign(w.flat() * D, 0.0f);
  for (size_t hc = 0; hc < w.flat(); ++hc) {
    const int h = static_cast<int>(hc / w.C);
    ms.count[hc] = off[hc + 1] - off[hc];
    for (int i = off[hc]; i < off[hc + 1]; ++i) {
      const int64_t t = w.idx_begin + mem[i];
      for (int j = 0; j < D; ++j) {
        float& sk = ms.keys[hc * D + j];
        sk = add_rn(sk, w.kv.key(h, t, j) - mean[size_t(h) * D + j]);
        float& sv = ms.values[hc * D + j];
        sv = add_rn(sv, w.kv.value(h, t, j) - 0.0f);
      }
    }
  }
  return ms;
}

// kmeans.cu update_centroid on the host: spherical = the sum over its L2 norm (squares accumulated per lane
// by multiply-adds over the dims lane + 32 j, then the lanes summed in warp_sum's butterfly order), else
// the mean; an empty cluster or a zero spherical sum keeps its centroid.
Centroids host_update(const Centroids& before, const MemberSums& ms, int D, bool spherical) {
  Centroids out = before;
  std::vector<float> c(D);
  for (size_t r = 0; r < ms.count.size(); ++r) {
    const int n = ms.count[r];
    if (n == 0) continue;
    const float* s = &ms.keys[r * D];
    float inv;
    if (spherical) {
      float lane[32];
      for (int l = 0; l < 32; ++l) {
        float ss = 0.0f;
        for (int j = 0; l + 32 * j < D; ++j) ss = std::fma(s[l + 32 * j], s[l + 32 * j], ss);
        lane[l] = ss;
      }
      for (int o = 16; o > 0; o >>= 1) {
        float next[32];
        for (int l = 0; l < 32; ++l) next[l] = add_rn(lane[l], lane[l ^ o]);
        std::copy(next, next + 32, lane);
      }
      if (!(lane[0] > 0.0f)) continue;
      inv = 1.0f / std::sqrt(lane[0]);
    } else {
      inv = 1.0f / static_cast<float>(n);
    }
    for (int j = 0; j < D; ++j) c[j] = mul_rn(s[j], inv);
    store_centroid(out, r, c.data(), D);
  }
  return out;
}

// The finalize's outputs on the host (kmeans.cu finalize_kernel): value sums and their bf16 copies, sizes,
// de-centred centroids (after the fused plain-mean update when with_mean) and their bf16 copies.
struct Final {
  std::vector<float> value_sums, centroids;
  std::vector<uint16_t> value_sums_bf16, centroids_bf16;
  std::vector<int32_t> sizes;
};
Final download_final(Work& w) {
  const size_t rows = w.flat(), D = size_t(w.c.d);
  return {download_as<float>(w.value_sums, rows * D), download_as<float>(w.centroids, rows * D),
          download_as<uint16_t>(w.value_sums_bf16, rows * D), download_as<uint16_t>(w.centroids_bf16, rows * D),
          download_as<int32_t>(w.sizes, rows)};
}
Final host_finalize(const std::vector<float>& centred, const MemberSums& ms, const std::vector<float>& mean, int C,
                    int D, bool with_mean) {
  Final f;
  const size_t rows = ms.count.size();
  f.value_sums = ms.values;
  f.centroids.resize(rows * D);
  f.value_sums_bf16.resize(rows * D);
  f.centroids_bf16.resize(rows * D);
  f.sizes = ms.count;
  for (size_t r = 0; r < rows; ++r) {
    const size_t h = r / C;
    const int n = ms.count[r];
    const float inv = n > 0 ? 1.0f / static_cast<float>(n) : 0.0f;
    for (int j = 0; j < D; ++j) {
      const size_t at = r * D + j;
      const float mu = mean[h * D + j];
      const float c = with_mean && n > 0 ? add_rn(mul_rn(ms.keys[at], inv), mu) : add_rn(centred[at], mu);
      f.centroids[at] = c;
      f.centroids_bf16[at] = f32_to_bf16(c);
      f.value_sums_bf16[at] = f32_to_bf16(f.value_sums[at]);
    }
  }
  return f;
}
int64_t differing(const Final& a, const Final& b, std::string& which) {
  const int64_t d[] = {differing(a.value_sums, b.value_sums), differing(a.value_sums_bf16, b.value_sums_bf16),
                       differing(a.sizes, b.sizes), differing(a.centroids, b.centroids),
                       differing(a.centroids_bf16, b.centroids_bf16)};
  const char* names[] = {"value_sums", "value_sums_bf16", "sizes", "centroids", "centroids_bf16"};
  int64_t total = 0;
  for (int i = 0; i < 5; ++i) {
    if (d[i] != 0) which += std::string(" ") + names[i] + " " + std::to_string(d[i]);
    total += d[i];
  }
  return total;
}

void poison_centroids(Work& w) {
  for (auto* b : {&w.centroids, &w.centroids_bf16, &w.centroids_q8, &w.centroid_scale}) b->fill_bytes(0xff);
}
void restore_centroids(Work& w, const std::vector<std::vector<uint8_t>>& saved) {
  DeviceBuffer* bufs[] = {&w.centroids, &w.centroids_bf16, &w.centroids_q8, &w.centroid_scale};
  for (int i = 0; i < 4; ++i) restore(*bufs[i], saved[i]);
}
std::vector<std::vector<uint8_t>> save_centroids(Work& w) {
  return {bytes_of(w.centroids), bytes_of(w.centroids_bf16), bytes_of(w.centroids_q8), bytes_of(w.centroid_scale)};
}

TEST(CudaKMeansKernels, UpdateAndFinalizeMatchHost) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 901;
  for (const auto& kc : kCases) {
    SCOPED_TRACE(testing::Message() << "heads=" << kc.heads << " d=" << kc.d << " n=" << kc.n << " seg="
                                    << kc.seg_tokens << " tpc=" << kc.tpc << " spread=" << kc.spread);
    Work w(kc, seed++);
    const int D = kc.d;
    check(dt::kmeans_mean(w.p, nullptr), "mean");
    check(dt::kmeans_init(w.p, nullptr), "init");
    // One spherical iteration first, so that the comparisons start from iterated centroids.
    check(dt::kmeans_assign(w.p, false, nullptr), "assign");
    check(dt::kmeans_group_pass(w.p, false, nullptr), "group");
    check(dt::kmeans_update(w.p, true, nullptr), "update");
    int64_t empty = 0, bad_update = 0;
    for (bool global : {false, true}) {
      check(dt::kmeans_assign(w.p, global, nullptr), "assign");
      check(dt::kmeans_group_pass(w.p, global, nullptr), "group");
      const MemberSums ms = member_sums(w);
      const auto saved = save_centroids(w);
      const Centroids before = download_centroids(w);
      for (bool spherical : {true, false}) {
        restore_centroids(w, saved);
        check(dt::kmeans_update(w.p, spherical, nullptr), "update");
        const Centroids got = download_centroids(w);
        const int64_t d = differing(got, host_update(before, ms, D, spherical));
        EXPECT_EQ(d, 0) << (spherical ? "spherical" : "mean") << " update after a " << (global ? "global" : "segment")
                        << " pass differing from the host";
        bad_update += d;
        if (!spherical) {  // the plain mean of centred keys replaces unit centroids: it must change them
          EXPECT_NE(differing(got.f32, before.f32), 0) << "the update changed nothing: a vacuous comparison";
        }
      }
      empty += std::count(ms.count.begin(), ms.count.end(), 0);
      restore_centroids(w, saved);
    }
    // Finalize from the spherical update's centroids (after the global pass's grouping), without and with
    // the fused plain-mean update; then the fused one against the separate update + finalize.
    check(dt::kmeans_update(w.p, true, nullptr), "update");
    const MemberSums ms = member_sums(w);
    const auto mean = download_as<float>(w.mean, size_t(kc.heads) * D);
    const auto saved = save_centroids(w);
    const std::vector<float> centred = download_as<float>(w.centroids, w.flat() * D);
    std::vector<Final> finals;
    for (bool with_mean : {false, true}) {
      restore_centroids(w, saved);
      for (auto* b : {&w.value_sums, &w.value_sums_bf16, &w.sizes}) b->fill_bytes(0xff);
      check(dt::kmeans_finalize(w.p, nullptr, with_mean), "finalize");
      finals.push_back(download_final(w));
      std::string which;
      EXPECT_EQ(differing(finals.back(), host_finalize(centred, ms, mean, w.C, D, with_mean), which), 0)
          << "finalize" << (with_mean ? " with the mean update" : "") << " differing from the host:" << which;
    }
    EXPECT_NE(differing(finals[0].centroids, finals[1].centroids), 0) << "the fused mean changed nothing: vacuous";
    restore_centroids(w, saved);
    for (auto* b : {&w.value_sums, &w.value_sums_bf16, &w.sizes}) b->fill_bytes(0xff);
    check(dt::kmeans_update(w.p, false, nullptr), "update mean");
    check(dt::kmeans_finalize(w.p, nullptr), "finalize");
    std::string which;
    EXPECT_EQ(differing(download_final(w), finals[1], which), 0) << "update + finalize against the fused one:" << which;
    std::printf("[kmeans update] %s: updates (4 per case, %lld empty clusters) and finalizes exact (%lld differing)\n",
                w.shape().c_str(), static_cast<long long>(empty), static_cast<long long>(bad_update));
  }
}

// KMeansRun::run (the counting-sort grouping where it fits, the last mean update fused into the finalize)
// against the same algorithm launched step by step with the radix grouping and a separate update: the same
// outputs bit for bit.
TEST(CudaKMeansKernels, RunEqualsStepByStep) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 31;
  for (const auto& kc : kCases) {
    SCOPED_TRACE(testing::Message() << "heads=" << kc.heads << " d=" << kc.d << " n=" << kc.n);
    Work w(kc, seed++);
    AttentionConfig cfg;
    cfg.kmeans_segment_iters = 3;
    cfg.kmeans_global_iters = 1;
    auto outputs = [&] {
      return std::vector<std::vector<uint8_t>>{bytes_of(w.assignment), bytes_of(w.members), bytes_of(w.offsets),
                                               bytes_of(w.sizes), bytes_of(w.centroids), bytes_of(w.centroids_bf16),
                                               bytes_of(w.value_sums), bytes_of(w.value_sums_bf16)};
    };
    auto poison = [&] {
      poison_centroids(w);
      for (auto* b : {&w.value_sums, &w.value_sums_bf16, &w.sizes, &w.assignment, &w.members, &w.offsets})
        b->fill_bytes(0xff);
    };
    poison();
    w.run(w.k.as<uint16_t>(), w.v.as<uint16_t>(), w.stride, kc.heads, kc.d, cfg, w.idx_begin, kc.n, w.seg_t, w.seg_c,
          nullptr);
    const auto got = outputs();
    poison();
    check(dt::kmeans_mean(w.p, nullptr), "mean");
    check(dt::kmeans_init(w.p, nullptr), "init");
    for (int it = 0; it < cfg.kmeans_segment_iters; ++it) {
      check(dt::kmeans_assign(w.p, false, nullptr), "assign");
      check(dt::kmeans_group(w.p, nullptr), "group");
      check(dt::kmeans_update(w.p, true, nullptr), "update");
    }
    check(dt::kmeans_assign(w.p, true, nullptr), "assign global");
    check(dt::kmeans_group(w.p, nullptr), "group");
    check(dt::kmeans_update(w.p, false, nullptr), "update mean");
    check(dt::kmeans_finalize(w.p, nullptr), "finalize");
    const auto ref = outputs();
    const char* names[] = {"assignment", "members", "offsets", "sizes", "centroids", "centroids_bf16", "value_sums",
                           "value_sums_bf16"};
    int64_t total = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const int64_t d = differing(got[i], ref[i]);
      EXPECT_EQ(d, 0) << names[i];
      total += d;
    }
    std::printf("[kmeans run] %s: 3 + 1 iterations, %lld bytes differing from the step-by-step run\n",
                w.shape().c_str(), static_cast<long long>(total));
  }
}

// The launchers refuse a head_dim other than 64 / 128, missing int8 operands and, for the counting sort,
// segments of more clusters than it holds, before any launch.
TEST(CudaKMeansKernels, LaunchersRefuseBadArguments) {
  RETROINFER_REQUIRE_GPU();
  Work w({1, 128, 100, 64, 16, 0.5f}, 5);
  dt::KMeansKernelParams p = w.p;
  p.head_dim = 96;
  EXPECT_EQ(dt::kmeans_mean(p, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(dt::kmeans_init(p, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(dt::kmeans_assign(p, false, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(dt::kmeans_update(p, true, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(dt::kmeans_finalize(p, nullptr), cudaErrorInvalidValue);
  p = w.p;
  p.centred_q8 = nullptr;
  EXPECT_EQ(dt::kmeans_mean(p, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(dt::kmeans_assign(p, true, nullptr), cudaErrorInvalidValue);
  p = w.p;
  p.centroids_q8 = nullptr;
  EXPECT_EQ(dt::kmeans_init(p, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(dt::kmeans_assign(p, false, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(dt::kmeans_update(p, false, nullptr), cudaErrorInvalidValue);
  p = w.p;
  p.centroid_scale = nullptr;
  EXPECT_EQ(dt::kmeans_update(p, true, nullptr), cudaErrorInvalidValue);
  p = w.p;
  p.max_seg_clusters = dt::kGroupCountMaxBins + 1;  // the counting sort refuses more bins than it holds
  EXPECT_EQ(dt::kmeans_group_segments(p, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // nothing was launched
}

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
