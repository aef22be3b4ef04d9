// Zone selection over a thread-block cluster of kClR = 4 CTAs per head that forms its own scores (run 21,
// RETROINFER_SELECT_CL; DESIGN.md §2 "Scoring"). The result is the bins kernel's (select_bins.cu) bit for bit:
// "sort by (score desc, id asc) and cut at k_r and k_r + k_e", ids ascending, the retrieval items expanded
// into the head's exact-token list after the steady zone, the formed scores written when group > 0.
//
// Why: at 128K batch 4 the step's longest DRAM-idle stretch is the score grid's grid barrier and formation
// (~4.7 us) followed by one 1024-thread CTA per head selecting (~13 us). Here the score grid only writes its
// logits and normaliser partials (no grid barrier, no cooperative launch) and each head's selection runs on
// four multiprocessors that talk through distributed shared memory and the cluster barrier (no round trip
// through L2 and no polling, unlike the grid kernel's per-head barriers in select_grid.cu):
//   0. before the PDL wait: the histogram zeroed, the CTA's CSR offsets prefetched into L2;
//   1. the CTA's quarter of the items: the head's normalisers merged (merge_head_normaliser, as every
//      formation), the logits loaded and the scores formed (form_head_score), written to global and kept
//      in shared memory; the smallest / largest order key published;                         [cluster barrier 1]
//   2. the bins kernel's range-adapted histogram over the cluster's range, of the CTA's items; [barrier 2]
//   3. every CTA adds the four histograms (distributed shared memory) and scans them: the bins holding rank
//      k1 and k2 (each CTA the same counts, so the same bins); the CTA's candidates (items in those bins)
//      gathered;                                                                               [barrier 3]
//   4. every CTA copies the cluster's candidates (rank order) and ranks them: the thresholds t1, t2, how many
//      of their ties are in (take), the ties held by lower ranks (tie ranks in id order); a threshold bin of
//      more than kClCand candidates (long runs of exact ties) is searched instead by counting over the
//      cluster (one barrier per halving of the bin's key range);
//   5. the flags of the CTA's items, the retrieval items' CSR lengths, the CTA's (retrieval, estimation,
//      token) counts published;                                                                [barrier 4]
//   6. bases from the lower ranks, then the ids, the scan scratch (slots >= kClExpLimit, as the bins kernel
//      writes) and the expansion of the CTA's own retrieval items; rank 0 writes the steady zone and the
//      token count. A last barrier keeps every CTA's shared memory alive until the others stop reading it.
// Up to kClMaxItems items (4 x 10240 scores in shared memory).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/select_common.cuh"
#include "retroinfer/error.h"

