// Zone selection with a handful of barriers (docs/design.md §2 "Scoring"), the one-CTA-per-head selection up to
// kSelectBinsMaxItems = 40960 items (select.cu). Same result as the other selection kernels: "sort by (score
// desc, id asc) and cut at k_r and k_r + k_e", ids ascending, the retrieval items expanded into the head's
// exact-token list (steady zone first).
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/kernels.h"
#include "kernels/select_common.cuh"

namespace retroinfer::cuda::detail {

namespace {

// An exact radix select (select_common.cuh radix_select2) is a chain of ~30 block barriers plus three
// warp-aggregated histogram passes (__match_any_sync per item and threshold). This kernel finds both
// thresholds with ONE histogram:
//   1. scores (sum over the group of the per-head softmax), and the smallest / largest order key of the
//      finite scores (one block reduction);
//   2. one histogram of kBinBins bins over the key adapted to that range, bin = (key - lo) >> shift with the
//      smallest shift that fits the range into the bins (monotone in the key, so higher bins hold strictly
//      higher keys); one block scan finds the bins holding rank k1 and rank k2 and the ranks inside them;
//   3. the keys of those (at most two) bins gathered into shared memory; each candidate counts the
//      candidates above and equal to it, and the one whose (>, >=) counts bracket the rank is the threshold
//      (exact: the same k-th key as the radix passes, with `take` = how many of its ties are in);
//      a bin with more than kBinCand candidates (long runs of exact ties) falls back to the radix passes;
//   4. one compaction in ascending id order (compact_ballot), the tie-ranking pass only when a threshold
//      takes some but not all of its ties (the CPU rule: ties in id order);
//   5. expansion warp by warp from shared memory.
// About 13 barriers in all. Scores must fit shared memory (<= 40960 items).
constexpr int kBinBins = 4096;
constexpr int kBinBits = 12;  // log2(kBinBins)
constexpr int kBinBinsPerThread = kBinBins / kSelThreads;
constexpr int kBinCand = 1024;  // candidates kept per threshold bin (8 KiB for both)
constexpr int kBinExp = 1024;   // retrieval items whose (begin, position, length) stay in shared memory
static_assert(kBinBins == 1 << kBinBits && kBinBins % kSelThreads == 0 && kBinBins <= 2 * kRadixBins,
              "the bin histogram reuses SelectSmem::hist");

struct BinSmem {
  uint32_t cand[2][kBinCand];
  int cand_n[2];
  int exp_begin[kBinExp], exp_at[kBinExp], exp_len[kBinExp];
  uint32_t wmin[kSelWarps], wmax[kSelWarps];
  int found_bin[2], found_rem[2];
  uint32_t thr[2];
  int take[2], eq[2];
};

// ---- The warp-range compaction ----
// Warp w owns the contiguous items [w seg, (w + 1) seg) (seg a multiple of kCompactStep = 256) and walks
// them in steps of two halves of 128 items, lane l holding the 4 items 4l .. 4l + 3 of each half (one
// conflict-free float4 load each), so an item's slot is the warp's base + the warp's count so far + (in the
// second half) the first half's count + the lane's exclusive prefix in the half + its rank among the lane's
// 4: ascending ids. One warp scan per step serves both halves and both lists (four 8-bit counts packed in
// one int: <= 128 each). (Giving thread t the 8 items 8t .. 8t + 7 instead costs 8-way shared-memory bank
// conflicts on the scores, ~760 straight-line instructions per warp and the retrieval items' CSR loads one
// after another: ~8.5 against ~3.7 us at 8188 items.)
//   pass 0 (only when a threshold takes some but not all of its ties): per warp, the ties of t1 and t2;
//   pass 1: per warp, the retrieval and estimation counts; each step's 16 flags kept in registers;
//   pass 2: the ids at their slots (retrieval ids < kBinExp also into the expansion table);
//   slots: thread s takes retrieval slot s: its CSR offsets (all loads of the block in flight at once),
//          the members' L2 prefetch, a block scan of the lengths for the token positions.
// One barrier after each pass and one in the slot scan (each barrier's per-warp sums are scanned by every
// warp itself), then the kernel's barrier before the expansion.
constexpr int kCompactHalf = 128;               // items of half a step: 4 per lane
constexpr int kCompactStep = 2 * kCompactHalf;  // items per warp step
constexpr int kCompactMaxSteps = 6;             // three 32-bit words of 16 flag bits per step, per lane
// The bins kernel takes <= 40960 items (160 KiB of scores): seg <= 1280, 5 steps; the per-warp counts
// (<= seg) fit 16-bit halves, the totals (<= 40960) too.
static_assert(40960 / kSelWarps <= kCompactMaxSteps * kCompactStep && 40960 < 65536, "compaction layout");

// Items rounded up to whole float4 loads; the kernel sets the scores [N, compact_padded(N)) to -inf.
__host__ __device__ __forceinline__ int compact_padded(int n) { return (n + 3) & ~3; }

// The cut of the compaction: items with key > t, or == t within the first `take` ties (ascending ids) when
// ties are ranked (all ties otherwise), of a threshold that is on (k > 0).
struct CompactCut {
  uint32_t t1, t2;
  int take1, take2;
  bool on1, on2;
};

struct CompactSmem {
  unsigned ties[kSelWarps];    // pass 0: per warp, ties of t1 + (ties of t2 << 16)
  unsigned counts[kSelWarps];  // pass 1: per warp, retrieval items + (estimation items << 16)
};

// Packed counters are unsigned: a field may reach bit 31.
template <typename T>
__device__ __forceinline__ T warp_inclusive_scan(T x, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const T y = __shfl_up_sync(0xffffffffu, x, off);
    if (lane >= off) x += y;
  }
  return x;
}

// Every warp calls this after the barrier that follows lane 0 of each warp w publishing its value: lane l
// passes warp l's value x; returns the sum over the warps before `warp`, and *total the sum over all.
template <typename T>
__device__ __forceinline__ T warp_base(T x, int warp, int lane, T* total) {
  const T incl = warp_inclusive_scan(x, lane);
  *total = __shfl_sync(0xffffffffu, incl, 31);
  return __shfl_sync(0xffffffffu, incl - x, warp);
}

// The lane's 4 items i4 .. i4 + 3 of the padded scores (-inf from compact_padded(N) on).
__device__ __forceinline__ float4 compact_load(const float* sc, int i4, int n4) {
  return i4 < n4 ? *reinterpret_cast<const float4*>(sc + i4) : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
}

// float_order_key in a shift and one 3-input logic op after -0 -> +0 (the same key, -0 and +0 tied).
__device__ __forceinline__ uint32_t order_key(float f) {
  const uint32_t b = f == 0.0f ? 0u : __float_as_uint(f);
  return b ^ (static_cast<uint32_t>(static_cast<int32_t>(b) >> 31) | 0x80000000u);
}

// Flags of one step: bits 0-3 retrieval, 4-7 estimation (item i4 + j at bit j): retrieval = in the first
// cut, estimation = in the second and not the first. kTies: r1 / r2 are the warp's tie ranks at the step's
// first item (warp-uniform), advanced past the step. Without ranked ties every tie is in and the -inf test is
// implied: a threshold that is on is then the key of a candidate, a finite item, above key(-inf) = 0x007fffff
// (with ranked ties it may come from the radix passes, whose thresholds are 0 when k1 = 0: the -inf test is
// kept there).
template <bool kTies>
__device__ __forceinline__ uint32_t compact_flags(const float4 v, const CompactCut& c, int lane, int& r1, int& r2) {
  const float f[4] = {v.x, v.y, v.z, v.w};
  uint32_t u[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) u[j] = order_key(f[j]);
  uint32_t m1 = 0u, m2 = 0u;
  if constexpr (!kTies) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      m1 |= (u[j] >= c.t1 ? 1u : 0u) << j;
      m2 |= (u[j] >= c.t2 ? 1u : 0u) << j;
    }
    if (!c.on1) m1 = 0u;
    if (!c.on2) m2 = 0u;
  } else {
    bool ok[4], q1[4], q2[4];
    int e12 = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      ok[j] = f[j] != -INFINITY;
      q1[j] = ok[j] && c.on1 && u[j] == c.t1;
      q2[j] = ok[j] && c.on2 && u[j] == c.t2;
      e12 += (q1[j] ? 1 : 0) + (q2[j] ? 1 << 16 : 0);
    }
    const int incl = warp_inclusive_scan(e12, lane), excl = incl - e12, tot = __shfl_sync(0xffffffffu, incl, 31);
    int a = r1 + (excl & 0xffff), b = r2 + (excl >> 16);  // <= 128 per field
    r1 += tot & 0xffff;
    r2 += tot >> 16;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      m1 |= (ok[j] && c.on1 && (u[j] > c.t1 || (q1[j] && a < c.take1)) ? 1u : 0u) << j;
      m2 |= (ok[j] && c.on2 && (u[j] > c.t2 || (q2[j] && b < c.take2)) ? 1u : 0u) << j;
      a += q1[j];
      b += q2[j];
    }
  }
  return m1 | ((m2 & ~m1) << 4);
}

