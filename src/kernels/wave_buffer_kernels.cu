// Wave-buffer kernels (wave_buffer_kernels.h): store fill, mailbox apply, lookup, selection ring, gather.
//
// Row copies: one warp moves a run of rows of K and V, 16-byte chunks with consecutive lanes on
// consecutive chunks and 4 chunks per lane in flight before the stores (2 KiB per warp per round). For a
// missed cluster the source is its store block [K rows | V rows], one contiguous run of size * 4 * D
// bytes, so the zero-copy reads of pinned host memory come in pieces of >= 2 KiB for clusters of >= 4
// tokens at d = 128 (GPU.md: 51 GB/s at >= 2 KiB pieces, 17 GB/s at 512 B). An int8 store halves that run
// (size * 2 * D bytes, >= 1 KiB from 4 tokens up at d = 128) plus its row scales (size * 8 bytes, read once
// per 32 rows by the lanes together); an int4 store halves it again (size * D bytes plus size * D / 8 of group
// scales; each row relative to its cluster's base row, which the gather reads from device memory). The gather
// widens both to bf16 on the way into the execution buffer.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "core/row_quant.h"
#include "kernels/wave_buffer_kernels.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kWarps = 8;  // warps per CTA of the copy kernels
constexpr int kUnroll = 4;  // 16-byte chunks in flight per lane

// Copies `rows` rows of K and V: chunk q of the run is K row q / CPR for q < rows * CPR, else V row.
// src(kv, r) / dst(kv, r) give the row pointers (kv: 0 = K, 1 = V).
template <int D, typename Src, typename Dst>
__device__ __forceinline__ void warp_copy_rows(int lane, int rows, Src src, Dst dst) {
  constexpr int kCpr = D / 8;  // 16-byte chunks per row
  const int half = rows * kCpr, total = 2 * half;
  for (int base = 0; base < total; base += 32 * kUnroll) {
    uint4 buf[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int q = base + u * 32 + lane;
      if (q < total) {
        const int kv = q >= half ? 1 : 0, qq = q - kv * half;
        buf[u] = *reinterpret_cast<const uint4*>(src(kv, qq / kCpr) + (qq % kCpr) * 8);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int q = base + u * 32 + lane;
      if (q < total) {
        const int kv = q >= half ? 1 : 0, qq = q - kv * half;
        *reinterpret_cast<uint4*>(dst(kv, qq / kCpr) + (qq % kCpr) * 8) = buf[u];
      }
    }
  }
}

__device__ __forceinline__ int64_t store_block(const WaveTables& t, int h, int c) {
  return t.store_at[int64_t{h} * t.num_clusters + c] * 2 * t.head_dim;
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32) store_fill_kernel(const StoreFillParams p) {
  const int h = blockIdx.y, lane = threadIdx.x & 31;
  const int c = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const WaveTables& t = p.t;
  if (c >= t.num_clusters) return;
  const int s = t.sizes[int64_t{h} * t.num_clusters + c];
  const int64_t o = t.offsets[int64_t{h} * (t.num_clusters + 1) + c];
  uint16_t* blk = p.store + store_block(t, h, c);
  const uint32_t* mem = p.members + int64_t{h} * t.n_idx + o;
  const uint16_t* kh = p.k + int64_t{h} * p.kv_stride * D;
  const uint16_t* vh = p.v + int64_t{h} * p.kv_stride * D;
  warp_copy_rows<D>(
      lane, s,
      [&](int kv, int r) { return (kv ? vh : kh) + (p.idx_begin + int64_t{mem[r]}) * D; },
      [&](int kv, int r) { return blk + int64_t{kv * s + r} * D; });
}

// One cluster's block for the quantising fills: warp w of block (x, h) takes cluster x * kWarps + w of head h
// (valid = false past the last cluster: the whole warp returns). load(i, lane, x) gives lane its D / 32 values
// (from element lane * D / 32 on) of row i of [K rows | V rows], i in [0, 2 s).
template <int D>
struct FillCluster {
  static constexpr int kPer = D / 32;
  bool valid = false;
  int h = 0, c = 0, s = 0;
  int64_t at = 0;  // the block's first store row
  const uint32_t* mem = nullptr;
  const uint16_t *kh = nullptr, *vh = nullptr;
  int64_t idx_begin = 0;
  __device__ explicit FillCluster(const StoreFillParams& p) {
    const WaveTables& t = p.t;
    h = blockIdx.y;
    c = blockIdx.x * kWarps + (threadIdx.x >> 5);
    if (c >= t.num_clusters) return;
    valid = true;
    s = t.sizes[int64_t{h} * t.num_clusters + c];
    at = t.store_at[int64_t{h} * t.num_clusters + c];
    mem = p.members + int64_t{h} * t.n_idx + t.offsets[int64_t{h} * (t.num_clusters + 1) + c];
    kh = p.k + int64_t{h} * p.kv_stride * D;
    vh = p.v + int64_t{h} * p.kv_stride * D;
    idx_begin = p.idx_begin;
  }
  // The lane's values of row i.
  __device__ void load(int i, int lane, float* x) const {
    const int kv = i >= s ? 1 : 0, r = i - kv * s;
    const uint16_t* src = (kv ? vh : kh) + (idx_begin + int64_t{mem[r]}) * D + lane * kPer;
#pragma unroll
    for (int e = 0; e < kPer; ++e) x[e] = bf16_to_f32(src[e]);
  }
};

// An int8 store's fill: one warp per cluster, one row (D values, D / 32 per lane) at a time: the row's
// absmax over the warp, then each lane quantises its values and writes them (a coalesced D-byte row); lane 0
// writes the scale. core/row_quant.h does the arithmetic, as the CPU reference.
template <int D>
__global__ void __launch_bounds__(kWarps * 32) store_fill_q8_kernel(const StoreFillParams p) {
  constexpr int kPer = D / 32;  // values per lane
  static_assert(kPer == 2 || kPer == 4, "store_fill_q8_kernel: D = 64 or 128");
  const int lane = threadIdx.x & 31;
  const FillCluster<D> fc(p);
  if (!fc.valid) return;
  for (int i = 0; i < 2 * fc.s; ++i) {
    float x[kPer];
    fc.load(i, lane, x);
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) amax = fmaxf(amax, fabsf(x[e]));
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const float inv = int8_row_inverse(amax);
    int8_t* dst = p.store_q8 + fc.at * 2 * D + int64_t{i} * D + lane * kPer;  // row i of [K rows | V rows]
    uint32_t packed = 0;  // the lane's kPer bytes in one store (host memory: no partial-word writes)
#pragma unroll
    for (int e = 0; e < kPer; ++e) packed |= uint32_t{static_cast<uint8_t>(int8_quantize(x[e], inv))} << (8 * e);
    if constexpr (kPer == 4) *reinterpret_cast<uint32_t*>(dst) = packed;
    else *reinterpret_cast<uint16_t*>(dst) = static_cast<uint16_t>(packed);
    if (lane == 0) p.store_scale[fc.at * 2 + i] = int8_row_scale(amax);
  }
}

