// Zone selection spread over several CTAs per head (docs/design.md §2 "Scoring"): the same result as the
// one-CTA bins kernel (select_bins.cu) and the cluster kernel (select_cluster.cu) — "sort by (score desc,
// id asc) and cut at k_r and k_r + k_e", ids ascending, the retrieval items expanded into the head's
// exact-token list after the steady zone — but each head's items split into C chunks of 256 * ipt items,
// one 256-thread CTA per (chunk, head), all CTAs resident at once (a cooperative launch, after a capacity
// check), and the CTAs of a head meeting at four barriers of their own (a count and a generation per head in
// global memory). Used past 40960 items (select_kernels.h kSelectGridMinItems: 1M tokens) where it applies, in
// place of the cluster kernel; below, the one-CTA bins kernel is faster (each barrier phase costs ~3-5 us).
//   0. the chunk's ready scores into shared memory (the CSR offsets of the chunk prefetched into L2 before
//      the PDL wait);
//   1. level 1 of an exact radix select of both thresholds: a shared histogram of the order key's bits 31..20,
//      its non-zero bins added into the head's global histogram;                                  [barrier 1]
//   2. every CTA scans the head's histogram (the same counts, so the same digits), then the items in a
//      threshold's level-1 bin add bits 19..8 into a second global histogram (warp-aggregated);   [barrier 2]
//   3. the same for bits 7..0 (a third histogram of 256 bins);                                     [barrier 3]
//   4. the thresholds t1, t2 (the k-th largest keys) and how many of their ties are in (take); when a
//      threshold takes some but not all of its ties, the chunks publish their tie counts first     [barrier 4a]
//      so that every tie gets its rank in id order; then the flags, the retrieval items' CSR lengths and the
//      chunk's (retrieval, estimation, token) counts, published                                   [barrier 4]
//   5. every CTA adds up the counts of the chunks before it, writes its ids and the expansion-table
//      positions, and expands its own retrieval items; CTA 0 writes the steady zone and the token count.
// Each histogram is zeroed by the CTAs once all of them have read it (after the next barrier), so the
// histograms are all zero again when the grid ends (the layers zero the workspace once at allocation); the
// barrier counts return to zero too (the chunk counts and the barrier generation are scratch). The
// exact-attention grid (a programmatic dependent) is let launch only after the last barrier, so it never
// holds a multiprocessor that a CTA still waiting at a barrier needs.
#include <cuda_runtime.h>

#include "kernels/common.cuh"
#include "kernels/kernels.h"
#include "kernels/select_common.cuh"