// The retrieval slots of compact_ballot (after its pass 2).
__device__ __forceinline__ void compact_slots(const SelectParams& p, int h, BinSmem& bs, const int* ret, int* pre,
                                              int steady, int out1, int& running) {
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  __syncthreads();
  // Slot s = chunk + tid: its item's (begin, length), with p.prefetch its members on their way into L2 (the
  // expansion reads them after the barrier), and its token position by a block scan of the lengths in slot
  // (= id) order. One chunk (one barrier) up to kSelThreads retrieval items.
  __shared__ int chunk_sums[2][kSelWarps];
  int at0 = steady;
  for (int s0 = 0, chunk = 0; s0 < out1; s0 += kSelThreads, ++chunk) {
    const int s = s0 + tid;
    int b = 0, n = 0;
    if (s < out1) {
      const ItemTokens it = item_tokens(p, h, s < kBinExp ? bs.exp_begin[s] : ret[s], p.prefetch);
      b = it.begin;
      n = it.length;
    }
    // Warp-uniform: a warp past the last slot has nothing to scan.
    const int incl = s0 + 32 * warp < out1 ? warp_inclusive_scan(n, lane) : 0;
    if (lane == 31) chunk_sums[chunk & 1][warp] = incl;
    __syncthreads();  // the parity buffers: chunk c + 2 writes after every thread read chunk c's (barrier c + 1)
    int total;
    const int at = at0 + warp_base(chunk_sums[chunk & 1][lane], warp, lane, &total) + incl - n;
    if (s < out1) {
      if (s < kBinExp) {
        bs.exp_begin[s] = b;
        bs.exp_at[s] = at;
        bs.exp_len[s] = n;
      } else {
        pre[s] = at;
      }
    }
    at0 += total;
  }
  running = at0;
}