// An int4 store's fill: one warp per cluster. First the cluster's base rows (core/row_quant.h int4_base_row:
// the mean of its K rows and of its V rows, each lane its D / 32 columns, summed in row order), written to
// store_base in device memory; then one row at a time as the int8 fill, the row minus its base quantised. A
// group of 32 values lies on 32 / kPer consecutive lanes, whose absmax comes from shuffles among them. Each
// lane packs its kPer values into kPer / 2 bytes; at D = 64 (one byte a lane) pairs of lanes join theirs, so
// that no write to host memory is narrower than 2 bytes. Lane 0 writes the row's D / 32 scales in one store.
template <int D>
__global__ void __launch_bounds__(kWarps * 32) store_fill_q4_kernel(const StoreFillParams p) {
  constexpr int kPer = D / 32;                    // values per lane
  constexpr int kGroups = D / kInt4Group;         // scales per row
  constexpr int kLanesPerGroup = kInt4Group / kPer;
  static_assert(kPer == 2 || kPer == 4, "store_fill_q4_kernel: D = 64 or 128");
  const int lane = threadIdx.x & 31;
  const FillCluster<D> fc(p);
  if (!fc.valid) return;
  float base[2][kPer];
  for (int kv = 0; kv < 2; ++kv) {
    float sum[kPer] = {};
    for (int r = 0; r < fc.s; ++r) {
      float x[kPer];
      fc.load(kv * fc.s + r, lane, x);
#pragma unroll
      for (int e = 0; e < kPer; ++e) sum[e] = __fadd_rn(sum[e], x[e]);
    }
    uint32_t w[kPer / 2];
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const uint16_t b = fc.s > 0 ? f32_to_bf16(__fdiv_rn(sum[e], static_cast<float>(fc.s))) : uint16_t{0};
      base[kv][e] = bf16_to_f32(b);
      if (e % 2 == 0) w[e / 2] = b;
      else w[e / 2] |= uint32_t{b} << 16;
    }
    uint16_t* dst = p.store_base + ((int64_t{fc.h} * p.base_stride + p.base_col0 + fc.c) * 2 + kv) * D + lane * kPer;
    if constexpr (kPer == 4) *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
    else *reinterpret_cast<uint32_t*>(dst) = w[0];
  }
  for (int i = 0; i < 2 * fc.s; ++i) {
    const int kv = i >= fc.s ? 1 : 0;
    float x[kPer];
    fc.load(i, lane, x);
    float amax = 0.0f;
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      x[e] = __fsub_rn(x[e], base[kv][e]);
      amax = fmaxf(amax, fabsf(x[e]));
    }