namespace retroinfer::cuda::detail {

namespace {

constexpr int kGThreads = 256;
constexpr int kGWarps = kGThreads / 32;
constexpr int kL1Bins = 4096;  // bits 31..20
constexpr int kL2Bins = 4096;  // bits 19..8
constexpr int kL3Bins = 256;   // bits 7..0
constexpr int kGMaxChunks = kSelectGridMaxChunks;
constexpr int kExpBinLimit = 1024;  // the bins kernel's kBinExp: its scan scratch holds positions of slots >= this

// Per-head workspace layout (32-bit words); kSelectGridWsWords in kernels.h is its size.
constexpr int kWsH1 = 0;
constexpr int kWsH2 = kWsH1 + kL1Bins;      // [2][kL2Bins]
constexpr int kWsH3 = kWsH2 + 2 * kL2Bins;  // [2][kL3Bins]
constexpr int kWsCounts = kWsH3 + 2 * kL3Bins;  // [kGMaxChunks][4]: retrieval, estimation, tokens, -
constexpr int kWsTies = kWsCounts + 4 * kGMaxChunks;  // [kGMaxChunks][2]: ties of t1, of t2
constexpr int kWsBar = kWsTies + 2 * kGMaxChunks;     // count, generation
static_assert(kWsBar + 2 <= kSelectGridWsWords, "kSelectGridWsWords too small");
static_assert(kWsCounts == kSelectGridWsZeroWords && kWsBar == kSelectGridWsBarWord, "kernels.h's view of the layout");
static_assert(kWsH2 % 4 == 0 && kWsH3 % 4 == 0 && kSelectGridWsWords % 4 == 0, "16-byte histogram loads");

struct GridSmem {
  unsigned hist[kL1Bins];  // level-1 histogram of the chunk
  int wsum[3][kGWarps];
  int digit[2], rem[2], cnt[2];
  int finite;
  int base_ret, base_est, base_tok, tot_ret, tot_est, tot_tok, tie_base[2];
};

// Release / acquire fences at GPU scope (lighter than __threadfence's sequentially consistent fence; the
// barrier below is message passing, which they order).
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
__device__ __forceinline__ unsigned ld_acquire_gpu(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// The CTAs of one head meet: every CTA's writes before the call are visible to every CTA of the head after
// it (a grid barrier per head: count and generation; the last arriver resets the count and bumps the
// generation). __syncthreads makes the CTA's writes thread 0's to release (fences are cumulative).
__device__ __forceinline__ void head_barrier(unsigned* bar, unsigned ctas) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned g = ld_acquire_gpu(bar + 1);
    fence_acq_rel_gpu();
    if (atomicAdd(bar, 1u) == ctas - 1u) {
      atomicExch(bar, 0u);
      fence_acq_rel_gpu();
      atomicAdd(bar + 1, 1u);
    } else {
      while (ld_acquire_gpu(bar + 1) == g) __nanosleep(20);
    }
    fence_acq_rel_gpu();
  }
  __syncthreads();
}

// Inclusive scan of three ints over the CTA (all threads call); returns this thread's inclusive values in
// a, b, c and the CTA totals in ta, tb, tc.
__device__ __forceinline__ void cta_scan3(int& a, int& b, int& c, GridSmem& s, int* ta, int* tb, int* tc) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int ya = __shfl_up_sync(0xffffffffu, a, off), yb = __shfl_up_sync(0xffffffffu, b, off),
              yc = __shfl_up_sync(0xffffffffu, c, off);
    if (lane >= off) {
      a += ya;
      b += yb;
      c += yc;
    }
  }
  if (lane == 31) {
    s.wsum[0][warp] = a;
    s.wsum[1][warp] = b;
    s.wsum[2][warp] = c;
  }
  __syncthreads();
  int pa = 0, pb = 0, pc = 0, sa = 0, sb = 0, sc = 0;
#pragma unroll
  for (int w = 0; w < kGWarps; ++w) {
    const int xa = s.wsum[0][w], xb = s.wsum[1][w], xc = s.wsum[2][w];
    if (w < warp) {
      pa += xa;
      pb += xb;
      pc += xc;
    }
    sa += xa;
    sb += xb;
    sc += xc;
  }
  a += pa;
  b += pb;
  c += pc;
  *ta = sa;
  *tb = sb;
  *tc = sc;
  __syncthreads();  // wsum reusable
}