namespace retroinfer::cuda::detail {

namespace {

namespace cg = cooperative_groups;

constexpr int kClThreads = 512;
constexpr int kClWarps = kClThreads / 32;
constexpr int kClBins = 4096;  // the bins kernel's histogram
constexpr int kClBinBits = 12;
constexpr int kClFine = 64;                     // fine bins per coarse bin of the two-level merge
constexpr int kClCoarse = kClBins / kClFine;    // 64 coarse bins
constexpr int kClCand = 1024;       // candidates of one threshold bin over the cluster (else the counting search)
constexpr int kClMaxIpt = 20;       // items per thread: 4 x 512 x 20 = 40960 items
constexpr int kClExpLimit = 1024;   // the bins kernel's kBinExp: its scan scratch holds positions of slots >= this
static_assert(kSelectClMaxCtas * kClThreads * kClMaxIpt == kSelectClMaxItems && kClThreads * kClMaxIpt == kSelectClCtaItems,
              "kernels.h's item limits");

struct __align__(16) ClSmem {
  unsigned hist[kClBins];     // this CTA's histogram (read by the whole cluster after barrier 2)
  unsigned coarse[kClCoarse];  // its sums of kClFine bins (read by the whole cluster after barrier 2)
  unsigned mcoarse[kClCoarse];  // the cluster's coarse histogram
  unsigned mfine[2][kClFine];   // the cluster's fine bins of the coarse bin holding rank k[j]
  int cbin[2], cabove[2], finite;
  uint32_t cand[2][kClCand];  // this CTA's candidates of threshold bin j (read after barrier 3)
  int cand_n[2];              // may exceed kClCand (then only the count is meaningful)
  uint32_t all[kClCand];      // the cluster's candidates of one bin, rank after rank
  uint32_t kmin, kmax;        // published after barrier 1
  int pub[3];                 // published after barrier 4: retrieval, estimation, token counts
  int srch[2][2];             // the counting search: published counts, parity buffers
  int wa[kClWarps + 1], wb[kClWarps + 1], wc[kClWarps + 1];
  uint32_t wmin[kClWarps], wmax[kClWarps];
  float gmax[kMaxGroup], ginv[kMaxGroup];
  int found_bin[2], found_rem[2];
  uint32_t thr[2];
  int take[2], eq[2];
  int base_ret, base_est, base_tok, tot_ret, tot_est, tot_tok;
};

// Inclusive scan of three ints over the CTA (all threads call); the CTA totals in *ta, *tb, *tc.
__device__ __forceinline__ void cl_scan3(int& a, int& b, int& c, ClSmem& s, int* ta, int* tb, int* tc) {
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
    s.wa[warp] = a;
    s.wb[warp] = b;
    s.wc[warp] = c;
  }
  __syncthreads();
  int pa = 0, pb = 0, pc = 0, sa = 0, sb = 0, sc = 0;
#pragma unroll
  for (int w = 0; w < kClWarps; ++w) {
    const int xa = s.wa[w], xb = s.wb[w], xc = s.wc[w];
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
  __syncthreads();  // wa / wb / wc reusable
}

// Items with key >= x0 (c0) and >= x1 (c1) over the cluster (every thread of every CTA calls, the same
// x0, x1 and iteration parity `it`): the CTA's count published, a cluster barrier, the ranks' sum.
template <int R>
__device__ __forceinline__ void cl_count_ge(const float* sc, int first, int last, uint32_t x0, uint32_t x1, int it,
                                            ClSmem& s, cg::cluster_group& cluster, int* c0, int* c1) {
  int a = 0, b = 0;
  for (int i = first; i < last; ++i) {
    const float f = sc[i];
    if (f == -INFINITY) continue;
    const uint32_t u = float_order_key(f);
    a += u >= x0;
    b += u >= x1;
  }
  int unused = 0, ta = 0, tb = 0, tu = 0;
  cl_scan3(a, b, unused, s, &ta, &tb, &tu);
  if (threadIdx.x == 0) {
    s.srch[it & 1][0] = ta;
    s.srch[it & 1][1] = tb;
  }
  cluster.sync();
  int r0 = 0, r1 = 0;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const ClSmem* o = cluster.map_shared_rank(&s, r);
    r0 += o->srch[it & 1][0];
    r1 += o->srch[it & 1][1];
  }
  *c0 = r0;
  *c1 = r1;
}

struct ClArgs {
  SelectParams p;
  int ipt;  // items per thread
};

template <int R>
__global__ void __cluster_dims__(R, 1, 1) __launch_bounds__(kClThreads, 2) select_cl_kernel(const ClArgs args) {
  const SelectParams& p = args.p;
  const int ipt = args.ipt;
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ ClSmem s;
  extern __shared__ __align__(16) unsigned char csm[];
  const int chunk = kClThreads * ipt;
  float* sc = reinterpret_cast<float*>(csm);  // [chunk] the CTA's scores, -inf past its items
  unsigned char* flag = csm + size_t(chunk) * 4;  // [chunk]: 1 retrieval, 2 estimation
  const int tab_n = chunk < p.k_retrieval ? chunk : (p.k_retrieval > 0 ? p.k_retrieval : 1);
  int* tab_b = reinterpret_cast<int*>(csm + ((size_t(chunk) * 5 + 15) & ~size_t(15)));  // [tab_n] member begin
  int* tab_len = tab_b + tab_n;                                                       // [tab_n] length
  int* tab_at = tab_len + tab_n;                                                      // [tab_n] list position
  const int rank = static_cast<int>(cluster.block_rank());
  const int h = static_cast<int>(blockIdx.x) / R, N = p.num_items, G = p.group;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int cbase = rank * chunk;  // the CTA's first item
  const int n = N - cbase < 0 ? 0 : (N - cbase < chunk ? N - cbase : chunk);
  const int first = tid * ipt, last = first + ipt;  // the thread's items cbase + [first, last) (-inf past n)
  uint64_t* const phase = rank == 0 ? p.phase : nullptr;
  float* gsc = p.scores + int64_t{h} * N;
  for (int i = tid; i < kClBins; i += kClThreads) s.hist[i] = 0u;
  if (tid < 2) s.cand_n[tid] = 0;
  grid_launch_dependents();
  // The CTA's CSR offsets (index data, not written by the score kernel) on their way into L2 before the
  // PDL wait: step 5 reads those of the retrieval items.
  if (p.prefetch && p.page_tokens == 0 && p.offsets != nullptr)
    for (int i = cbase + tid * 32; i <= cbase + n; i += kClThreads * 32) prefetch_l2(p.offsets + int64_t{h} * N + i);
  grid_dependency_wait();
  sel_stamp(phase, h, 0);

  // 1. Scores of the CTA's items (formed from the logits when group > 0, as the bins kernel forms them).
  uint32_t kmin = 0xffffffffu, kmax = 0u;
  auto keep = [&](int i, float v) {  // local item i
    sc[i] = v;
    if (v != -INFINITY) {
      const uint32_t u = float_order_key(v);
      kmin = min(kmin, u);
      kmax = max(kmax, u);
    }
  };
  if (G > 0) {
    const float* lgh = p.logits + int64_t{h} * G * N;
    // Four consecutive items per thread and round: one 16-byte load per query head where the rows are
    // 16-byte aligned (N % 4 == 0) and the four items are the CTA's, else four scalar loads. The first
    // round's loads are issued before the normalisers' (one L2 round trip for both).
    const bool vec = (N & 3) == 0;
    auto load = [&](int q0, float (&lv)[4][kMaxGroup]) {
      const int i0 = cbase + q0;
      if (vec && q0 + 4 <= n) {
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          const float4 x = g < G ? __ldg(reinterpret_cast<const float4*>(lgh + int64_t{g} * N + i0))
                                 : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          lv[0][g] = x.x;
          lv[1][g] = x.y;
          lv[2][g] = x.z;
          lv[3][g] = x.w;
        }
      } else {
        load_logits<4, false>(lv, lgh, N, G, i0, 1, cbase + n);
      }
    };
    float lv[4][kMaxGroup];
    load(4 * tid, lv);
    if (warp < G)
      merge_head_normaliser(p.norm_partial + (int64_t{h} * G + warp) * p.norm_parts, p.norm_parts, warp, s.gmax, s.ginv);
    __syncthreads();
    for (int q0 = 4 * tid; q0 < chunk; q0 += 4 * kClThreads) {
      if (q0 != 4 * tid) load(q0, lv);
      const int i0 = cbase + q0;
      float v[4];
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        v[b] = -INFINITY;
        if (q0 + b < n) {
          v[b] = form_head_score(lv[b], G, s.gmax, s.ginv);
          if (!vec) gsc[i0 + b] = v[b];
        }
        keep(q0 + b, v[b]);
      }
      if (vec && q0 + 4 <= n) *reinterpret_cast<float4*>(gsc + i0) = make_float4(v[0], v[1], v[2], v[3]);
      else if (vec)
        for (int b = 0; b < 4 && q0 + b < n; ++b) gsc[i0 + b] = v[b];
    }
  } else {
    constexpr int kB = 4;  // independent loads in flight per thread
    for (int i0 = tid; i0 < chunk; i0 += kB * kClThreads) {
      float sv[kB];
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        const int i = i0 + b * kClThreads;
        sv[b] = i < n ? __ldcg(gsc + cbase + i) : -INFINITY;
      }
#pragma unroll
      for (int b = 0; b < kB; ++b) {
        const int i = i0 + b * kClThreads;
        if (i < chunk) keep(i, sv[b]);
      }
    }
  }
  kmin = __reduce_min_sync(0xffffffffu, kmin);
  kmax = __reduce_max_sync(0xffffffffu, kmax);
  if (lane == 0) {
    s.wmin[warp] = kmin;
    s.wmax[warp] = kmax;
  }
  __syncthreads();
  if (tid == 0) {
    uint32_t a = 0xffffffffu, b = 0u;
    for (int w = 0; w < kClWarps; ++w) {
      a = min(a, s.wmin[w]);
      b = max(b, s.wmax[w]);
    }
    s.kmin = a;
    s.kmax = b;
  }
  cluster.sync();  // (1) scores in place, range published
  sel_stamp(phase, h, 1);

  // 2. The histogram of the CTA's items over the cluster's range (the bins kernel's bins).
  uint32_t lo = 0xffffffffu, hi = 0u;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const ClSmem* o = cluster.map_shared_rank(&s, r);
    lo = min(lo, o->kmin);
    hi = max(hi, o->kmax);
  }
  const uint32_t range = lo <= hi ? hi - lo : 0u;
  const int bitlen = 32 - __clz(static_cast<int>(range));
  const int shift = bitlen > kClBinBits ? bitlen - kClBinBits : 0;
  for (int i = first; i < last; ++i) {
    const float v = sc[i];
    if (v != -INFINITY) atomicAdd(&s.hist[(float_order_key(v) - lo) >> shift], 1u);
  }
  __syncthreads();
  {  // the coarse histogram: kClCoarse sums of kClFine bins (8 threads per coarse bin, 8 bins each)
    const uint4 x = *reinterpret_cast<const uint4*>(&s.hist[8 * tid]), y = *reinterpret_cast<const uint4*>(&s.hist[8 * tid + 4]);
    unsigned c = x.x + x.y + x.z + x.w + y.x + y.y + y.z + y.w;
    c += __shfl_xor_sync(0xffffffffu, c, 1);
    c += __shfl_xor_sync(0xffffffffu, c, 2);
    c += __shfl_xor_sync(0xffffffffu, c, 4);
    if ((tid & 7) == 0) s.coarse[tid >> 3] = c;
  }
  cluster.sync();  // (2) histograms
  sel_stamp(phase, h, 2);

  // 3. The cluster's histogram in two levels (few distributed-shared-memory loads): the coarse bins summed
  // over the ranks and scanned (descending) for the coarse bins holding rank k1 and k2, then the fine bins of
  // those two summed and scanned. Every CTA reads the same counts, so finds the same bins.
  if (tid < kClCoarse) {
    unsigned c = 0u;
#pragma unroll
    for (int r = 0; r < R; ++r) c += cluster.map_shared_rank(&s, r)->coarse[tid];
    s.mcoarse[tid] = c;
  }
  __syncthreads();
  const int budget[2] = {p.k_retrieval, p.k_retrieval + p.k_estimation};
  if (warp == 0) {  // lane l: coarse bins kClCoarse-1-2l and kClCoarse-2-2l (descending)
    const unsigned c0 = s.mcoarse[kClCoarse - 1 - 2 * lane], c1 = s.mcoarse[kClCoarse - 2 - 2 * lane];
    const int own = static_cast<int>(c0 + c1);
    int incl = own;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += y;
    }
    const int finite = __shfl_sync(0xffffffffu, incl, 31);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int kj = budget[j] < finite ? budget[j] : finite;
      const int above = incl - own;
      if (kj > 0 && above < kj && kj <= incl) {
        const bool first_bin = above + static_cast<int>(c0) >= kj;
        s.cbin[j] = first_bin ? kClCoarse - 1 - 2 * lane : kClCoarse - 2 - 2 * lane;
        s.cabove[j] = first_bin ? above : above + static_cast<int>(c0);
      }
    }
    if (lane == 0) s.finite = finite;
  }
  __syncthreads();
  const int finite = s.finite;
  const int k[2] = {budget[0] < finite ? budget[0] : finite, budget[1] < finite ? budget[1] : finite};
  if (tid < 2 * kClFine) {  // fine bins of coarse bin cbin[j], j = tid / kClFine
    const int j = tid / kClFine, f = tid % kClFine;
    unsigned c = 0u;
    if (k[j] > 0) {
      const int bin = s.cbin[j] * kClFine + f;
#pragma unroll
      for (int r = 0; r < R; ++r) c += cluster.map_shared_rank(&s.hist[0], r)[bin];
    }
    s.mfine[j][f] = c;
  }
  __syncthreads();
  if (warp < 2 && k[warp] > 0) {  // warp j: lane l holds fine bins kClFine-1-2l and kClFine-2-2l of cbin[j]
    const int j = warp;
    const unsigned c0 = s.mfine[j][kClFine - 1 - 2 * lane], c1 = s.mfine[j][kClFine - 2 - 2 * lane];
    const int own = static_cast<int>(c0 + c1);
    int incl = own;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += y;
    }
    const int above = s.cabove[j] + incl - own, kj = k[j];
    if (above < kj && kj <= above + own) {
      const bool first_bin = above + static_cast<int>(c0) >= kj;
      s.found_bin[j] = s.cbin[j] * kClFine + (first_bin ? kClFine - 1 - 2 * lane : kClFine - 2 - 2 * lane);
      s.found_rem[j] = kj - (first_bin ? above : above + static_cast<int>(c0));
    }
  }
  __syncthreads();
  const int bin0 = k[0] > 0 ? s.found_bin[0] : -1, bin1 = k[1] > 0 ? s.found_bin[1] : -1;
  const bool shared_bin = bin1 == bin0;  // list 0 serves both thresholds
  if (k[1] > 0) {  // k[1] >= k[0]
    for (int i = first; i < last; ++i) {
      const float v = sc[i];
      if (v == -INFINITY) continue;
      const int b = static_cast<int>((float_order_key(v) - lo) >> shift);
      if (b == bin0) {
        const int at = atomicAdd(&s.cand_n[0], 1);
        if (at < kClCand) s.cand[0][at] = float_order_key(v);
      } else if (b == bin1) {
        const int at = atomicAdd(&s.cand_n[1], 1);
        if (at < kClCand) s.cand[1][at] = float_order_key(v);
      }
    }
  }
  sel_stamp(phase, h, 3);
  cluster.sync();  // (3) candidates
  sel_stamp(phase, h, 4);

  // 4. The thresholds: t[j] = the k[j]-th largest key, take[j] = how many of its ties are in, eq[j] = its ties
  // (-1: not counted, ties ranked), tie_below[j] = its ties held by lower ranks.
  uint32_t t[2] = {0u, 0u};
  int take[2] = {0, 0}, eq[2] = {-1, -1}, tie_below[2] = {0, 0};
  bool search[2] = {false, false};
  int it = 0;  // counting-search iterations so far (parity of the published counts)
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    if (k[j] == 0) continue;
    const int L = j == 1 && shared_bin ? 0 : j, rem = s.found_rem[j];
    int nr[R], total = 0;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      nr[r] = cluster.map_shared_rank(&s, r)->cand_n[L];
      total += nr[r];
    }
    if (total > kClCand) {  // cluster-uniform: every CTA read the same counts
      search[j] = true;
      continue;
    }
    if (!(j == 1 && shared_bin)) {  // the union of list L, rank after rank (j = 1 on a shared bin: already there)
      __syncthreads();              // the previous list's readers are done with s.all
      int off = 0;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint32_t* cr = cluster.map_shared_rank(&s.cand[L][0], r);
        for (int x = tid; x < nr[r]; x += kClThreads) s.all[off + x] = cr[x];
        off += nr[r];
      }
      __syncthreads();
    }
    for (int x = tid; x < total; x += kClThreads) {
      const uint32_t key = s.all[x];
      int gt = 0, e = 0;
      for (int y = 0; y < total; ++y) {
        const uint32_t o = s.all[y];
        gt += o > key;
        e += o == key;
      }
      if (gt < rem && rem <= gt + e) {  // every tie of the threshold writes the same values
        s.thr[j] = key;
        s.take[j] = rem - gt;
        s.eq[j] = e;
      }
    }
    __syncthreads();
    t[j] = s.thr[j];
    take[j] = s.take[j];
    eq[j] = s.eq[j];
    int below = 0;