#pragma unroll
    for (int off = 1; off < kLanesPerGroup; off <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    const uint16_t scale = int4_group_scale(amax);
    const float inv = int4_group_inverse(scale);
    uint32_t packed = 0;  // value e of the lane in nibble e
#pragma unroll
    for (int e = 0; e < kPer; ++e) packed |= uint32_t{int4_quantize(x[e], inv)} << (4 * e);
    uint8_t* dst = p.store_q4 + fc.at * D + int64_t{i} * (D / 2);  // row i of [K rows | V rows]
    if constexpr (kPer == 4) {
      *reinterpret_cast<uint16_t*>(dst + lane * 2) = static_cast<uint16_t>(packed);
    } else {
      const uint32_t next = __shfl_down_sync(0xffffffffu, packed, 1);
      if ((lane & 1) == 0) *reinterpret_cast<uint16_t*>(dst + lane) = static_cast<uint16_t>(packed | (next << 8));
    }
    uint32_t g[kGroups];
#pragma unroll
    for (int j = 0; j < kGroups; ++j) g[j] = __shfl_sync(0xffffffffu, uint32_t{scale}, j * kLanesPerGroup);
    uint16_t* scl = p.store_group_scale + (fc.at * 2 + i) * kGroups;
    if (lane == 0) {
      if constexpr (kGroups == 4)
        *reinterpret_cast<uint2*>(scl) = make_uint2(g[0] | (g[1] << 16), g[2] | (g[3] << 16));
      else
        *reinterpret_cast<uint32_t*>(scl) = g[0] | (g[1] << 16);
    }
  }
}

// The widenings' arithmetic on the device: the same values as core/row_quant.h's int8_widen_bf16 and
// int4_widen_bf16 for finite inputs, with fewer instructions (the gather widens every missed row). A small
// integer n becomes a float by the magic-number trick (2^23 + n exactly, minus 2^23) instead of a conversion,
// and two results round to bf16 in one cvt.rn.bf16x2.f32 (round to nearest even, as f32_to_bf16).
__device__ __forceinline__ uint32_t bf16_pair(float lo, float hi) {
  const __nv_bfloat162 r = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&r);
}
// The int8 value of byte b (two's complement) as a float.
__device__ __forceinline__ float int8_float(uint32_t b) {
  return __fsub_rn(__uint_as_float(0x4b000000u | ((b & 0xffu) ^ 0x80u)), 8388736.0f);  // 2^23 + 128
}
// The int4 value of nibble n (two's complement, low 4 bits) as a float.
__device__ __forceinline__ float int4_float(uint32_t n) {
  return __fsub_rn(__uint_as_float(0x4b000000u | ((n & 0xfu) ^ 0x8u)), 8388616.0f);  // 2^23 + 8
}

// 16 int8 values (one 16-byte chunk) widened to 16 bf16 (two 16-byte chunks) with one scale.
__device__ __forceinline__ void widen_chunk(const uint4& in, float scale, uint4& lo, uint4& hi) {
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t o[8];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
#pragma unroll
    for (int b = 0; b < 2; ++b)  // one f32 rounding of q * scale, as row_quant.h's, then one to bf16
      o[2 * j + b] = bf16_pair(__fmul_rn(int8_float(w[j] >> (16 * b)), scale),
                               __fmul_rn(int8_float(w[j] >> (16 * b + 8)), scale));
  }
  lo = make_uint4(o[0], o[1], o[2], o[3]);
  hi = make_uint4(o[4], o[5], o[6], o[7]);
}

// Widens one int8 cluster block of s rows ([K rows | V rows], D bytes a row; scales [K s | V s]) into bf16
// rows dst(kv, r). Rows go in groups of 32: lane i loads the K and V scales of the group's row i (one
// 128-byte read each), and the lane that widens a chunk takes its row's scale from that lane by shuffle.
// Chunks are 16 bytes of int8 (16 values), 4 per lane in flight as in warp_copy_rows. Warp-uniform s.
template <int D, typename Dst>
__device__ __forceinline__ void warp_widen_rows(int lane, int s, const int8_t* blk, const float* scl, Dst dst) {
  constexpr int kCpr = D / 16;  // 16-byte int8 chunks per row
  for (int g0 = 0; g0 < s; g0 += 32) {
    const int rows = s - g0 < 32 ? s - g0 : 32;
    const float sk = lane < rows ? scl[g0 + lane] : 0.0f;
    const float sv = lane < rows ? scl[s + g0 + lane] : 0.0f;
    const int half = rows * kCpr, total = 2 * half;
    for (int base = 0; base < total; base += 32 * kUnroll) {
      uint4 buf[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int q = base + u * 32 + lane;
        if (q < total) {
          const int kv = q >= half ? 1 : 0, qq = q - kv * half;
          buf[u] = *reinterpret_cast<const uint4*>(blk + int64_t{kv * s + g0 + qq / kCpr} * D + (qq % kCpr) * 16);
        }
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int q = base + u * 32 + lane;
        const int kv = q >= half ? 1 : 0, qq = q - kv * half;
        const int r = (qq / kCpr) & 31;  // past the end (q >= total) any lane: the result is not used
        const float a = __shfl_sync(0xffffffffu, sk, r), b = __shfl_sync(0xffffffffu, sv, r);
        if (q < total) {
          uint4 lo, hi;
          widen_chunk(buf[u], kv ? b : a, lo, hi);
          uint16_t* d = dst(kv, g0 + qq / kCpr) + (qq % kCpr) * 16;
          reinterpret_cast<uint4*>(d)[0] = lo;
          reinterpret_cast<uint4*>(d)[1] = hi;
        }
      }
    }
  }
}