// One radix level of both thresholds from global histograms hj (j = 0, 1; may be the same array) of kBins
// bins: rank k[j] (1-based from the top, 0 = threshold off) -> s.digit[j], s.rem[j] (rank inside the digit),
// s.cnt[j] (items in the digit). level1: k[j] = min(budget[j], finite), finite = the histogram's total
// (into s.finite). Every CTA of the head reads the same counts, so finds the same digits.
template <int kBins>
__device__ __forceinline__ void find_digits(const unsigned* h0, const unsigned* h1, int k0, int k1, bool level1,
                                            GridSmem& s) {
  constexpr int kPer = kBins / kGThreads;
  static_assert(kBins % kGThreads == 0, "bins per thread");
  const int tid = threadIdx.x;
  // Thread t owns the bins kBins - 1 - kPer t - i (i < kPer), descending.
  // Loaded as 16-byte vectors (the thread's bins are contiguous: [kBins - kPer (t + 1), kBins - kPer t)), not
  // one word at a time (a warp's word loads 16 words apart touch 32 sectors each: ~4 us per level).
  unsigned c0[kPer], c1[kPer];
  int own0 = 0, own1 = 0;
  const int lo = kBins - kPer * (tid + 1);
  if constexpr (kPer % 4 == 0) {
#pragma unroll
    for (int v = 0; v < kPer / 4; ++v) {
      const uint4 a = __ldcg(reinterpret_cast<const uint4*>(h0 + lo) + v);
      const uint4 b = h1 == h0 ? a : __ldcg(reinterpret_cast<const uint4*>(h1 + lo) + v);
      // bin lo + 4 v + k is own index kPer - 1 - (4 v + k) (descending)
      c0[kPer - 1 - 4 * v] = a.x;
      c0[kPer - 2 - 4 * v] = a.y;
      c0[kPer - 3 - 4 * v] = a.z;
      c0[kPer - 4 - 4 * v] = a.w;
      c1[kPer - 1 - 4 * v] = b.x;
      c1[kPer - 2 - 4 * v] = b.y;
      c1[kPer - 3 - 4 * v] = b.z;
      c1[kPer - 4 - 4 * v] = b.w;
    }
  } else {
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int b = kBins - 1 - kPer * tid - i;
      c0[i] = __ldcg(h0 + b);
      c1[i] = h1 == h0 ? c0[i] : __ldcg(h1 + b);
    }
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    own0 += static_cast<int>(c0[i]);
    own1 += static_cast<int>(c1[i]);
  }
  int i0 = own0, i1 = own1, unused = 0, t0 = 0, t1 = 0, t2 = 0;
  cta_scan3(i0, i1, unused, s, &t0, &t1, &t2);
  int k[2] = {k0, k1};
  if (level1) {  // k0 / k1 are the budgets here
    k[0] = k0 < t0 ? k0 : t0;
    k[1] = k1 < t0 ? k1 : t0;
    if (tid == 0) s.finite = t0;
  }
  const int incl[2] = {i0, i1}, own[2] = {own0, own1};
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (k[j] > 0 && incl[j] - own[j] < k[j] && k[j] <= incl[j]) {
      int cum = incl[j] - own[j];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int c = static_cast<int>(j == 0 ? c0[i] : c1[i]);
        if (cum + c >= k[j]) {
          s.digit[j] = kBins - 1 - kPer * tid - i;
          s.rem[j] = k[j] - cum;
          s.cnt[j] = c;
          break;
        }
        cum += c;
      }
    }
    if (k[j] == 0 && tid == 0) {
      s.digit[j] = -1;
      s.rem[j] = 0;
      s.cnt[j] = 0;
    }
  }
  __syncthreads();
}

// Four of the thread's scores from shared memory in one 16-byte load (a thread's items are contiguous, so word
// loads would conflict 8 ways at 8 items per thread).
__device__ __forceinline__ void load4(const float* sc, int i, float (&f)[4]) {
  const float4 v = *reinterpret_cast<const float4*>(sc + i);
  f[0] = v.x;
  f[1] = v.y;
  f[2] = v.z;
  f[3] = v.w;
}

// Items of the thread whose key matches a threshold's prefix add their next digit into that threshold's
// histogram (one atomic per distinct digit per warp). want[j]: threshold j on; pre[j]: its prefix; shift:
// the prefix is key >> shift; digit = (key >> dshift) & dmask; dst[j]: its histogram (dst[1] == dst[0] when
// the two prefixes agree, then only threshold 0 adds).
__device__ __forceinline__ void add_level(const float* sc, int first, int ipt, const bool want[2], const uint32_t pre[2],
                                          int shift, int dshift, uint32_t dmask, unsigned* const dst[2]) {
  const int lane = threadIdx.x & 31;
  for (int i = 0; i < ipt; i += 4) {
    float f4[4];
    load4(sc, first + i, f4);
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const bool finite = f4[k] != -INFINITY;
      const uint32_t key = float_order_key(f4[k]);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (j == 1 && dst[1] == dst[0]) continue;
        const bool mine = finite && want[j] && (key >> shift) == pre[j];
        if (__ballot_sync(0xffffffffu, mine) == 0u) continue;  // warp-uniform: the common case
        const uint32_t d = mine ? (key >> dshift) & dmask : 0xffffffffu;
        const unsigned peers = __match_any_sync(0xffffffffu, d);
        if (mine && lane == __ffs(static_cast<int>(peers)) - 1)
          atomicAdd(dst[j] + d, static_cast<unsigned>(__popc(peers)));
      }
    }
  }
}