// The compaction of head h (all threads call; the caller stamps before and barriers after): ret / est
// ids at [0, out1) / [0, out2), the expansion table bs.exp_* of slots < kBinExp, pre[s] = token position of
// slots >= kBinExp, running = steady + the retrieval items' tokens (the caller's padding, steady list and
// barrier follow).
template <bool kTies>
__device__ __forceinline__ void compact_ballot(const SelectParams& p, int h, const float* sc, const CompactCut& cut,
                                               BinSmem& bs, int* ret, int* est, int* pre, int steady, int& out1,
                                               int& out2, int& running) {
  __shared__ CompactSmem cs;
  const int N = p.num_items, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int n4 = compact_padded(N);
  // Unsigned: the divisions are shifts.
  const unsigned seg = ((unsigned(N) + kSelWarps - 1) / kSelWarps + kCompactStep - 1) / kCompactStep * kCompactStep;
  const int wbeg = static_cast<int>(warp * seg);
  const int steps = wbeg < n4 ? static_cast<int>((min(seg, unsigned(n4 - wbeg)) + kCompactStep - 1) / kCompactStep)
                              : 0;  // warp-uniform
  const int lane_first = wbeg + 4 * lane;  // the lane's first item in step 0
  // Pass 0 (kTies): the warp's tie ranks r1 / r2 at its first item.
  int r1 = 0, r2 = 0;
  if constexpr (kTies) {
    unsigned e12 = 0u;  // packed: <= seg ties per warp
    for (int i4 = lane_first; i4 < lane_first + steps * kCompactStep; i4 += kCompactHalf) {
      const float4 v = compact_load(sc, i4, n4);
      const float f[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const bool ok = f[j] != -INFINITY;
        const uint32_t u = float_order_key(f[j]);
        e12 += (ok && cut.on1 && u == cut.t1 ? 1u : 0u) + (ok && cut.on2 && u == cut.t2 ? 1u << 16 : 0u);
      }
    }
    e12 = __reduce_add_sync(0xffffffffu, e12);
    if (lane == 0) cs.ties[warp] = e12;
    __syncthreads();
    unsigned unused;
    const unsigned b12 = warp_base(cs.ties[lane], warp, lane, &unused);  // packed: <= 40960 ties in all
    r1 = static_cast<int>(b12 & 0xffffu);
    r2 = static_cast<int>(b12 >> 16);
  }
  // Pass 1: the flags of every step (16 bits a step: step s at bit 16 (s % 2) of word s / 2; the first
  // half's 8 flags below the second's) and the counts.
  uint32_t fw0 = 0u, fw1 = 0u, fw2 = 0u;
  unsigned c12 = 0u;  // packed: <= seg items per warp
  for (int s = 0; s < steps; ++s) {
    const int i4 = lane_first + s * kCompactStep;
    const float4 va = compact_load(sc, i4, n4), vb = compact_load(sc, i4 + kCompactHalf, n4);
    const uint32_t fa = compact_flags<kTies>(va, cut, lane, r1, r2);
    const uint32_t fb = compact_flags<kTies>(vb, cut, lane, r1, r2);
    const uint32_t f = fa | fb << 8;
    c12 += static_cast<unsigned>(__popc(f & 0x0f0fu)) + (static_cast<unsigned>(__popc(f & 0xf0f0u)) << 16);
    const uint32_t x = f << (16 * (s & 1));
    if (s < 2) fw0 |= x;
    else if (s < 4) fw1 |= x;
    else fw2 |= x;
  }
  c12 = __reduce_add_sync(0xffffffffu, c12);
  if (lane == 0) cs.counts[warp] = c12;
  __syncthreads();
  int rbase, ebase;
  {
    unsigned t12;
    const unsigned b12 = warp_base(cs.counts[lane], warp, lane, &t12);  // packed: <= 40960 items in all
    rbase = static_cast<int>(b12 & 0xffffu);
    ebase = static_cast<int>(b12 >> 16);
    out1 = static_cast<int>(t12 & 0xffffu);
    out2 = static_cast<int>(t12 >> 16);
  }
  // Pass 2: the ids at their slots (retrieval slots < kBinExp: the id also into bs.exp_begin for below).
  if (est == nullptr) {  // k_estimation = 0: both cuts are the same (no estimation flag to write)
    fw0 &= 0x0f0f0f0fu;
    fw1 &= 0x0f0f0f0fu;
    fw2 &= 0x0f0f0f0fu;
  }
  for (int s = 0; s < steps; ++s) {
    const uint32_t word = s < 2 ? fw0 : (s < 4 ? fw1 : fw2);
    const uint32_t f = (word >> (16 * (s & 1))) & 0xffffu;
    // Packed counts: retrieval / estimation of the first half, then of the second (8 bits each).
    const unsigned c = static_cast<unsigned>(__popc(f & 0x000fu) | __popc(f & 0x00f0u) << 8 |
                                             __popc(f & 0x0f00u) << 16) |
                       static_cast<unsigned>(__popc(f & 0xf000u)) << 24;
    const unsigned incl = warp_inclusive_scan(c, lane), excl = incl - c, tot = __shfl_sync(0xffffffffu, incl, 31);
    const int ra = static_cast<int>(tot & 0xffu), ea = static_cast<int>((tot >> 8) & 0xffu);  // the first half's
    int wr = rbase + static_cast<int>(excl & 0xffu), we = ebase + static_cast<int>((excl >> 8) & 0xffu);
    int wr2 = rbase + ra + static_cast<int>((excl >> 16) & 0xffu), we2 = ebase + ea + static_cast<int>(excl >> 24);
    rbase += ra + static_cast<int>((tot >> 16) & 0xffu);
    ebase += ea + static_cast<int>(tot >> 24);
    const int i4 = lane_first + s * kCompactStep;
    // Estimation (~23% of the items at the default budgets): predicated stores.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      int& e = j < 4 ? we : we2;
      if (f >> (j < 4 ? j + 4 : j + 8) & 1u) est[e++] = i4 + (j < 4 ? j : kCompactHalf + j - 4);
    }
    // Retrieval (~2%): a loop over the lane's set flags, about one round per step for the warp.
    for (uint32_t rb = (f & 0xfu) | ((f >> 4) & 0xf0u); rb != 0u; rb &= rb - 1u) {
      const int j = __ffs(static_cast<int>(rb)) - 1;
      const int id = i4 + (j < 4 ? j : kCompactHalf + j - 4);
      const int r = j < 4 ? wr++ : wr2++;
      ret[r] = id;
      if (r < kBinExp) bs.exp_begin[r] = id;
    }
  }
  compact_slots(p, h, bs, ret, pre, steady, out1, running);
}