// 32 int4 values (one 16-byte chunk) widened to 32 bf16 (four 16-byte chunks) with their group's scale, each
// added to its base value (base: the group's 32 bf16 base values, packed as four 16-byte chunks).
__device__ __forceinline__ void widen_chunk_q4(const uint4& in, float scale, const uint4 (&base)[4], uint4 out[4]) {
  const uint32_t w[4] = {in.x, in.y, in.z, in.w};
  uint32_t o[16];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t b[4] = {base[j].x, base[j].y, base[j].z, base[j].w};  // base values 8j .. 8j + 7
#pragma unroll
    for (int k = 0; k < 4; ++k) {  // byte k of word j: values 8j + 2k (low nibble) and 8j + 2k + 1
      const uint32_t byte = w[j] >> (8 * k);
      const float b0 = __uint_as_float(b[k] << 16), b1 = __uint_as_float(b[k] & 0xffff0000u);  // bf16 -> f32
      // base + q * scale: q * scale is exact (3 + 8 significant bits), so the fused multiply-add rounds once,
      // as row_quant.h's multiply then add.
      o[4 * j + k] = bf16_pair(__fmaf_rn(int4_float(byte), scale, b0), __fmaf_rn(int4_float(byte >> 4), scale, b1));
    }
  }
#pragma unroll
  for (int k = 0; k < 4; ++k) out[k] = make_uint4(o[4 * k], o[4 * k + 1], o[4 * k + 2], o[4 * k + 3]);
}