#pragma unroll
    for (int r = 0; r < R; ++r) below += r < rank ? nr[r] : 0;
    tie_below[j] = __syncthreads_count(tid < below && s.all[tid] == t[j]) +
                   (below > kClThreads ? __syncthreads_count(tid + kClThreads < below && s.all[tid + kClThreads] == t[j]) : 0);
  }
  if (search[0] || search[1]) {  // a threshold bin of more than kClCand candidates: count over the cluster
    uint32_t a[2], b[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      a[j] = b[j] = 0u;
      if (!search[j]) continue;
      a[j] = lo + (static_cast<uint32_t>(s.found_bin[j]) << shift);  // count(>= a) >= k: t in [a, b]
      const uint64_t top = uint64_t{a[j]} + ((uint64_t{1} << shift) - 1u);  // the bin's last key (64-bit: no wrap)
      b[j] = top < hi ? static_cast<uint32_t>(top) : hi;
    }
    // t[j] = max{x in [a, b] : count(>= x) >= k[j]}, both thresholds halved in the same rounds.
    while ((search[0] && a[0] < b[0]) || (search[1] && a[1] < b[1])) {
      uint32_t mid[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) mid[j] = search[j] && a[j] < b[j] ? a[j] + (b[j] - a[j] + 1u) / 2u : 0u;
      int c[2];
      cl_count_ge<R>(sc, first, last, mid[0], mid[1], it++, s, cluster, &c[0], &c[1]);
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (!search[j] || a[j] >= b[j]) continue;
        if (c[j] >= k[j]) a[j] = mid[j];
        else b[j] = mid[j] - 1u;
      }
    }
    // take = k - count(> t); the CTA's ties and those of the lower ranks.
    uint32_t above[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) above[j] = search[j] && a[j] != 0xffffffffu ? a[j] + 1u : 0xffffffffu;
    int c[2];
    cl_count_ge<R>(sc, first, last, above[0], above[1], it++, s, cluster, &c[0], &c[1]);
    int e0 = 0, e1 = 0;
    for (int i = first; i < last; ++i) {
      const float v = sc[i];
      if (v == -INFINITY) continue;
      const uint32_t u = float_order_key(v);
      e0 += search[0] && u == a[0];
      e1 += search[1] && u == a[1];
    }
    int unused = 0, te0 = 0, te1 = 0, tu = 0;
    cl_scan3(e0, e1, unused, s, &te0, &te1, &tu);
    if (tid == 0) {
      s.srch[it & 1][0] = te0;
      s.srch[it & 1][1] = te1;
    }
    cluster.sync();
    int bl[2] = {0, 0};