struct GridArgs {
  SelectParams p;
  int ipt, chunks;  // items per thread, CTAs per head
};

__global__ void __launch_bounds__(kGThreads) select_grid_kernel(const GridArgs a) {
  const SelectParams& p = a.p;
  const int ipt = a.ipt, chunks = a.chunks;
  __shared__ GridSmem s;
  extern __shared__ __align__(16) unsigned char gsm[];
  const int chunk = kGThreads * ipt;
  float* sc = reinterpret_cast<float*>(gsm);                          // [chunk]
  unsigned char* flag = gsm + size_t(chunk) * 4;                      // [chunk]: 1 retrieval, 2 estimation
  const int tab_n = chunk < p.k_retrieval ? chunk : (p.k_retrieval > 0 ? p.k_retrieval : 1);
  int* tab_b = reinterpret_cast<int*>(gsm + size_t(chunk) * 5);      // [tab_n] member begin
  int* tab_len = tab_b + tab_n;                                       // [tab_n] length
  int* tab_at = tab_len + tab_n;                                      // [tab_n] list position
  const int c = static_cast<int>(blockIdx.x), h = static_cast<int>(blockIdx.y);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int N = p.num_items, cbase = c * chunk;
  const int first = tid * ipt;  // the thread's items: cbase + first + i, i < ipt
  unsigned* ws = p.grid_ws + int64_t{h} * kSelectGridWsWords;
  unsigned* bar = ws + kWsBar;
  uint64_t* const phase = c == 0 ? p.phase : nullptr;
  const unsigned ctas = static_cast<unsigned>(chunks);
  for (int i = tid; i < kL1Bins; i += kGThreads) s.hist[i] = 0u;
  // The chunk's CSR offsets (index data, not written by the score kernel) on their way into L2 before the
  // PDL wait: step 4 reads those of the retrieval items.
  if (p.prefetch && p.page_tokens == 0 && p.offsets != nullptr)
    for (int i = cbase + tid * 32; i <= cbase + chunk && i <= N; i += kGThreads * 32)
      prefetch_l2(p.offsets + int64_t{h} * N + i);
  grid_dependency_wait();
  sel_stamp(phase, h, 0);
  // 0. scores (items past N: -inf, never picked).
  const float* gsc = p.scores + int64_t{h} * N;
  for (int i = tid; i < chunk; i += kGThreads) sc[i] = cbase + i < N ? __ldcg(gsc + cbase + i) : -INFINITY;
  __syncthreads();
  // 1. level-1 histogram.
  for (int i = 0; i < ipt; i += 4) {
    float f4[4];
    load4(sc, first + i, f4);
#pragma unroll
    for (int k = 0; k < 4; ++k)
      if (f4[k] != -INFINITY) atomicAdd(&s.hist[float_order_key(f4[k]) >> 20], 1u);
  }
  __syncthreads();
  for (int b = tid; b < kL1Bins; b += kGThreads) {
    const unsigned n = s.hist[b];
    if (n != 0u) atomicAdd(ws + kWsH1 + b, n);
  }
  sel_stamp(phase, h, 1);
  head_barrier(bar, ctas);
  // 2. level-1 digits (k = min(budget, finite)), then level 2.
  find_digits<kL1Bins>(ws + kWsH1, ws + kWsH1, p.k_retrieval, p.k_retrieval + p.k_estimation, true, s);
  const int finite = s.finite;
  const int k1 = p.k_retrieval < finite ? p.k_retrieval : finite;
  const int k2 = p.k_retrieval + p.k_estimation < finite ? p.k_retrieval + p.k_estimation : finite;
  const bool on[2] = {k1 > 0, k2 > 0};
  uint32_t pre[2] = {static_cast<uint32_t>(s.digit[0]), static_cast<uint32_t>(s.digit[1])};
  int rem[2] = {s.rem[0], s.rem[1]};
  {
    unsigned* dst[2] = {ws + kWsH2, ws + kWsH2 + kL2Bins};
    if (on[0] && on[1] && pre[0] == pre[1]) dst[1] = dst[0];
    add_level(sc, first, ipt, on, pre, 20, 8, 0xfffu, dst);
  }
  sel_stamp(phase, h, 2);
  head_barrier(bar, ctas);
  // Every CTA has read level 1: zero this CTA's part of it (for the next launch).
  for (int b = c * kL1Bins / chunks + tid; b < (c + 1) * kL1Bins / chunks; b += kGThreads) ws[kWsH1 + b] = 0u;
  // 3. level-2 digits, then level 3.
  {
    const bool shared2 = on[0] && on[1] && pre[0] == pre[1];
    const unsigned* h0 = ws + kWsH2;
    const unsigned* h1 = shared2 ? h0 : ws + kWsH2 + kL2Bins;
    find_digits<kL2Bins>(h0, h1, on[0] ? rem[0] : 0, on[1] ? rem[1] : 0, false, s);
    for (int j = 0; j < 2; ++j) {
      if (!on[j]) continue;
      pre[j] = pre[j] << 12 | static_cast<uint32_t>(s.digit[j]);
      rem[j] = s.rem[j];
    }
    unsigned* dst[2] = {ws + kWsH3, ws + kWsH3 + kL3Bins};
    if (on[0] && on[1] && pre[0] == pre[1]) dst[1] = dst[0];
    add_level(sc, first, ipt, on, pre, 8, 0, 0xffu, dst);
  }
  sel_stamp(phase, h, 3);
  head_barrier(bar, ctas);
  for (int b = c * (2 * kL2Bins) / chunks + tid; b < (c + 1) * (2 * kL2Bins) / chunks; b += kGThreads) ws[kWsH2 + b] = 0u;
  // 4. the thresholds and their takes.
  uint32_t t[2] = {0u, 0u};
  int take[2] = {0, 0};
  bool rank_ties = false;
  {
    const bool shared3 = on[0] && on[1] && pre[0] == pre[1];
    const unsigned* h0 = ws + kWsH3;
    const unsigned* h1 = shared3 ? h0 : ws + kWsH3 + kL3Bins;
    find_digits<kL3Bins>(h0, h1, on[0] ? rem[0] : 0, on[1] ? rem[1] : 0, false, s);
    for (int j = 0; j < 2; ++j) {
      if (!on[j]) continue;
      t[j] = pre[j] << 8 | static_cast<uint32_t>(s.digit[j]);
      take[j] = s.rem[j];
      if (take[j] != s.cnt[j]) rank_ties = true;  // some but not all of the threshold's ties are in
    }
  }
  sel_stamp(phase, h, 4);
  int tie_base[2] = {0, 0};
  if (rank_ties) {  // head-uniform: every CTA read the same third histograms
    int e0 = 0, e1 = 0;
    for (int i = 0; i < ipt; i += 4) {
      float f4[4];
      load4(sc, first + i, f4);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        if (f4[k] == -INFINITY) continue;
        const uint32_t key = float_order_key(f4[k]);
        e0 += on[0] && key == t[0];
        e1 += on[1] && key == t[1];
      }
    }
    int unused = 0, te0 = 0, te1 = 0, tu = 0;
    const int own0 = e0, own1 = e1;
    cta_scan3(e0, e1, unused, s, &te0, &te1, &tu);
    if (tid == 0) {
      ws[kWsTies + 2 * c] = static_cast<unsigned>(te0);
      ws[kWsTies + 2 * c + 1] = static_cast<unsigned>(te1);
    }
    head_barrier(bar, ctas);
    if (warp == 0) {
      int b0 = 0, b1 = 0;
      for (int x = lane; x < c; x += 32) {
        b0 += static_cast<int>(__ldcg(ws + kWsTies + 2 * x));
        b1 += static_cast<int>(__ldcg(ws + kWsTies + 2 * x + 1));
      }
      b0 = warp_sum_int(b0);
      b1 = warp_sum_int(b1);
      if (lane == 0) {
        s.tie_base[0] = b0;
        s.tie_base[1] = b1;
      }
    }
    __syncthreads();
    tie_base[0] = s.tie_base[0] + e0 - own0;  // the thread's first tie's rank in the head
    tie_base[1] = s.tie_base[1] + e1 - own1;
  }
  // Flags, the retrieval items' CSR ranges (their members prefetched into L2 for step 5) and the counts.
  int nr = 0, ne = 0, tok = 0;
  for (int i = 0; i < ipt; i += 4) {
    float f4[4];
    load4(sc, first + i, f4);
    uint32_t packed = 0u;  // the 4 flags, one byte each
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      unsigned fl = 0u;
      if (f4[k] != -INFINITY) {
        const uint32_t key = float_order_key(f4[k]);
        bool in[2];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          const bool tie = on[j] && key == t[j];
          in[j] = on[j] && (key > t[j] || (tie && (!rank_ties || tie_base[j] < take[j])));
          tie_base[j] += tie;
        }
        if (in[0]) fl = 1u;
        else if (in[1] && p.estimation_ids != nullptr) fl = 2u;
      }
      packed |= fl << (8 * k);
      nr += fl == 1u;
      ne += fl == 2u;
    }
    *reinterpret_cast<uint32_t*>(flag + first + i) = packed;
  }
  // The thread's retrieval items' lengths (loads of all its items in flight), in id order.
  for (int i = 0; i < ipt; ++i) {
    if (flag[first + i] != 1) continue;
    tok += item_tokens(p, h, cbase + first + i, p.prefetch).length;
  }
  int ir = nr, ie = ne, it_ = tok, tr = 0, te = 0, tt = 0;
  cta_scan3(ir, ie, it_, s, &tr, &te, &tt);
  // The chunk's expansion table (local slots and token offsets, positions made absolute in step 5).
  {
    int slot = ir - nr, at = it_ - tok;
    for (int i = 0; i < ipt; ++i) {
      if (flag[first + i] != 1) continue;
      const ItemTokens itk = item_tokens(p, h, cbase + first + i, false);
      tab_b[slot] = itk.begin;
      tab_len[slot] = itk.length;
      tab_at[slot] = at;
      at += itk.length;
      ++slot;
    }
  }
  if (tid == 0) {
    ws[kWsCounts + 4 * c] = static_cast<unsigned>(tr);
    ws[kWsCounts + 4 * c + 1] = static_cast<unsigned>(te);
    ws[kWsCounts + 4 * c + 2] = static_cast<unsigned>(tt);
  }
  sel_stamp(phase, h, 5);
  head_barrier(bar, ctas);
  // Past the last barrier: the exact-attention CTAs may launch.
  grid_launch_dependents();
  // 5. bases from the chunks before this one, totals from all.
  const int64_t w_begin = p.idx_begin + p.n_idx;
  const int steady = static_cast<int>(p.idx_begin + (p.num_tokens - w_begin));
  if (warp == 0) {
    int br = 0, be = 0, bt = 0, sr = 0, se = 0, st = 0;
    for (int x = lane; x < chunks; x += 32) {
      const int r = static_cast<int>(__ldcg(ws + kWsCounts + 4 * x));
      const int e = static_cast<int>(__ldcg(ws + kWsCounts + 4 * x + 1));
      const int k = static_cast<int>(__ldcg(ws + kWsCounts + 4 * x + 2));
      if (x < c) {
        br += r;
        be += e;
        bt += k;
      }
      sr += r;
      se += e;
      st += k;
    }
    br = warp_sum_int(br);
    be = warp_sum_int(be);
    bt = warp_sum_int(bt);
    sr = warp_sum_int(sr);
    se = warp_sum_int(se);
    st = warp_sum_int(st);
    if (lane == 0) {
      s.base_ret = br;
      s.base_est = be;
      s.base_tok = steady + bt;
      s.tot_ret = sr;
      s.tot_est = se;
      s.tot_tok = st;
    }
  }
  // Every CTA has read the third histograms: zero this CTA's part.
  for (int b = c * (2 * kL3Bins) / chunks + tid; b < (c + 1) * (2 * kL3Bins) / chunks; b += kGThreads) ws[kWsH3 + b] = 0u;
  __syncthreads();
  const int base_ret = s.base_ret, base_est = s.base_est, base_tok = s.base_tok;
  int* ret = p.retrieval_ids + int64_t{h} * p.k_retrieval;
  int* est = p.estimation_ids != nullptr ? p.estimation_ids + int64_t{h} * p.k_estimation : nullptr;
  int* pre_s = p.scan_scratch + int64_t{h} * (p.k_retrieval + 1);
  {
    int r = base_ret + ir - nr, e = base_est + ie - ne, slot = ir - nr;
    for (int i = 0; i < ipt; ++i) {
      const unsigned char fl = flag[first + i];
      if (fl == 1) {
        ret[r] = cbase + first + i;
        const int at = base_tok + tab_at[slot];
        tab_at[slot] = at;
        if (r >= kExpBinLimit) pre_s[r] = at;
        ++r;
        ++slot;
      } else if (fl == 2) {
        est[e++] = cbase + first + i;
      }
    }
  }
  // Padding (-1) past the head's lists, spread over the head's CTAs.
  for (int i = s.tot_ret + c * kGThreads + tid; i < p.k_retrieval; i += chunks * kGThreads) ret[i] = -1;
  if (est != nullptr)
    for (int i = s.tot_est + c * kGThreads + tid; i < p.k_estimation; i += chunks * kGThreads) est[i] = -1;
  int* list = p.token_list + int64_t{h} * p.list_stride;
  if (c == 0) {
    for (int i = tid; i < steady; i += kGThreads)
      list[i] = static_cast<int>(i < p.idx_begin ? i : w_begin + (i - p.idx_begin));
    if (tid == 0) p.token_count[h] = steady + s.tot_tok;
  }
  __syncthreads();  // the table's absolute positions
  sel_stamp(phase, h, 6);
  // Expansion: a half-warp per retrieval item of the chunk.
  const int sub = 16, slot0 = warp * 2 + lane / sub, sl = lane % sub;
  for (int i = slot0; i < tr; i += kGWarps * 2) {
    const int b = tab_b[i], at = tab_at[i], n = tab_len[i];
    if (p.page_tokens > 0) {
      for (int x = sl; x < n; x += sub) list[at + x] = static_cast<int>(p.idx_begin + b + x);
    } else {
      for (int x = sl; x < n; x += sub) list[at + x] = static_cast<int>(p.idx_begin + p.members[b + x]);
    }
  }
  if (phase != nullptr) {
    __syncthreads();
    sel_stamp(phase, h, 7);
  }
}

