// The wave buffer's compressed stores (WaveBufferConfig::store_dtype = kInt8 or kInt4, docs/wave-buffer.md
// "Compressed store"). For the int8 store:
//   kernels  the store fill quantises every member row exactly as the CPU reference (core/row_quant.h:
//            same int8 bytes, same f32 scales, bit for bit), and the gather widens a planted int8 store
//            (random bytes and scales in pinned host memory) into exactly the reference's bf16 values,
//            every execution-buffer row written, steady rows copied unchanged; cluster sizes with tails
//            (1 .. 129 rows, across the 32-row scale groups), head_dim 64 and 128;
//   layer    an int8-store WaveBufferLayer selects what the bf16-store layer selects (same hit / miss
//            counts every step: the index is built from the bf16 rows either way) and its outputs stay
//            within the quantisation's bound of the bf16 store's; a cache that holds everything gives the
//            all-miss step's output again bit for bit from the cache (the pages hold the widened rows);
//            the host bytes are 264 / 512 of the bf16 store's;
//   session  a kHost session of a small random model with an int8 store decodes within a stated bound of
//            the same session with a bf16 store.
// The int4 store (a bf16 scale per 32 values of the row minus its cluster's mean) gets the same four checks:
// fill (base rows included) and gather bit for bit against core/row_quant.h's int4 functions, its layer
// selecting as the bf16 one within a wider bound (15 levels a group), its cached rows the widened rows, its host
// bytes 144 / 512 of bf16's, its session near bf16's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "buffer/cuda/pinned_host.h"
#include "core/row_quant.h"
#include "cuda_model_test_util.h"
#include "gpu_test_util.h"
#include "kernels/wave_buffer_kernels.h"
#include "retroinfer/cuda_model.h"
#include "retroinfer/model.h"
#include "retroinfer/sampler.h"
#include "retroinfer/wave_buffer.h"