// Head h's scores formed by the selection itself (group > 0) from its logits lgh [G][N] and the score grid's
// normaliser partials, where G <= 4, N % 4 == 0 and the logits / scores are 16-byte aligned. Thread t takes
// the item quads t, t + blockDim.x, ... by one float4 load per query head, kQ quads in flight, the
// normaliser's first partials issued before them. Each score is form_head_score's sum of the same terms in
// the same order, so the same bits; the kernel's range reduction (kmin / kmax) and the scores in shared
// memory (sc) and global memory (gsc) as the general path. The general path (form_head_score per item, below)
// takes ~9 us for 8188 items on this one multiprocessor (per item a branch per query head, M_g and 1 / L_g
// reloaded from shared memory per term, __expf's denormal path); this one ~4.2, of which ~1 is the
// normaliser merge's round trip and tree.
// log2(e) in f32, the factor __expf applies before its MUFU.EX2; ex2_approx: that instruction (ex2.approx.ftz), which
// equals __expf's for arguments >= -126 (normal results).
constexpr float kLog2eF = 1.4426950408889634f;
__device__ __forceinline__ float ex2_approx(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(x));
  return r;
}

template <int kGM, int kQ>
__device__ __forceinline__ void scores_from_logit_quads(const SelectParams& p, int h, const float* lgh, float* gmax,
                                                        float* ginv, float* gsc, float* sc, uint32_t& kmin,
                                                        uint32_t& kmax) {
  const int N = p.num_items, G = p.group, tid = static_cast<int>(threadIdx.x), warp = tid >> 5;
  const int nq = N >> 2, step = static_cast<int>(blockDim.x);
  float4 v[kQ][kGM];
  auto load = [&](int q0) {
#pragma unroll
    for (int b = 0; b < kQ; ++b)
#pragma unroll
      for (int g = 0; g < kGM; ++g) {
        const int q = q0 + b * step;
        v[b][g] = g < G && q < nq ? __ldg(reinterpret_cast<const float4*>(lgh + int64_t{g} * N) + q)
                                  : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
  };
  // The normaliser's first partials before the logit loads (behind them they would arrive ~1 us later).
  const float2* part = p.norm_partial + (int64_t{h} * G + (warp < G ? warp : 0)) * p.norm_parts;
  const int lane = tid & 31;
  const float2 first = warp < G && lane < p.norm_parts ? __ldcg(part + lane) : make_float2(-INFINITY, 0.0f);
  if (tid < nq) load(tid);
  if (warp < G) merge_head_normaliser_first(part, p.norm_parts, first, warp, gmax, ginv);
  __syncthreads();
  // The normaliser in registers, heads >= G padded with (0, 0): with their logits read as 0 a padded head adds
  // e^0 * 0 = 0 to the sum, which leaves it bit for bit (s + 0 == s for the sums >= 0 formed here).
  float gm[kGM], gi[kGM];
#pragma unroll
  for (int g = 0; g < kGM; ++g) {
    gm[g] = g < G ? gmax[g] : 0.0f;
    gi[g] = g < G ? ginv[g] : 0.0f;
  }
  uint32_t bmin = 0xffffffffu, bmax = 0u;  // the bits of this thread's finite scores
  for (int q0 = tid; q0 < nq; q0 += kQ * step) {
    if (q0 != tid) load(q0);
#pragma unroll
    for (int b = 0; b < kQ; ++b) {
      const int q = q0 + b * step;
      if (q >= nq) break;
      float s4[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        // The same terms in the same order (FFMA, as form_head_score's s += e * (1 / L) compiles), -inf for an
        // empty item. __expf(x) is MUFU.EX2 of x log2(e) where that is >= -126 (else it halves, exponentiates and
        // squares: its non-ftz path), so ex2_approx gives its bits there; an item whose smallest exponent is below
        // takes __expf itself. A -inf logit gives ex2(-inf) = +0, an exact no-op term (and an empty item).
        // Per term 6 instructions: FADD, FMUL, FMNMX, MUFU, FFMA and the -inf test.
        float sum = 0.0f, xmin = 0.0f;
        bool empty = false;
#pragma unroll
        for (int g = 0; g < kGM; ++g) {
          const float l = (&v[b][g].x)[j];
          const float x = (l - gm[g]) * kLog2eF;
          empty = empty | (l == -INFINITY);
          xmin = fminf(xmin, x);
          sum = fmaf(ex2_approx(x), gi[g], sum);
        }
        if (!empty && xmin < -126.0f) {  // rare (a logit ~87 below its head's largest): __expf's own denormal path
          sum = 0.0f;
#pragma unroll
          for (int g = 0; g < kGM; ++g) sum = fmaf(__expf((&v[b][g].x)[j] - gm[g]), gi[g], sum);
        }
        s4[j] = empty ? -INFINITY : sum;
        // The range reduction on the raw bits: a formed score is +0 or positive (a sum of terms >= 0 from +0),
        // where float_order_key is the bits | 2^31, so the min / max of the bits give the keys' (set below).
        if (!empty) {
          bmin = min(bmin, __float_as_uint(sum));
          bmax = max(bmax, __float_as_uint(sum));
        }
      }
      const float4 s = make_float4(s4[0], s4[1], s4[2], s4[3]);
      *reinterpret_cast<float4*>(sc + 4 * q) = s;
      *reinterpret_cast<float4*>(gsc + 4 * q) = s;
    }
  }
  if (bmin <= bmax) {  // some finite score: float_order_key of a non-negative float (+0 included: bits 0)
    kmin = min(kmin, bmin | 0x80000000u);
    kmax = max(kmax, bmax | 0x80000000u);
  }
}

__global__ void __launch_bounds__(kSelThreads) select_bins_kernel(const SelectParams p) {
  __shared__ SelectSmem sm;
  __shared__ BinSmem bs;
  // 16-byte aligned: the compaction reads the scores as float4 (padded with -inf to a multiple of 4).
  extern __shared__ __align__(16) float smem_scores[];
  const int h = static_cast<int>(blockIdx.x);
  uint64_t* const phase = p.phase;
  const int N = p.num_items, G = p.group, tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  float* gsc = p.scores + int64_t{h} * N;
  float* sc = smem_scores;
  unsigned* hist = &sm.hist[0][0];  // kBinBins counters
  for (int i = tid; i < kBinBins; i += blockDim.x) hist[i] = 0u;
  if (tid < 2) bs.cand_n[tid] = 0;
  if (tid < compact_padded(N) - N) sc[N + tid] = -INFINITY;  // read by no phase before the compaction
  // PDL (p.pdl): let the exact-attention CTAs launch (they wait for this grid in turn), then wait for the
  // score kernel's logits and partials. Nothing the score kernel writes is read before the wait.
  grid_launch_dependents();
  // With p.prefetch: the head's CSR offsets (index data, not written by the score kernel) on their way into
  // L2 before the wait; the compaction reads those of the retrieval items.
  if (p.prefetch && p.page_tokens == 0 && p.offsets != nullptr)
    for (int i = tid * 32; i <= N; i += blockDim.x * 32) prefetch_l2(p.offsets + int64_t{h} * N + i);
  grid_dependency_wait();
  sel_stamp(phase, h, 0);
  uint32_t kmin = 0xffffffffu, kmax = 0u;
  if (G > 0) {
    __shared__ float gmax[kMaxGroup], ginv[kMaxGroup];
    const float* lgh = p.logits + int64_t{h} * G * N;
    const bool quads = (N & 3) == 0 && (reinterpret_cast<uintptr_t>(p.logits) & 15) == 0 &&
                       (reinterpret_cast<uintptr_t>(p.scores) & 15) == 0;  // CTA-uniform
    // (G > 4: the general path; a kGM = 8 instance would take the kernel past its 64 registers into spills.)
    if (quads && G <= 4) {
      scores_from_logit_quads<4, 2>(p, h, lgh, gmax, ginv, gsc, sc, kmin, kmax);
    } else {
      if (warp < G)
        merge_head_normaliser(p.norm_partial + (int64_t{h} * G + warp) * p.norm_parts, p.norm_parts, warp, gmax, ginv);
      __syncthreads();
      for (int i0 = tid; i0 < N; i0 += 4 * blockDim.x) {
        float lv[4][kMaxGroup];
        load_logits<4, false>(lv, lgh, N, G, i0, blockDim.x, N);
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          const int i = i0 + b * blockDim.x;
          if (i >= N) break;
          const float s = form_head_score(lv[b], G, gmax, ginv);
          gsc[i] = s;
          sc[i] = s;
          if (s != -INFINITY) {  // not an empty cluster (a formed score is a sum of terms >= 0)
            const uint32_t u = float_order_key(s);
            kmin = min(kmin, u);
            kmax = max(kmax, u);
          }
        }
      }
    }
  } else {
    // Ready scores (quest, outliers, oracle; form_scores'): 4 independent loads in flight per thread
    // (a plain strided loop leaves one L2 round trip per item of the thread on the critical path).
    constexpr int kB = 4;
    for (int i0 = tid; i0 < N; i0 += kB * blockDim.x) {
      float sv[kB];
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        const int i = i0 + b * blockDim.x;
        sv[b] = i < N ? gsc[i] : -INFINITY;
      }
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        const int i = i0 + b * blockDim.x;
        if (i >= N) break;
        sc[i] = sv[b];
        if (sv[b] != -INFINITY) {
          const uint32_t u = float_order_key(sv[b]);
          kmin = min(kmin, u);
          kmax = max(kmax, u);
        }
      }
    }
  }
  kmin = __reduce_min_sync(0xffffffffu, kmin);
  kmax = __reduce_max_sync(0xffffffffu, kmax);
  if (lane == 0) {
    bs.wmin[warp] = kmin;
    bs.wmax[warp] = kmax;
  }
  __syncthreads();  // (1) scores, range, zeroed histogram
  sel_stamp(phase, h, 1);
  uint32_t lo = 0xffffffffu, hi = 0u;