constexpr size_t kGridMaxSmem = 160 * 1024;  // the kernel's dynamic shared-memory attribute

// Dynamic shared memory of a launch with `ipt` items per thread.
size_t grid_smem_bytes(int ipt, int k_retrieval) {
  const int chunk = kGThreads * ipt;
  const int tab_n = chunk < k_retrieval ? chunk : (k_retrieval > 0 ? k_retrieval : 1);
  return size_t(chunk) * 5 + size_t(tab_n) * 12 + 16;
}

// CTAs of select_grid_kernel that the current device holds at once with `smem` bytes of dynamic shared memory
// (the last answer kept per thread for the same device and bytes).
cudaError_t grid_capacity(size_t smem, int* capacity) {
  thread_local int last_device = -1, last_capacity = 0;
  thread_local size_t last_bytes = 0;
  *capacity = 0;
  if (smem > kGridMaxSmem) return cudaSuccess;
  int device = 0;
  cudaError_t e = cudaGetDevice(&device);
  if (e != cudaSuccess) return e;
  if (device != last_device || smem != last_bytes) {
    static bool attr_set = false;
    if (!attr_set) {
      e = cudaFuncSetAttribute(select_grid_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               static_cast<int>(kGridMaxSmem));
      if (e != cudaSuccess) return e;
      attr_set = true;
    }
    int sms = 0, per_sm = 0;
    e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess) return e;
    e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, select_grid_kernel, kGThreads, smem);
    if (e != cudaSuccess) return e;
    last_device = device;
    last_bytes = smem;
    last_capacity = sms * per_sm;
  }
  *capacity = last_capacity;
  return cudaSuccess;
}

}  // namespace