// Widens one int4 cluster block of s rows ([K rows | V rows], D / 2 bytes a row; group scales [K | V], D / 32
// a row) into bf16 rows dst(kv, r), each row plus its base (base: the cluster's K base row, then its V base
// row, device memory). The block's 16-byte chunk q holds 32 values, one group, whose scale is element q of the
// block's scales: each lane loads its chunk and that scale, 4 chunks per lane in flight as in warp_copy_rows.
// A lane's chunks are all of group lane % (D / 32) (the chunks of a round are 32 apart, a multiple of the
// groups per row), so it loads that group's K and V base values once. Warp-uniform s.
template <int D, typename Dst>
__device__ __forceinline__ void warp_widen_rows_q4(int lane, int s, const uint8_t* blk, const uint16_t* scl,
                                                   const uint16_t* base, Dst dst) {
  constexpr int kCpr = D / kInt4Group;  // 16-byte chunks (and scales) per row
  static_assert(32 % kCpr == 0, "warp_widen_rows_q4: a lane's chunks must share their group");
  const int half = s * kCpr, total = 2 * half;
  uint4 bk[4], bv[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    bk[j] = reinterpret_cast<const uint4*>(base + (lane % kCpr) * kInt4Group)[j];
    bv[j] = reinterpret_cast<const uint4*>(base + D + (lane % kCpr) * kInt4Group)[j];
  }
  for (int q0 = 0; q0 < total; q0 += 32 * kUnroll) {
    uint4 buf[kUnroll];
    uint16_t sc[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int q = q0 + u * 32 + lane;
      if (q < total) {
        buf[u] = *reinterpret_cast<const uint4*>(blk + int64_t{q} * 16);
        sc[u] = scl[q];
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int q = q0 + u * 32 + lane;
      if (q < total) {
        const int kv = q >= half ? 1 : 0, qq = q - kv * half;
        uint4 b[4], out[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) b[j] = kv ? bv[j] : bk[j];
        widen_chunk_q4(buf[u], bf16_to_f32(sc[u]), b, out);
        uint4* d = reinterpret_cast<uint4*>(dst(kv, qq / kCpr) + (qq % kCpr) * kInt4Group);
#pragma unroll
        for (int k = 0; k < 4; ++k) d[k] = out[k];
      }
    }
  }
}

// ---- apply ----

__device__ __forceinline__ uint64_t volatile_load(const uint64_t* x) { return *reinterpret_cast<const volatile uint64_t*>(x); }
__device__ __forceinline__ int32_t volatile_load(const int32_t* x) { return *reinterpret_cast<const volatile int32_t*>(x); }

__device__ __forceinline__ int32_t ld(const int32_t* x) { return *x; }

__global__ void apply_snapshot_kernel(const WaveApplyParams p) {
  WaveDeviceState* st = p.state;
  const buffer::MailboxHeader* mb = p.layout.mailbox(p.region);
  const uint64_t seq = volatile_load(&mb->seq);
  st->active = 0;
  if (seq != st->last_seq) {
    __threadfence_system();  // the header fields and payload were written before seq (release on the host)
    const uint64_t src = volatile_load(&mb->src_step);
    st->active = 1;
    st->in_time = src + 1 == st->step ? 1 : 0;
    st->seq = seq;
    st->num_evictions = volatile_load(&mb->num_evictions);
    st->num_admissions = volatile_load(&mb->num_admissions);
    st->num_pages = volatile_load(&mb->num_pages);
    st->last_seq = seq;
    // A count beyond the region's capacity would overrun the mirror: apply nothing of it, flag it.
    if (st->num_evictions < 0 || st->num_evictions > p.layout.max_evictions || st->num_admissions < 0 ||
        st->num_admissions > p.layout.max_admissions || st->num_pages < 0 || st->num_pages > p.layout.max_admit_pages) {
      st->num_evictions = st->num_admissions = st->num_pages = 0;
      st->error |= 4;
    }
  }
}

// Copies the used part of the payload (4-byte words, uncached loads: the host rewrites it between
// updates) from pinned memory into the device mirror.
__global__ void apply_fetch_kernel(const WaveApplyParams p) {
  const WaveDeviceState* st = p.state;
  if (st->active == 0) return;
  const int gtid = blockIdx.x * blockDim.x + threadIdx.x, nthreads = gridDim.x * blockDim.x;
  char* base = static_cast<char*>(p.mirror) - p.layout.evictions_offset;  // mirror as if it were the region
  const size_t ranges[3][2] = {
      {p.layout.evictions_offset, sizeof(buffer::MailboxEviction) * size_t(st->num_evictions)},
      {p.layout.admissions_offset, sizeof(buffer::MailboxAdmission) * size_t(st->num_admissions)},
      {p.layout.pages_offset, sizeof(int32_t) * size_t(st->num_pages)}};
  for (int r = 0; r < 3; ++r) {
    const int32_t* src = reinterpret_cast<const int32_t*>(static_cast<const char*>(p.region) + ranges[r][0]);
    int32_t* dst = reinterpret_cast<int32_t*>(base + ranges[r][0]);
    const int64_t words = static_cast<int64_t>(ranges[r][1] / 4);
    for (int64_t i = gtid; i < words; i += nthreads) dst[i] = __ldcv(src + i);
  }
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32) apply_kernel(const WaveApplyParams p) {
  const WaveDeviceState* st = p.state;
  if (st->active == 0) return;
  const WaveTables& t = p.t;
  const int gtid = blockIdx.x * blockDim.x + threadIdx.x, nthreads = gridDim.x * blockDim.x;
  void* mbase = static_cast<char*>(p.mirror) - p.layout.evictions_offset;
  const buffer::MailboxEviction* ev = p.layout.evictions(mbase);
  for (int i = gtid; i < st->num_evictions; i += nthreads) {
    const int h = ld(&ev[i].head), c = ld(&ev[i].cluster);
    if (h < 0 || h >= t.num_heads || c < 0 || c >= t.num_clusters) {
      atomicOr(reinterpret_cast<unsigned long long*>(&p.state->error), 1ull);
      continue;
    }
    t.resident[int64_t{h} * t.num_clusters + c] = 0;
  }
  if (st->in_time == 0) return;
  const buffer::MailboxAdmission* ad = p.layout.admissions(mbase);
  const int32_t* pages = p.layout.pages(mbase);
  const int lane = threadIdx.x & 31, gwarp = gtid >> 5, nwarps = nthreads >> 5;
  for (int i = gwarp; i < st->num_admissions; i += nwarps) {
    const int h = ld(&ad[i].head), c = ld(&ad[i].cluster);
    const int row = ld(&ad[i].exec_row), n = ld(&ad[i].num_rows);
    const int pb = ld(&ad[i].page_begin);
    const bool ok = h >= 0 && h < t.num_heads && c >= 0 && c < t.num_clusters && row >= 0 && n >= 1 &&
                    row + int64_t{n} <= t.exec_cap && n == t.sizes[int64_t{h} * t.num_clusters + c] && pb >= 0 &&
                    pb + (n + t.page_tokens - 1) / t.page_tokens <= st->num_pages;
    if (!ok) {
      if (lane == 0) atomicOr(reinterpret_cast<unsigned long long*>(&p.state->error), 2ull);
      continue;
    }
    const int npages = (n + t.page_tokens - 1) / t.page_tokens;
    bool pages_ok = true;
    for (int j = 0; j < npages; ++j) {
      const int pg = ld(&pages[pb + j]);
      pages_ok = pages_ok && pg >= 0 && pg < t.pages_per_head;
    }
    if (!pages_ok) {
      if (lane == 0) atomicOr(reinterpret_cast<unsigned long long*>(&p.state->error), 2ull);
      continue;
    }
    const uint16_t* ek = t.exec_k + (int64_t{h} * t.exec_cap + row) * D;
    const uint16_t* evv = t.exec_v + (int64_t{h} * t.exec_cap + row) * D;
    const int pt = t.page_tokens;
    uint16_t* ck = t.cache_k + int64_t{h} * t.pages_per_head * pt * D;
    uint16_t* cv = t.cache_v + int64_t{h} * t.pages_per_head * pt * D;
    warp_copy_rows<D>(
        lane, n, [&](int kv, int r) { return (kv ? evv : ek) + int64_t{r} * D; },
        [&](int kv, int r) {
          const int pg = ld(&pages[pb + r / pt]);
          return (kv ? cv : ck) + (int64_t{pg} * pt + r % pt) * D;
        });
    const int64_t slot0 = int64_t{h} * t.slot_stride + t.slot_begin[int64_t{h} * (t.num_clusters + 1) + c];
    for (int j = lane; j < npages; j += 32) t.cluster_pages[slot0 + j] = ld(&pages[pb + j]);
    if (lane == 0) t.resident[int64_t{h} * t.num_clusters + c] = 1;
  }
}

// ---- lookup ----

constexpr int kLookupThreads = 256;

__global__ void __launch_bounds__(kLookupThreads) lookup_kernel(const WaveLookupParams p) {
  __shared__ int scan_m[kLookupThreads], scan_h[kLookupThreads];
  __shared__ unsigned long long cnt[4];
  const int h = blockIdx.x, tid = threadIdx.x, K = p.k;
  const WaveTables& t = p.t;
  const int per = (K + kLookupThreads - 1) / kLookupThreads;
  const int b = tid * per, e = b + per < K ? b + per : K;
  const int* ids = p.retrieval_ids + int64_t{h} * K;
  if (tid < 4) cnt[tid] = 0;
  int miss_rows = 0, hit_rows = 0, miss_n = 0, hit_n = 0;
  for (int j = b; j < e; ++j) {
    const int c = ids[j];
    if (c < 0) continue;
    const int s = t.sizes[int64_t{h} * t.num_clusters + c];
    if (t.resident[int64_t{h} * t.num_clusters + c]) hit_rows += s, ++hit_n;
    else miss_rows += s, ++miss_n;
  }
  scan_m[tid] = miss_rows;
  scan_h[tid] = hit_rows;
  __syncthreads();
  for (int off = 1; off < kLookupThreads; off <<= 1) {  // inclusive Hillis-Steele scan
    const int am = tid >= off ? scan_m[tid - off] : 0, ah = tid >= off ? scan_h[tid - off] : 0;
    __syncthreads();
    scan_m[tid] += am;
    scan_h[tid] += ah;
    __syncthreads();
  }
  const int total_m = scan_m[kLookupThreads - 1], total_h = scan_h[kLookupThreads - 1];
  int mrow = p.steady_rows + scan_m[tid] - miss_rows;
  int hrow = p.steady_rows + total_m + scan_h[tid] - hit_rows;
  for (int j = b; j < e; ++j) {
    const int c = ids[j];
    int row = -1;
    uint8_t hit = 0;
    if (c >= 0) {
      const int s = t.sizes[int64_t{h} * t.num_clusters + c];
      hit = t.resident[int64_t{h} * t.num_clusters + c];
      if (hit) row = hrow, hrow += s;
      else row = mrow, mrow += s;
    }
    p.seg_row[int64_t{h} * K + j] = row;
    p.seg_hit[int64_t{h} * K + j] = hit;
  }
  atomicAdd(&cnt[0], static_cast<unsigned long long>(hit_n));
  atomicAdd(&cnt[1], static_cast<unsigned long long>(miss_n));
  __syncthreads();
  if (tid == 0) {
    p.exec_count[h] = p.steady_rows + total_m + total_h;
    p.counts[int64_t{h} * 4 + 0] = static_cast<int64_t>(cnt[0]);
    p.counts[int64_t{h} * 4 + 1] = static_cast<int64_t>(cnt[1]);
    p.counts[int64_t{h} * 4 + 2] = total_h;
    p.counts[int64_t{h} * 4 + 3] = total_m;
  }
}

// ---- ring ----

constexpr int kRingThreads = 1024;

__global__ void __launch_bounds__(kRingThreads) ring_kernel(const WaveRingParams p) {
  WaveDeviceState* st = p.state;
  const uint64_t step = st->step;
  const int slot = static_cast<int>(step % uint64_t(p.layout.ring_slots));
  buffer::RingSlotHeader* hdr = p.layout.ring_header(p.region, slot);
  if (threadIdx.x == 0) {
    if (st->active) {  // ack the update applied at the start of this step
      buffer::AckRecord* ack = p.layout.ack(p.region);
      ack->step = step;
      ack->admitted = st->in_time;
      __threadfence_system();
      *reinterpret_cast<volatile uint64_t*>(&ack->seq) = st->seq;
    }
    *reinterpret_cast<volatile uint64_t*>(&hdr->begin) = step + 1;
    __threadfence_system();
  }
  __syncthreads();
  const int K = p.layout.k, ks = p.k_src;
  const int64_t n = int64_t{p.layout.heads} * K;
  int32_t* ids = p.layout.ring_ids(p.region, slot);
  int32_t* rows = p.layout.ring_rows(p.region, slot);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t h = i / K;
    const int j = static_cast<int>(i - h * K);
    if (j < ks) {  // the ring may be wider than this step's selection (index updates grow n_r): -1 pad
      const int64_t x = h * ks + j;
      ids[i] = p.retrieval_ids[x];
      rows[i] = p.seg_hit[x] ? -1 : p.seg_row[x];
    } else {
      ids[i] = -1;
      rows[i] = -1;
    }
  }
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) {
    *reinterpret_cast<volatile uint64_t*>(&hdr->end) = step + 1;
    st->step = step + 1;
  }
}