namespace retroinfer {
namespace {

std::vector<uint16_t> download_u16(const cuda::DeviceBuffer& b, size_t count) {
  std::vector<uint16_t> out(count);
  b.download(out.data(), count * 2);
  return out;
}

// One head layout for the kernel tests: H heads, clusters of the sizes below, members a shuffled identity.
struct StoreRig {
  int H = 2, D = 128;
  std::vector<int> sizes_one = {1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 40, 127, 129};
  int C = 0;
  int64_t n_idx = 0, kv_stride = 0, idx_begin = 3;
  std::vector<int32_t> sizes, offsets;  // [H, C], [H, C + 1]
  std::vector<int64_t> store_at;        // [H, C]
  std::vector<uint32_t> members;        // [H, n_idx]
  std::vector<uint16_t> k, v;           // [H, kv_stride, D]
  StoreRig(int d, uint64_t seed) : D(d) {
    C = static_cast<int>(sizes_one.size());
    n_idx = std::accumulate(sizes_one.begin(), sizes_one.end(), int64_t{0});
    kv_stride = idx_begin + n_idx + 2;
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    k.resize(size_t(H) * kv_stride * D);
    v.resize(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      // A few outlier channels in K (x 20), as real keys have.
      const bool outlier = (i % D) == 5 || (i % D) == 77 % D;
      k[i] = f32_to_bf16(nd(rng) * (outlier ? 20.0f : 1.0f));
      v[i] = f32_to_bf16(nd(rng));
    }
    for (int h = 0; h < H; ++h) {
      int64_t o = 0;
      for (int c = 0; c < C; ++c) {
        sizes.push_back(sizes_one[c]);
        offsets.push_back(static_cast<int32_t>(o));
        store_at.push_back(h * n_idx + o);
        o += sizes_one[c];
      }
      offsets.push_back(static_cast<int32_t>(o));
      std::vector<uint32_t> perm(n_idx);
      std::iota(perm.begin(), perm.end(), 0u);
      std::shuffle(perm.begin(), perm.end(), rng);
      members.insert(members.end(), perm.begin(), perm.end());
    }
  }
  int64_t rows() const { return int64_t{H} * n_idx; }
};

// Runs the store fill over the rig into a pinned store of `bytes` (every byte a sentinel first, so each must
// be rewritten), its pointers set by point(params, device base). Then row_ok(src, row, host base, h, c, kv)
// checks each member row (src: its bf16 K or V row, row: its store row, at * 2 + kv * s + i, of cluster c of
// head h); returns the rows it rejected, the first 5 reported.
template <typename Point, typename RowOk>
int64_t fill_and_check(const StoreRig& r, size_t bytes, Point point, RowOk row_ok) {
  const int d = r.D;
  auto dk = gputest::upload(r.k), dv = gputest::upload(r.v);
  auto dsz = gputest::upload(r.sizes), doff = gputest::upload(r.offsets), dat = gputest::upload(r.store_at);
  auto dmem = gputest::upload(r.members);
  cuda::PinnedHost store(bytes);
  std::memset(store.host(), 0x5a, bytes);
  cuda::detail::StoreFillParams p;
  p.t.num_heads = r.H;
  p.t.head_dim = d;
  p.t.num_clusters = r.C;
  p.t.n_idx = r.n_idx;
  p.t.sizes = dsz.as<int>();
  p.t.offsets = doff.as<int>();
  p.t.store_at = dat.as<int64_t>();
  point(p, static_cast<char*>(store.device()));
  p.k = dk.as<uint16_t>();
  p.v = dv.as<uint16_t>();
  p.kv_stride = r.kv_stride;
  p.idx_begin = r.idx_begin;
  p.members = dmem.as<uint32_t>();
  EXPECT_EQ(cuda::detail::wave_store_fill(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  int64_t mismatches = 0;
  for (int h = 0; h < r.H; ++h)
    for (int c = 0; c < r.C; ++c) {
      const int s = r.sizes[size_t(h) * r.C + c];
      const int64_t at = r.store_at[size_t(h) * r.C + c];
      for (int kv = 0; kv < 2; ++kv)
        for (int i = 0; i < s; ++i) {
          const uint32_t tok = r.members[size_t(h) * r.n_idx + r.offsets[size_t(h) * (r.C + 1) + c] + i];
          const uint16_t* src = (kv ? r.v : r.k).data() + (size_t(h) * r.kv_stride + r.idx_begin + tok) * d;
          if (!row_ok(src, at * 2 + int64_t{kv} * s + i, static_cast<const char*>(store.host()), h, c, kv) &&
              ++mismatches <= 5)
            ADD_FAILURE() << "head " << h << " cluster " << c << (kv ? " V" : " K") << " row " << i;
        }
    }
  return mismatches;
}

// Plants a store of `bytes` in pinned memory (plant(host base, rng)), then gathers every cluster of the rig as a
// miss, in ascending order after 5 steady rows, with the store's pointers set by point(tables, device base).
// Every execution-buffer row must then be: the steady row copied; a cluster row equal to widen(row, host base,
// want, h, c, kv) for its store row (at * 2 + kv * s + i, of cluster c of head h); a row past those in use
// untouched. Returns the mismatches.
template <typename Plant, typename Point, typename Widen>
int64_t gather_and_check(const StoreRig& r, size_t bytes, uint64_t seed, Plant plant, Point point, Widen widen) {
  const int d = r.D;
  std::mt19937_64 rng(seed);
  cuda::PinnedHost store(bytes);
  plant(static_cast<char*>(store.host()), rng);
  const int steady = 5;  // rows [0, 5) of each head from the steady zone
  const int K = r.C;     // every cluster retrieved, every one a miss; ascending ids
  std::vector<int32_t> ids(size_t(r.H) * K), seg_row(size_t(r.H) * K);
  std::vector<uint8_t> seg_hit(size_t(r.H) * K, 0);
  for (int h = 0; h < r.H; ++h) {
    int row = steady;
    for (int j = 0; j < K; ++j) {
      ids[size_t(h) * K + j] = j;
      seg_row[size_t(h) * K + j] = row;
      row += r.sizes[size_t(h) * r.C + j];
    }
  }
  const int64_t cap = steady + r.n_idx + 3;  // 3 rows past the end stay sentinels
  std::vector<uint16_t> sk(size_t(r.H) * steady * d), sv(sk.size());
  for (size_t i = 0; i < sk.size(); ++i) {
    sk[i] = static_cast<uint16_t>(rng() & 0x7f7f);
    sv[i] = static_cast<uint16_t>(rng() & 0x7f7f);
  }
  auto dsk = gputest::upload(sk), dsv = gputest::upload(sv);
  auto dids = gputest::upload(ids), drow = gputest::upload(seg_row), dhit = gputest::upload(seg_hit);
  auto dsz = gputest::upload(r.sizes), dat = gputest::upload(r.store_at);
  cuda::DeviceBuffer ek(size_t(r.H) * cap * d * 2), ev(size_t(r.H) * cap * d * 2);
  ek.fill_bytes(0xff);
  ev.fill_bytes(0xff);
  cuda::detail::WaveGatherParams p;
  p.t.num_heads = r.H;
  p.t.head_dim = d;
  p.t.num_clusters = r.C;
  p.t.n_idx = r.n_idx;
  p.t.sizes = dsz.as<int>();
  p.t.store_at = dat.as<int64_t>();
  point(p.t, static_cast<const char*>(store.device()));
  p.t.exec_k = ek.as<uint16_t>();
  p.t.exec_v = ev.as<uint16_t>();
  p.t.exec_cap = cap;
  p.retrieval_ids = dids.as<int>();
  p.seg_row = drow.as<int>();
  p.seg_hit = dhit.as<uint8_t>();
  p.k = K;
  p.steady_k = dsk.as<uint16_t>();
  p.steady_v = dsv.as<uint16_t>();
  p.steady_cap = steady;
  p.steady_rows = steady;
  EXPECT_EQ(cuda::detail::wave_gather(p, nullptr), cudaSuccess);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto gk = download_u16(ek, size_t(r.H) * cap * d), gv = download_u16(ev, size_t(r.H) * cap * d);
  const auto* host = static_cast<const char*>(store.host());
  int64_t mismatches = 0;
  std::vector<uint16_t> want(d);
  for (int h = 0; h < r.H; ++h) {
    for (int kv = 0; kv < 2; ++kv) {
      const auto& got = kv ? gv : gk;
      const auto& st = kv ? sv : sk;
      for (int i = 0; i < steady; ++i)
        mismatches += std::memcmp(got.data() + (size_t(h) * cap + i) * d, st.data() + (size_t(h) * steady + i) * d,
                                  size_t(d) * 2) != 0;
      for (int c = 0; c < r.C; ++c) {
        const int s = r.sizes[size_t(h) * r.C + c];
        const int64_t at = r.store_at[size_t(h) * r.C + c];
        for (int i = 0; i < s; ++i) {
          widen(at * 2 + int64_t{kv} * s + i, host, want.data(), h, c, kv);
          const uint16_t* g = got.data() + (size_t(h) * cap + seg_row[size_t(h) * K + c] + i) * d;
          if (std::memcmp(g, want.data(), size_t(d) * 2) != 0 && ++mismatches <= 5)
            ADD_FAILURE() << "head " << h << " cluster " << c << (kv ? " V" : " K") << " row " << i;
        }
      }
      for (int64_t i = steady + r.n_idx; i < cap; ++i)  // past the rows in use: untouched
        for (int e = 0; e < d; ++e) mismatches += got[(size_t(h) * cap + i) * d + e] != 0xffff;
    }
  }
  return mismatches;
}

// The store fill quantises each member row as int8_quantize_row does: bytes and scales bit for bit.
TEST(WaveStoreInt8, FillQuantisesAsTheCpuReference) {
  RETROINFER_REQUIRE_GPU();
  for (int d : {64, 128}) {
    SCOPED_TRACE(testing::Message() << "D " << d << " seed 31");
    const StoreRig r(d, 31);
    const size_t data_bytes = size_t(r.rows()) * 2 * d;  // then the f32 row scales (0x5a5a5a5a is not one)
    std::vector<int8_t> want(d);
    const int64_t bad = fill_and_check(
        r, data_bytes + size_t(r.rows()) * 8,
        [&](cuda::detail::StoreFillParams& p, char* base) {
          p.t.store_q8 = p.store_q8 = reinterpret_cast<int8_t*>(base);
          p.t.store_scale = p.store_scale = reinterpret_cast<float*>(base + data_bytes);
        },
        [&](const uint16_t* src, int64_t row, const char* base, int, int, int) {
          const float ws = int8_quantize_row(src, d, want.data());
          const float gs = reinterpret_cast<const float*>(base + data_bytes)[row];
          return std::memcmp(&ws, &gs, 4) == 0 && std::memcmp(want.data(), base + row * d, size_t(d)) == 0;
        });
    EXPECT_EQ(bad, 0);
  }
}

// The gather widens a planted int8 store (random bytes in [-127, 127], random scales, pinned host memory)
// into the reference's bf16 values bit for bit; steady rows are copied; every row in use is written.
TEST(WaveStoreInt8, GatherWidensAPlantedStoreExactly) {
  RETROINFER_REQUIRE_GPU();
  for (int d : {64, 128}) {
    SCOPED_TRACE(testing::Message() << "D " << d << " seed 47");
    const StoreRig r(d, 47);
    const size_t data_bytes = size_t(r.rows()) * 2 * d;
    const int64_t bad = gather_and_check(
        r, data_bytes + size_t(r.rows()) * 8, 47,
        [&](char* base, std::mt19937_64& rng) {
          std::uniform_int_distribution<int> ub(-127, 127);
          std::uniform_real_distribution<float> us(1e-4f, 0.5f);
          for (size_t i = 0; i < data_bytes; ++i) base[i] = static_cast<char>(ub(rng));
          auto* scl = reinterpret_cast<float*>(base + data_bytes);
          for (int64_t i = 0; i < r.rows() * 2; ++i) scl[i] = us(rng);
        },
        [&](cuda::detail::WaveTables& t, const char* base) {
          t.store_q8 = reinterpret_cast<const int8_t*>(base);
          t.store_scale = reinterpret_cast<const float*>(base + data_bytes);
        },
        [&](int64_t row, const char* base, uint16_t* want, int, int, int) {
          int8_widen_row(reinterpret_cast<const int8_t*>(base) + row * d,
                         reinterpret_cast<const float*>(base + data_bytes)[row], d, want);
        });
    EXPECT_EQ(bad, 0);
  }
}

// ---- int4 kernels ----

// The member rows of cluster c of head h, K (kv = 0) or V, in cluster order: what the fill's base row is the
// mean of.
std::vector<uint16_t> cluster_rows(const StoreRig& r, int h, int c, int kv) {
  const int s = r.sizes[size_t(h) * r.C + c];
  std::vector<uint16_t> out(size_t(s) * r.D);
  for (int i = 0; i < s; ++i) {
    const uint32_t tok = r.members[size_t(h) * r.n_idx + r.offsets[size_t(h) * (r.C + 1) + c] + i];
    const uint16_t* src = (kv ? r.v : r.k).data() + (size_t(h) * r.kv_stride + r.idx_begin + tok) * r.D;
    std::copy(src, src + r.D, out.begin() + size_t(i) * r.D);
  }
  return out;
}

// The store fill writes each cluster's K and V base rows as int4_base_row does (into its columns of a wider
// base array, the others untouched) and quantises each member row minus its base as int4_quantize_row does:
// bases, nibbles and group scales bit for bit.
TEST(WaveStoreInt4, FillQuantisesAsTheCpuReference) {
  RETROINFER_REQUIRE_GPU();
  for (int d : {64, 128}) {
    SCOPED_TRACE(testing::Message() << "D " << d << " seed 37");
    const StoreRig r(d, 37);
    const int G = d / kInt4Group;
    const size_t data_bytes = size_t(r.rows()) * d, bytes = data_bytes + size_t(r.rows()) * 2 * G * 2;
    ASSERT_EQ(bytes, size_t(r.rows()) * size_t(store_token_bytes(StoreDtype::kInt4, d)));
    // The rig's clusters as columns [2, 2 + C) of C + 3 per head, as an index update's block is.
    const int stride = r.C + 3, col0 = 2;
    const size_t base_elems = size_t(r.H) * stride * 2 * d;
    cuda::DeviceBuffer dbase(base_elems * 2);
    dbase.fill_bytes(0x7f);
    std::vector<uint16_t> want_base(size_t(r.H) * r.C * 2 * d);
    for (int h = 0; h < r.H; ++h)
      for (int c = 0; c < r.C; ++c)
        for (int kv = 0; kv < 2; ++kv)
          int4_base_row(cluster_rows(r, h, c, kv).data(), r.sizes[size_t(h) * r.C + c], d,
                        want_base.data() + ((size_t(h) * r.C + c) * 2 + kv) * d);
    std::vector<uint8_t> want(d / 2);
    std::vector<uint16_t> want_scl(G);
    const int64_t bad = fill_and_check(
        r, bytes,
        [&](cuda::detail::StoreFillParams& p, char* base) {
          p.t.store_q4 = p.store_q4 = reinterpret_cast<uint8_t*>(base);
          p.t.store_group_scale = p.store_group_scale = reinterpret_cast<uint16_t*>(base + data_bytes);
          p.store_base = dbase.as<uint16_t>();
          p.base_stride = stride;
          p.base_col0 = col0;
        },
        [&](const uint16_t* src, int64_t row, const char* base, int h, int c, int kv) {
          int4_quantize_row(src, d, want.data(), want_scl.data(),
                            want_base.data() + ((size_t(h) * r.C + c) * 2 + kv) * d);
          const auto* scl = reinterpret_cast<const uint16_t*>(base + data_bytes);
          return std::memcmp(want_scl.data(), scl + row * G, size_t(G) * 2) == 0 &&
                 std::memcmp(want.data(), base + row * (d / 2), size_t(d / 2)) == 0;
        });
    EXPECT_EQ(bad, 0);
    const auto got_base = download_u16(dbase, base_elems);
    int64_t bad_base = 0;
    for (int h = 0; h < r.H; ++h)
      for (int col = 0; col < stride; ++col)
        for (int e = 0; e < 2 * d; ++e) {
          const uint16_t g = got_base[(size_t(h) * stride + col) * 2 * d + e];
          const int c = col - col0;
          const uint16_t w = c >= 0 && c < r.C ? want_base[(size_t(h) * r.C + c) * 2 * d + e] : uint16_t{0x7f7f};
          bad_base += g != w;
        }
    EXPECT_EQ(bad_base, 0) << "base elements differing from int4_base_row (or written outside the view's columns)";
  }
}

// The gather widens a planted int4 store (random nibbles, -8 included, random bf16 scales, pinned host memory,
// random base rows in device memory) into the reference's bf16 values bit for bit; steady rows are copied; rows
// past those in use are untouched.
TEST(WaveStoreInt4, GatherWidensAPlantedStoreExactly) {
  RETROINFER_REQUIRE_GPU();
  for (int d : {64, 128}) {
    SCOPED_TRACE(testing::Message() << "D " << d << " seed 53");
    const StoreRig r(d, 53);
    const int G = d / kInt4Group;
    const size_t data_bytes = size_t(r.rows()) * d;
    // Random base rows (bf16 of N(0, 4), a few large as real keys' offsets) for every cluster's K and V.
    std::mt19937_64 brng(59);
    std::normal_distribution<float> nd(0.0f, 2.0f);
    std::vector<uint16_t> planted_base(size_t(r.H) * r.C * 2 * d);
    for (size_t i = 0; i < planted_base.size(); ++i) planted_base[i] = f32_to_bf16(nd(brng) * (i % 17 == 0 ? 30.0f : 1.0f));
    auto dbase = gputest::upload(planted_base);
    const int64_t bad = gather_and_check(
        r, data_bytes + size_t(r.rows()) * 2 * G * 2, 53,
        [&](char* base, std::mt19937_64& rng) {
          std::uniform_real_distribution<float> us(1e-4f, 0.5f);
          for (size_t i = 0; i < data_bytes; ++i) base[i] = static_cast<char>(rng());
          auto* scl = reinterpret_cast<uint16_t*>(base + data_bytes);
          for (int64_t i = 0; i < r.rows() * 2 * G; ++i) scl[i] = f32_to_bf16(us(rng));
        },
        [&](cuda::detail::WaveTables& t, const char* base) {
          t.store_q4 = reinterpret_cast<const uint8_t*>(base);
          t.store_group_scale = reinterpret_cast<const uint16_t*>(base + data_bytes);
          t.store_base = dbase.as<uint16_t>();
        },
        [&](int64_t row, const char* base, uint16_t* want, int h, int c, int kv) {
          int4_widen_row(reinterpret_cast<const uint8_t*>(base) + row * (d / 2),
                         reinterpret_cast<const uint16_t*>(base + data_bytes) + row * G, d, want,
                         planted_base.data() + ((size_t(h) * r.C + c) * 2 + kv) * d);
        });
    EXPECT_EQ(bad, 0);
  }
}

// q drifting by a random walk: temporal locality, as in a decode.
std::vector<float> drift(const std::vector<float>& q, float step, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> out(q);
  for (auto& x : out) x += step * nd(rng);
  return out;
}

struct LayerRig {
  int num_seqs = 2, hkv = 2, group = 4, d = 128;
  int64_t n = 6000;
  AttentionConfig cfg;
  gputest::KvData kv;
  cuda::DeviceBuffer dk, dv;
  explicit LayerRig(uint64_t seed) {
    cfg.retrieval_fraction = 0.05;
    kv = gputest::make_kv(num_seqs * hkv, n, n + 5, d, seed);
    dk = gputest::upload(kv.k);
    dv = gputest::upload(kv.v);
  }
  AttentionShape shape() const { return AttentionShape{hkv * group, hkv, d}; }
  size_t q_elems() const { return size_t(num_seqs) * hkv * group * d; }
};

// Bound of the int8 store's outputs against the bf16 store's. Per element the widened rows are off by at
// most absmax / 254 (row_quant.h); make_kv's rows (centres 2 N(0, 1) plus 0.5 N(0, 1) noise, d = 128) have
// absmax ~ 3x their RMS, so the error's RMS (uniform rounding: absmax / 127 / sqrt(12)) is ~0.7% of a row's
// RMS: V errors alone give an output nmse ~5e-5, and K errors move each logit by ~0.7% of |q| |k| / sqrt(d)
// (the softmax weights by about as much). nmse <= 1e-3 leaves ~10x room; a wrong row, scale or element order
// gives nmse ~1.
constexpr double kInt8Nmse = 1e-3;

// A store of type t against the bf16 store on the same K/V and drifting queries for 8 steps: the same hit /
// miss counts every step, outputs within nmse_bound; the host bytes are store_token_bytes(t) / 512 of
// bf16's.
void layer_against_bf16(StoreDtype t, double nmse_bound, uint64_t seed) {
  LayerRig su(seed);
  WaveBufferConfig wb, wq;
  wb.tier = wq.tier = KvTier::kHost;
  wb.cache_fraction = wq.cache_fraction = 0.03;
  wq.store_dtype = t;
  cuda::WaveBufferLayer bf(su.shape(), su.cfg, wb, su.num_seqs), q8(su.shape(), su.cfg, wq, su.num_seqs);
  bf.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
  q8.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
  // int8: 2 * 128 + 8 bytes per token and head, int4: 128 + 16, against 4 * 128.
  EXPECT_EQ(q8.store_bytes() * 512, bf.store_bytes() * store_token_bytes(t, 128));
  EXPECT_LT(q8.host_bytes(), bf.host_bytes() * (store_token_bytes(t, 128) + 20) / 512);
  std::mt19937_64 rng(seed);
  auto q = gputest::make_q(su.kv, su.group, seed + 1);
  auto dq = gputest::upload(q);
  double worst = 0.0;
  for (int step = 0; step < 8; ++step) {
    SCOPED_TRACE(testing::Message() << store_dtype_name(t) << " seed " << seed << " step " << step);
    dq.upload(q.data(), q.size() * 4);
    auto ob = gputest::poisoned(su.q_elems()), oq = gputest::poisoned(su.q_elems());
    bf.decode(dq.as<float>(), ob.as<float>());
    q8.decode(dq.as<float>(), oq.as<float>());
    const auto cb = bf.last_step_counts(), cq = q8.last_step_counts();
    EXPECT_EQ(cq.hit_clusters, cb.hit_clusters);
    EXPECT_EQ(cq.miss_clusters, cb.miss_clusters);
    EXPECT_EQ(cq.miss_rows, cb.miss_rows);
    const auto gb = gputest::download_f32(ob, su.q_elems()), gq = gputest::download_f32(oq, su.q_elems());
    for (float x : gq) ASSERT_TRUE(std::isfinite(x));
    const auto c = gputest::compare(gq, gb);
    worst = std::max(worst, c.nmse);
    EXPECT_LE(c.nmse, nmse_bound);
    if (step == 0) {
      EXPECT_GT(c.nmse, 0.0);  // the quantised path really ran (all misses at step 0)
    }
    bf.wait_manager();
    q8.wait_manager();
    q = drift(q, 0.05f, rng);
  }
  std::printf("[wave_store %s layer] 8 steps, 3%% cache: worst nmse against the bf16 store %.3e (bound %.0e)\n",
              std::string(store_dtype_name(t)).c_str(), worst, nmse_bound);
}

TEST(WaveStoreInt8, LayerSelectsAsBf16AndStaysWithinTheBound) {
  RETROINFER_REQUIRE_GPU();
  layer_against_bf16(StoreDtype::kInt8, kInt8Nmse, 313);
}

// Cold step (all misses: rows widened from the store) and the same query again with every cluster admitted
// (all hits: rows from cache pages filled from the execution buffer) give the same output bit for bit.
void cached_rows_are_widened_rows(StoreDtype t, uint64_t seed) {
  LayerRig su(seed);
  WaveBufferConfig w;
  w.tier = KvTier::kHost;
  w.cache_pages = su.n;
  w.store_dtype = t;
  cuda::WaveBufferLayer layer(su.shape(), su.cfg, w, su.num_seqs);
  layer.build(su.dk.as<uint16_t>(), su.dv.as<uint16_t>(), su.n, su.n + 5);
  const auto q = gputest::make_q(su.kv, su.group, seed + 1);
  auto dq = gputest::upload(q);
  auto o0 = gputest::poisoned(su.q_elems()), o1 = gputest::poisoned(su.q_elems());
  layer.decode(dq.as<float>(), o0.as<float>());
  const auto c0 = layer.last_step_counts();
  EXPECT_EQ(c0.hit_clusters, 0);
  layer.wait_manager();
  layer.decode(dq.as<float>(), o1.as<float>());
  const auto c1 = layer.last_step_counts();
  EXPECT_EQ(c1.miss_clusters, 0);
  EXPECT_EQ(c1.hit_rows, c0.miss_rows);
  const auto a = gputest::download_f32(o0, su.q_elems()), b = gputest::download_f32(o1, su.q_elems());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0) << store_dtype_name(t) << " seed " << seed;
}

TEST(WaveStoreInt8, CachedRowsAreTheWidenedRows) {
  RETROINFER_REQUIRE_GPU();
  cached_rows_are_widened_rows(StoreDtype::kInt8, 414);
}

// A kHost session of a small random model (synthetic_config(128), 3 layers, fill_synthetic 3000 tokens, two
// sequences) with the int8 store against the same session with the bf16 store, fed the same tokens. Per
// layer the int8 rows move attention outputs by nmse ~1e-4 (the layer test above); through the layers that
// may flip a near-tie cluster between retrieval and estimation, which moves a layer's output by a few percent
// (test_cuda_placement.cpp measured up to 0.28 of the logit scale between tiers from f32 rounding alone). The
// bounds are that test's: row max |diff| <= 0.5 of the logit scale, nmse <= 0.1; a broken store (garbage
// rows) gives O(1) and nmse ~1.
void host_session_near_bf16(StoreDtype t, double rel_bound, double nmse_bound) {
  ModelConfig c = gputest::synthetic_config(128);
  c.num_layers = 3;
  c.max_position_embeddings = 8192;
  gputest::MemoryModelFile f(c, 25);
  auto m = Model::load(f);
  auto gm = cuda::CudaModel::upload(*m, cuda::WeightType::kBf16);
  const int64_t vocab = c.vocab_size, tokens = 3000;
  const int n = 2, steps = 12;
  auto options = [&](StoreDtype t) {
    cuda::CudaSessionOptions o;
    o.attention.kind = AttentionKind::kRetro;
    o.max_context = 3100;
    o.prefill_chunk = 1024;
    o.placement = KvPlacement::kHost;
    o.wave.store_dtype = t;
    return o;
  };
  cuda::CudaSession sb(*gm, options(StoreDtype::kBf16), n), sq(*gm, options(t), n);
  EXPECT_LT(sq.memory_plan().host_bytes, sb.memory_plan().host_bytes * (store_token_bytes(t, 128) + 20) / 512);
  sb.fill_synthetic(tokens, 9);
  sq.fill_synthetic(tokens, 9);
  std::vector<int32_t> cur{5, 7};
  std::vector<float> lb(size_t(n) * vocab), lq(size_t(n) * vocab);
  double worst_rel = 0.0, worst_nmse = 0.0;
  bool bitwise = true;
  for (int i = 0; i < steps; ++i) {
    sb.decode(cur, lb);
    sq.decode(cur, lq);
    for (int s = 0; s < n; ++s) {
      const float* a = lq.data() + size_t(s) * vocab;
      const float* b = lb.data() + size_t(s) * vocab;
      const auto e = gputest::row_error(a, b, vocab);
      double num = 0.0, den = 0.0;
      for (int64_t j = 0; j < vocab; ++j) {
        num += (double(a[j]) - b[j]) * (double(a[j]) - b[j]);
        den += double(b[j]) * b[j];
        bitwise = bitwise && a[j] == b[j];
      }
      ASSERT_TRUE(std::isfinite(num)) << "step " << i << " sequence " << s;
      worst_rel = std::max(worst_rel, e.rel);
      worst_nmse = std::max(worst_nmse, num / std::max(den, 1e-30));
    }
    for (int s = 0; s < n; ++s)
      cur[s] = argmax(std::span<const float>(lb.data() + size_t(s) * vocab, vocab));  // the bf16 run's tokens
  }
  EXPECT_LE(worst_rel, rel_bound);
  EXPECT_LE(worst_nmse, nmse_bound);
  EXPECT_FALSE(bitwise);  // the quantised rows really were read
  const auto w = sq.last_wave_counts();
  EXPECT_GT(w.step.miss_clusters + w.step.hit_clusters, 0);
  std::printf("[wave_store %s session] kHost, 3 layers, 2 x %lld tokens, %d steps: logits against the bf16 store "
              "max rel %.3e nmse %.3e; host bytes %lld vs %lld\n",
              std::string(store_dtype_name(t)).c_str(), (long long)tokens, steps, worst_rel, worst_nmse, (long long)sq.memory_plan().host_bytes,
              (long long)sb.memory_plan().host_bytes);
}

TEST(WaveStoreInt8, HostSessionDecodesNearTheBf16Store) {
  RETROINFER_REQUIRE_GPU();
  host_session_near_bf16(StoreDtype::kInt8, 0.5, 0.1);
}

// ---- int4 layer and session ----

// 15 levels a group of 32, of the row minus its cluster's mean: per element the rounding's RMS is absmax / 7 /
// sqrt(12) of the residual, whose elements here are make_kv's noise (0.5 N(0, 1) about centres of 2 N(0, 1))
// where a cluster follows one centre, so errors are a few percent of an element's RMS: V errors move the output,
// K errors each logit by a few percent of |q| |k| / sqrt(d), reweighting a cluster's rows. Measured 2.2e-3 on
// the H200; nmse <= 1e-2 leaves 4x room, and rows widened without their base (or a wrong row, scale or nibble
// order) give nmse ~1.
constexpr double kInt4Nmse = 1e-2;

TEST(WaveStoreInt4, LayerSelectsAsBf16AndStaysWithinTheBound) {
  RETROINFER_REQUIRE_GPU();
  layer_against_bf16(StoreDtype::kInt4, kInt4Nmse, 317);
}

TEST(WaveStoreInt4, CachedRowsAreTheWidenedRows) {
  RETROINFER_REQUIRE_GPU();
  cached_rows_are_widened_rows(StoreDtype::kInt4, 418);
}

// Through 3 layers the int4 rows move the logits more than the int8 ones (measured on the H200: row max |diff|
// 0.087 of the logit scale, nmse 8.8e-3); a broken store (garbage rows) gives O(1) and nmse ~1, so the bounds
// sit between: row max |diff| <= 0.4 of the logit scale, nmse <= 0.05.
TEST(WaveStoreInt4, HostSessionDecodesNearTheBf16Store) {
  RETROINFER_REQUIRE_GPU();
  host_session_near_bf16(StoreDtype::kInt4, 0.4, 0.05);
}

}  // namespace
}  // namespace retroinfer