cudaError_t select_grid_capacity(int ipt, int k_retrieval, int* ctas) {
  return grid_capacity(grid_smem_bytes(ipt, k_retrieval), ctas);
}

cudaError_t select_grid_plan(const SelectParams& p, int* ipt, int* chunks) {
  *ipt = 0;
  *chunks = 0;
  if (p.grid_ws == nullptr || p.group != 0 || p.num_items <= 0 || p.num_heads <= 0 || p.scores == nullptr)
    return cudaSuccess;
  for (int i = 8; i <= 64; i *= 2) {
    const int64_t chunk = int64_t{kGThreads} * i;
    const int64_t c = (p.num_items + chunk - 1) / chunk;
    if (c > kGMaxChunks) continue;
    int capacity = 0;
    const cudaError_t e = grid_capacity(grid_smem_bytes(i, p.k_retrieval), &capacity);
    if (e != cudaSuccess) return e;
    if (int64_t{p.num_heads} * c > capacity) continue;
    *ipt = i;
    *chunks = static_cast<int>(c);
    return cudaSuccess;
  }
  return cudaSuccess;
}

cudaError_t select_and_expand_grid(const SelectParams& p, int ipt, int chunks, cudaStream_t s) {
  if (ipt <= 0 || chunks <= 0 || p.grid_ws == nullptr) return cudaErrorInvalidValue;
  const size_t smem = grid_smem_bytes(ipt, p.k_retrieval);
  if (smem > kGridMaxSmem) return cudaErrorInvalidConfiguration;
  int capacity = 0;
  const cudaError_t e = grid_capacity(smem, &capacity);  // also sets the shared-memory attribute
  if (e != cudaSuccess) return e;
  if (int64_t{p.num_heads} * chunks > capacity) return cudaErrorInvalidConfiguration;  // would not be resident at once
  // A cooperative launch: every CTA resident at once even beside other streams' kernels (the per-head
  // barriers cannot deadlock), and with p.pdl also a programmatic dependent of the score grid. Where the
  // driver refuses the pair, the cooperative launch alone (remembered per process).
  // pair: -1 not yet tried, 1 taken, 0 refused. Inside a stream capture it is not tried (a refused launch
  // could end the capture); the decode layers launch eagerly before they capture.
  static int pair = -1;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  if (p.pdl && pair < 0) {
    const cudaError_t ce = cudaStreamIsCapturing(s, &capturing);
    if (ce != cudaSuccess) return ce;
  }
  const bool try_pair = p.pdl && (pair == 1 || (pair < 0 && capturing == cudaStreamCaptureStatusNone));
  const GridArgs args{p, ipt, chunks};
  cudaLaunchAttribute attr[2] = {};
  attr[0].id = cudaLaunchAttributeCooperative;
  attr[0].val.cooperative = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(chunks), static_cast<unsigned>(p.num_heads));
  cfg.blockDim = dim3(kGThreads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = try_pair ? 2 : 1;
  cudaError_t le = cudaLaunchKernelEx(&cfg, select_grid_kernel, args);
  if (try_pair && pair < 0) {
    pair = le == cudaSuccess ? 1 : 0;
    if (le != cudaSuccess) {
      (void)cudaGetLastError();
      cfg.numAttrs = 1;
      le = cudaLaunchKernelEx(&cfg, select_grid_kernel, args);
    }
  }
  return le;
}

}  // namespace retroinfer::cuda::detail