#pragma unroll
    for (int r = 0; r < R; ++r) {
      if (r >= rank) break;
      const ClSmem* o = cluster.map_shared_rank(&s, r);
      bl[0] += o->srch[it & 1][0];
      bl[1] += o->srch[it & 1][1];
    }
    ++it;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (!search[j]) continue;
      // above[j] = 0xffffffff only when t is the largest key: count(> t) = 0 (count(>= ~0) counts the
      // items with the key ~0 itself, which are then ties of t).
      const int gt = a[j] == 0xffffffffu ? 0 : c[j];
      t[j] = a[j];
      take[j] = k[j] - gt;
      eq[j] = -1;
      tie_below[j] = bl[j];
    }
  }
  sel_stamp(phase, h, 5);
  const bool on[2] = {k[0] > 0, k[1] > 0};
  const bool rank_ties = (on[0] && take[0] != eq[0]) || (on[1] && take[1] != eq[1]);

  // 5. Flags (the CPU rule's membership, ties ranked in id order), the retrieval items' lengths, the counts.
  int tie_base[2] = {0, 0};
  if (rank_ties) {
    int e0 = 0, e1 = 0;
    for (int i = first; i < last; ++i) {
      const float v = sc[i];
      if (v == -INFINITY) continue;
      const uint32_t u = float_order_key(v);
      e0 += on[0] && u == t[0];
      e1 += on[1] && u == t[1];
    }
    const int own0 = e0, own1 = e1;
    int unused = 0, te0 = 0, te1 = 0, tu = 0;
    cl_scan3(e0, e1, unused, s, &te0, &te1, &tu);
    tie_base[0] = tie_below[0] + e0 - own0;  // the thread's first tie's rank in the head
    tie_base[1] = tie_below[1] + e1 - own1;
  }
  int nr = 0, ne = 0, tok = 0;
  for (int i = first; i < last; ++i) {
    unsigned char fl = 0;
    const float v = sc[i];
    if (v != -INFINITY) {
      const uint32_t u = float_order_key(v);
      bool in[2];
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const bool tie = on[j] && u == t[j];
        in[j] = on[j] && (u > t[j] || (tie && (!rank_ties || tie_base[j] < take[j])));
        tie_base[j] += tie;
      }
      if (in[0]) fl = 1;
      else if (in[1] && p.estimation_ids != nullptr) fl = 2;
    }
    flag[i] = fl;
    nr += fl == 1;
    ne += fl == 2;
  }
  for (int i = first; i < last; ++i)
    if (flag[i] == 1) tok += item_tokens(p, h, cbase + i, p.prefetch).length;
  int ir = nr, ie = ne, itk = tok, tr = 0, te = 0, tt = 0;
  cl_scan3(ir, ie, itk, s, &tr, &te, &tt);
  {  // the CTA's expansion table (local slots and token offsets; made absolute below)
    int slot = ir - nr, at = itk - tok;
    for (int i = first; i < last; ++i) {
      if (flag[i] != 1) continue;
      const ItemTokens x = item_tokens(p, h, cbase + i, false);
      tab_b[slot] = x.begin;
      tab_len[slot] = x.length;
      tab_at[slot] = at;
      at += x.length;
      ++slot;
    }
  }
  if (tid == 0) {
    s.pub[0] = tr;
    s.pub[1] = te;
    s.pub[2] = tt;
  }
  sel_stamp(phase, h, 6);  // the compaction's local work (the wait for the other ranks counts as expansion)
  cluster.sync();  // (4) counts
  // 6. Bases from the lower ranks, totals from all.
  const int64_t w_begin = p.idx_begin + p.n_idx;
  const int steady = static_cast<int>(p.idx_begin + (p.num_tokens - w_begin));
  if (tid == 0) {
    int br = 0, be = 0, bt = 0, sr = 0, se = 0, st = 0;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const ClSmem* o = cluster.map_shared_rank(&s, r);
      const int x = o->pub[0], y = o->pub[1], z = o->pub[2];
      if (r < rank) {
        br += x;
        be += y;
        bt += z;
      }
      sr += x;
      se += y;
      st += z;
    }
    s.base_ret = br;
    s.base_est = be;
    s.base_tok = steady + bt;
    s.tot_ret = sr;
    s.tot_est = se;
    s.tot_tok = st;
  }
  __syncthreads();
  // Every remote read of this CTA is done: arrive now, wait before exiting (the others may still read ours).
  cluster.barrier_arrive();
  const int base_ret = s.base_ret, base_est = s.base_est, base_tok = s.base_tok;
  int* ret = p.retrieval_ids + int64_t{h} * p.k_retrieval;
  int* est = p.estimation_ids != nullptr ? p.estimation_ids + int64_t{h} * p.k_estimation : nullptr;
  int* pre = p.scan_scratch + int64_t{h} * (p.k_retrieval + 1);
  {
    int r = base_ret + ir - nr, e = base_est + ie - ne, slot = ir - nr;
    for (int i = first; i < last; ++i) {
      const unsigned char fl = flag[i];
      if (fl == 1) {
        ret[r] = cbase + i;
        const int at = base_tok + tab_at[slot];
        tab_at[slot] = at;
        if (r >= kClExpLimit) pre[r] = at;
        ++r;
        ++slot;
      } else if (fl == 2) {
        est[e++] = cbase + i;
      }
    }
  }
  // Padding (-1) past the head's lists, spread over the cluster.
  for (int i = s.tot_ret + rank * kClThreads + tid; i < p.k_retrieval; i += R * kClThreads) ret[i] = -1;
  if (est != nullptr)
    for (int i = s.tot_est + rank * kClThreads + tid; i < p.k_estimation; i += R * kClThreads) est[i] = -1;
  int* list = p.token_list + int64_t{h} * p.list_stride;
  if (rank == 0) {
    for (int i = tid; i < steady; i += kClThreads)
      list[i] = static_cast<int>(i < p.idx_begin ? i : w_begin + (i - p.idx_begin));
    if (tid == 0) p.token_count[h] = steady + s.tot_tok;
  }
  __syncthreads();  // the table's absolute positions
  // Expansion: a half-warp per retrieval item of the CTA.
  constexpr int kSub = 16;
  const int slot0 = warp * 2 + lane / kSub, sl = lane % kSub;
  for (int i = slot0; i < tr; i += kClWarps * 2) {
    const int b = tab_b[i], at = tab_at[i], len = tab_len[i];
    if (p.page_tokens > 0) {
      for (int x = sl; x < len; x += kSub) list[at + x] = static_cast<int>(p.idx_begin + b + x);
    } else {
      for (int x = sl; x < len; x += kSub) list[at + x] = static_cast<int>(p.idx_begin + p.members[b + x]);
    }
  }
  cluster.barrier_wait();
  if (phase != nullptr) {
    __syncthreads();
    sel_stamp(phase, h, 7);
  }
}