#pragma unroll 8
  for (int w = 0; w < kSelWarps; ++w) {
    lo = min(lo, bs.wmin[w]);
    hi = max(hi, bs.wmax[w]);
  }
  const uint32_t range = lo <= hi ? hi - lo : 0u;
  const int bitlen = 32 - __clz(static_cast<int>(range));
  const int shift = bitlen > kBinBits ? bitlen - kBinBits : 0;
  for (int i = tid; i < N; i += blockDim.x) {
    const float s = sc[i];
    if (s != -INFINITY) atomicAdd(&hist[(float_order_key(s) - lo) >> shift], 1u);
  }
  __syncthreads();  // (2) histogram
  sel_stamp(phase, h, 2);
  // Thread t owns bins kBinBins-1-4t ... kBinBins-4-4t (descending).
  unsigned cnt[kBinBinsPerThread];
  int own = 0;
#pragma unroll
  for (int jj = 0; jj < kBinBinsPerThread; ++jj) {
    cnt[jj] = hist[kBinBins - 1 - kBinBinsPerThread * tid - jj];
    own += static_cast<int>(cnt[jj]);
  }
  int finite, unused;
  const int incl = block_scan2(own, 0, sm.scan, &finite, &unused).x;  // (3-5)
  const int budget[2] = {p.k_retrieval, p.k_retrieval + p.k_estimation};
  const int k[2] = {budget[0] < finite ? budget[0] : finite, budget[1] < finite ? budget[1] : finite};
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (k[j] > 0 && incl - own < k[j] && k[j] <= incl) {
      int cum = incl - own;
#pragma unroll
      for (int jj = 0; jj < kBinBinsPerThread; ++jj) {
        const int c = static_cast<int>(cnt[jj]);
        if (cum + c >= k[j]) {
          bs.found_bin[j] = kBinBins - 1 - kBinBinsPerThread * tid - jj;
          bs.found_rem[j] = k[j] - cum;
          break;
        }
        cum += c;
      }
    }
  }
  __syncthreads();  // (6) threshold bins
  sel_stamp(phase, h, 3);
  const int bin0 = k[0] > 0 ? bs.found_bin[0] : -1, bin1 = k[1] > 0 ? bs.found_bin[1] : -1;
  const bool shared_bin = bin1 == bin0;  // then list 0 serves both thresholds
  if (k[1] > 0) {  // k[1] >= k[0]
    for (int i = tid; i < N; i += blockDim.x) {
      const float s = sc[i];
      if (s == -INFINITY) continue;
      const uint32_t u = float_order_key(s);
      const int b = static_cast<int>((u - lo) >> shift);
      if (b == bin0) {
        const int at = atomicAdd(&bs.cand_n[0], 1);
        if (at < kBinCand) bs.cand[0][at] = u;
      } else if (b == bin1) {
        const int at = atomicAdd(&bs.cand_n[1], 1);
        if (at < kBinCand) bs.cand[1][at] = u;
      }
    }
  }
  __syncthreads();  // (7) candidates
  sel_stamp(phase, h, 4);
  uint32_t thr[2] = {0u, 0u};
  int take[2] = {0, 0}, eqn[2] = {-1, -1};
  if (bs.cand_n[0] <= kBinCand && bs.cand_n[1] <= kBinCand) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (k[j] == 0) continue;
      const int L = j == 1 && shared_bin ? 0 : j, m = bs.cand_n[L], rem = bs.found_rem[j];
      const uint32_t* cl = bs.cand[L];
      for (int x = tid; x < m; x += blockDim.x) {
        const uint32_t key = cl[x];
        int gt = 0, eq = 0;
        for (int y = 0; y < m; ++y) {
          const uint32_t o = cl[y];
          gt += o > key;
          eq += o == key;
        }
        if (gt < rem && rem <= gt + eq) {  // every tie of the threshold writes the same values
          bs.thr[j] = key;
          bs.take[j] = rem - gt;
          bs.eq[j] = eq;
        }
      }
    }
    __syncthreads();  // (8) thresholds