// ---- gather ----

template <int D>
__global__ void __launch_bounds__(kWarps * 32) gather_kernel(const WaveGatherParams p) {
  const WaveTables& t = p.t;
  const int h = blockIdx.y, lane = threadIdx.x & 31;
  const int steady_items = (p.steady_rows + 7) / 8;
  const int items = steady_items + p.k;
  uint16_t* xk = t.exec_k + int64_t{h} * t.exec_cap * D;
  uint16_t* xv = t.exec_v + int64_t{h} * t.exec_cap * D;
  for (int it = blockIdx.x * kWarps + (threadIdx.x >> 5); it < items; it += gridDim.x * kWarps) {
    if (it < steady_items) {
      const int r0 = it * 8, n = p.steady_rows - r0 < 8 ? p.steady_rows - r0 : 8;
      const uint16_t* sk = p.steady_k + (int64_t{h} * p.steady_cap + r0) * D;
      const uint16_t* sv = p.steady_v + (int64_t{h} * p.steady_cap + r0) * D;
      warp_copy_rows<D>(
          lane, n, [&](int kv, int r) { return (kv ? sv : sk) + int64_t{r} * D; },
          [&](int kv, int r) { return (kv ? xv : xk) + int64_t{r0 + r} * D; });
      continue;
    }
    const int j = it - steady_items;
    const int c = p.retrieval_ids[int64_t{h} * p.k + j];
    if (c < 0) continue;
    const int s = t.sizes[int64_t{h} * t.num_clusters + c];
    const int row0 = p.seg_row[int64_t{h} * p.k + j];
    auto dst = [&](int kv, int r) { return (kv ? xv : xk) + int64_t{row0 + r} * D; };
    if (p.seg_hit[int64_t{h} * p.k + j]) {
      const int pt = t.page_tokens;
      const int* pages = t.cluster_pages + int64_t{h} * t.slot_stride + t.slot_begin[int64_t{h} * (t.num_clusters + 1) + c];
      const uint16_t* ck = t.cache_k + int64_t{h} * t.pages_per_head * pt * D;
      const uint16_t* cv = t.cache_v + int64_t{h} * t.pages_per_head * pt * D;
      warp_copy_rows<D>(
          lane, s, [&](int kv, int r) { return (kv ? cv : ck) + (int64_t{pages[r / pt]} * pt + r % pt) * D; }, dst);
    } else if (t.store_q8 != nullptr) {  // int8 store: widened to bf16
      const int64_t at = t.store_at[int64_t{h} * t.num_clusters + c];
      warp_widen_rows<D>(lane, s, t.store_q8 + at * 2 * D, t.store_scale + at * 2, dst);
    } else if (t.store_q4 != nullptr) {  // int4 store: widened to bf16
      const int64_t at = t.store_at[int64_t{h} * t.num_clusters + c];
      warp_widen_rows_q4<D>(lane, s, t.store_q4 + at * D, t.store_group_scale + at * 2 * (D / kInt4Group),
                            t.store_base + (int64_t{h} * t.num_clusters + c) * 2 * D, dst);
    } else {
      const uint16_t* blk = t.store + store_block(t, h, c);
      warp_copy_rows<D>(lane, s, [&](int kv, int r) { return blk + int64_t{kv * s + r} * D; }, dst);
    }
  }
}