constexpr size_t kClMaxSmem = 160 * 1024;  // the kernel's dynamic shared-memory attribute

// Dynamic shared memory of a launch with `ipt` items per thread.
size_t cl_smem_bytes(int ipt, int k_retrieval) {
  const int chunk = kClThreads * ipt;
  const int tab_n = chunk < k_retrieval ? chunk : (k_retrieval > 0 ? k_retrieval : 1);
  return ((size_t(chunk) * 5 + 15) & ~size_t(15)) + size_t(tab_n) * 12;
}

// The kernel for R CTAs per head with its shared-memory attribute set (once per instantiation).
template <int R>
cudaError_t cl_kernel(void (**k)(const ClArgs)) {
  static bool attr_set = false;
  if (!attr_set) {
    const cudaError_t e = cudaFuncSetAttribute(select_cl_kernel<R>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kClMaxSmem));
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  *k = select_cl_kernel<R>;
  return cudaSuccess;
}

cudaError_t cl_kernel_for(int R, void (**k)(const ClArgs)) {
  return R == 8 ? cl_kernel<8>(k) : cl_kernel<4>(k);
}

}  // namespace

// RETROINFER_SELECT_CL, read at every decode: unset or empty (auto: past kSelectClMinItems items), 1 (wherever
// it applies), 0 (off: the bins / grid kernels after the score grid's formation). Other values throw
// retroinfer::Error.
SelectClMode select_cl_mode() {
  const char* e = std::getenv("RETROINFER_SELECT_CL");
  if (e == nullptr || e[0] == '\0') return SelectClMode::kAuto;
  if (std::strcmp(e, "0") == 0) return SelectClMode::kOff;
  if (std::strcmp(e, "1") == 0) return SelectClMode::kOn;
  RETROINFER_FAIL("RETROINFER_SELECT_CL='", e,
                  "' is not a selection switch: use 1 (the cluster selection forming its own scores wherever it "
                  "applies), 0 (off) or leave it unset (past ", kSelectClMinItems, " items)");
}