#pragma unroll
    for (int j = 0; j < 2; ++j)
      if (k[j] > 0) {
        thr[j] = bs.thr[j];
        take[j] = bs.take[j];
        eqn[j] = bs.eq[j];
      }
  } else {  // a threshold bin of more than kBinCand items: exact ties in bulk; the radix passes
    int kk[2];
    radix_select2(sc, N, budget, sm, kk, thr, take);
  }
  sel_stamp(phase, h, 5);  // after the barrier (8) or the radix passes' last one
  const int k1 = k[0], k2 = k[1];
  const uint32_t t1 = thr[0], t2 = thr[1];
  const int take1 = take[0], take2 = take[1];
  // Tie ranks are needed only when a threshold takes some but not all of its ties.
  const bool rank_ties = (k1 > 0 && take1 != eqn[0]) || (k2 > 0 && take2 != eqn[1]);

  int* ret = p.retrieval_ids + int64_t{h} * p.k_retrieval;
  int* est = p.k_estimation > 0 ? p.estimation_ids + int64_t{h} * p.k_estimation : nullptr;
  int* pre = p.scan_scratch + int64_t{h} * (p.k_retrieval + 1);
  const int64_t w_begin = p.idx_begin + p.n_idx;
  const int steady = static_cast<int>(p.idx_begin + (p.num_tokens - w_begin));
  int out1 = 0, out2 = 0, running = steady;
  const CompactCut cut{t1, t2, take1, take2, k1 > 0, k2 > 0};
  if (rank_ties) compact_ballot<true>(p, h, sc, cut, bs, ret, est, pre, steady, out1, out2, running);
  else compact_ballot<false>(p, h, sc, cut, bs, ret, est, pre, steady, out1, out2, running);
  for (int i = out1 + tid; i < p.k_retrieval; i += blockDim.x) ret[i] = -1;
  for (int i = out2 + tid; i < p.k_estimation; i += blockDim.x) est[i] = -1;
  int* list = p.token_list + int64_t{h} * p.list_stride;
  for (int i = tid; i < steady; i += blockDim.x)
    list[i] = static_cast<int>(i < p.idx_begin ? i : w_begin + (i - p.idx_begin));
  __syncthreads();  // expansion table
  sel_stamp(phase, h, 6);
  // With p.prefetch a half-warp per retrieval item (clusters hold ~tokens_per_cluster = 16 tokens, so a whole
  // warp leaves half its lanes idle): 64 items per round instead of 32 (148 items at 128K: 3 dependent rounds
  // instead of 5); else a warp per item. The same list either way.
  const int sub = p.prefetch ? 16 : 32, per_warp = 32 / sub;
  const int slot = warp * per_warp + lane / sub, sl = lane % sub;
  for (int i = slot; i < out1; i += kSelWarps * per_warp) {
    int b, at, n;
    if (i < kBinExp) {
      b = bs.exp_begin[i];
      at = bs.exp_at[i];
      n = bs.exp_len[i];
    } else {
      at = pre[i];
      const ItemTokens it = item_tokens(p, h, ret[i], false);
      b = it.begin;
      n = it.length;
    }
    if (p.page_tokens > 0) {
      for (int t = sl; t < n; t += sub) list[at + t] = static_cast<int>(p.idx_begin + b + t);
    } else {
      for (int t = sl; t < n; t += sub) list[at + t] = static_cast<int>(p.idx_begin + p.members[b + t]);
    }
  }
  if (tid == 0) p.token_count[h] = running;
  if (phase != nullptr) {  // diagnostics: the end of the slowest warp's expansion
    __syncthreads();
    sel_stamp(phase, h, 7);
  }
}

constexpr size_t kMaxSmemScores = size_t(kSelectBinsMaxItems) * 4;  // 160 KiB: the padding to 4 items fits too
static_assert(kMaxSmemScores % 16 == 0, "the float4 padding of the scores");

}  // namespace

// The few-barrier selection (select_bins_kernel); <= kSelectBinsMaxItems items (scores in shared memory).
cudaError_t select_and_expand_bins(const SelectParams& p, cudaStream_t s) {
  if (size_t(p.num_items) * 4 > kMaxSmemScores) return cudaErrorInvalidValue;
  static bool attr_set = false;
  if (!attr_set) {
    const cudaError_t e = cudaFuncSetAttribute(select_bins_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kMaxSmemScores));
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  const size_t padded = size_t(compact_padded(p.num_items)) * 4;
  return launch_maybe_pdl(select_bins_kernel, dim3(static_cast<unsigned>(p.num_heads)), dim3(kSelThreads), padded, s,
                          p.pdl, p);
}

}  // namespace retroinfer::cuda::detail