// ---- row gather ----

template <int D>
__global__ void __launch_bounds__(kWarps * 32) rows_gather_kernel(const RowGatherParams p) {
  const int h = blockIdx.y, lane = threadIdx.x & 31;
  const int64_t r = int64_t{blockIdx.x} * kWarps + (threadIdx.x >> 5);
  if (r >= p.rows) return;
  const int64_t src = p.map[int64_t{h} * p.rows + r];
  const uint16_t* sk = p.src_k + (int64_t{h} * p.src_cap + src) * D;
  const uint16_t* sv = p.src_v + (int64_t{h} * p.src_cap + src) * D;
  uint16_t* dk = p.dst_k + (int64_t{h} * p.dst_cap + r) * D;
  uint16_t* dv = p.dst_v + (int64_t{h} * p.dst_cap + r) * D;
  warp_copy_rows<D>(
      lane, 1, [&](int kv, int) { return kv ? sv : sk; }, [&](int kv, int) { return kv ? dv : dk; });
}

int copy_blocks(int64_t items) {
  const int64_t b = (items + kWarps - 1) / kWarps;
  return static_cast<int>(b < 1 ? 1 : b);
}

}  // namespace

cudaError_t wave_store_fill(const StoreFillParams& p, cudaStream_t s) {
  const dim3 grid(copy_blocks(p.t.num_clusters), p.t.num_heads);
  const bool q8 = p.store_q8 != nullptr, q4 = p.store_q4 != nullptr;
  if ((q8 && p.store_scale == nullptr) || (q4 && (p.store_group_scale == nullptr || p.store_base == nullptr)))
    return cudaErrorInvalidValue;
  if (p.t.head_dim == 128) {
    if (q8) store_fill_q8_kernel<128><<<grid, kWarps * 32, 0, s>>>(p);
    else if (q4) store_fill_q4_kernel<128><<<grid, kWarps * 32, 0, s>>>(p);
    else store_fill_kernel<128><<<grid, kWarps * 32, 0, s>>>(p);
  } else if (p.t.head_dim == 64) {
    if (q8) store_fill_q8_kernel<64><<<grid, kWarps * 32, 0, s>>>(p);
    else if (q4) store_fill_q4_kernel<64><<<grid, kWarps * 32, 0, s>>>(p);
    else store_fill_kernel<64><<<grid, kWarps * 32, 0, s>>>(p);
  } else {
    return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t wave_apply(const WaveApplyParams& p, cudaStream_t s) {
  apply_snapshot_kernel<<<1, 1, 0, s>>>(p);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  apply_fetch_kernel<<<64, 256, 0, s>>>(p);
  e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  // Enough warps for the largest update (one warp per admission), capped at a few waves.
  const int blocks = copy_blocks(p.layout.max_admissions) < 1024 ? copy_blocks(p.layout.max_admissions) : 1024;
  if (p.t.head_dim == 128) apply_kernel<128><<<blocks, kWarps * 32, 0, s>>>(p);
  else if (p.t.head_dim == 64) apply_kernel<64><<<blocks, kWarps * 32, 0, s>>>(p);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t wave_lookup(const WaveLookupParams& p, cudaStream_t s) {
  lookup_kernel<<<p.t.num_heads, kLookupThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t wave_ring(const WaveRingParams& p, cudaStream_t s) {
  ring_kernel<<<1, kRingThreads, 0, s>>>(p);
  return cudaGetLastError();
}

cudaError_t wave_gather(const WaveGatherParams& p, cudaStream_t s) {
  const int items = (p.steady_rows + 7) / 8 + p.k;
  const dim3 grid(copy_blocks(items), p.t.num_heads);
  if (p.t.head_dim == 128) gather_kernel<128><<<grid, kWarps * 32, 0, s>>>(p);
  else if (p.t.head_dim == 64) gather_kernel<64><<<grid, kWarps * 32, 0, s>>>(p);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t wave_rows_gather(const RowGatherParams& p, cudaStream_t s) {
  if (p.rows <= 0) return cudaSuccess;
  const dim3 grid(copy_blocks(p.rows), p.num_heads);
  if (p.head_dim == 128) rows_gather_kernel<128><<<grid, kWarps * 32, 0, s>>>(p);
  else if (p.head_dim == 64) rows_gather_kernel<64><<<grid, kWarps * 32, 0, s>>>(p);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

}  // namespace retroinfer::cuda::detail