int select_cl_ctas(int num_items) {
  if (num_items <= 0 || num_items > kSelectClMaxItems) return 0;
  return num_items <= 4 * kSelectClCtaItems ? 4 : kSelectClMaxCtas;
}

int select_cl_ipt(const SelectParams& p) {
  const int R = select_cl_ctas(p.num_items);
  if (R == 0 || p.num_heads <= 0 || p.scores == nullptr) return 0;
  const int per_cta = (p.num_items + R - 1) / R;
  const int ipt = (per_cta + kClThreads - 1) / kClThreads;
  return ipt < 1 ? 1 : ipt;
}

bool select_cl_one_wave(const SelectParams& p) {
  const int ipt = select_cl_ipt(p), R = select_cl_ctas(p.num_items);
  if (ipt <= 0 || ipt > kClMaxIpt) return false;
  thread_local int last_device = -1, last_clusters = 0, last_r = 0;
  thread_local size_t last_bytes = 0;
  const size_t smem = cl_smem_bytes(ipt, p.k_retrieval);
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  if (device != last_device || smem != last_bytes || R != last_r) {
    void (*k)(const ClArgs) = nullptr;
    int clusters = 0;
    if (cl_kernel_for(R, &k) == cudaSuccess) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = dim3(static_cast<unsigned>(R * p.num_heads));
      cfg.blockDim = dim3(kClThreads);
      cfg.dynamicSmemBytes = smem;
      if (cudaOccupancyMaxActiveClusters(&clusters, k, &cfg) != cudaSuccess) clusters = 0;
    }
    (void)cudaGetLastError();
    last_device = device;
    last_bytes = smem;
    last_r = R;
    last_clusters = clusters;
  }
  return p.num_heads <= last_clusters;
}

cudaError_t select_and_expand_cl(const SelectParams& p, cudaStream_t s) {
  const int ipt = select_cl_ipt(p), R = select_cl_ctas(p.num_items);
  if (ipt <= 0 || ipt > kClMaxIpt) return cudaErrorInvalidValue;
  if (p.group > 0 && (p.logits == nullptr || p.norm_partial == nullptr || p.group > kMaxGroup))
    return cudaErrorInvalidValue;
  void (*k)(const ClArgs) = nullptr;
  const cudaError_t e = cl_kernel_for(R, &k);
  if (e != cudaSuccess) return e;
  const size_t smem = cl_smem_bytes(ipt, p.k_retrieval);
  if (smem > kClMaxSmem) return cudaErrorInvalidConfiguration;
  return launch_maybe_pdl(k, dim3(static_cast<unsigned>(R * p.num_heads)), dim3(kClThreads), smem, s, p.pdl,
                          ClArgs{p, ipt});
}

}  // namespace retroinfer::cuda::detail
