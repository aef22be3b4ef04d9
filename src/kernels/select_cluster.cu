// Zone selection split over a thread-block cluster (DESIGN.md §2 "Scoring"; also Quest's page selection).
//
// One cluster of kCl = 8 CTAs per flat head (used where the scores outgrow one CTA's shared memory); CTA r owns the items [r * chunk, (r + 1) * chunk). The
// result is the one of the single-CTA kernel it replaces (select.cu, kept as a fallback):
//   1. scores = sum over the group of the per-head softmax over the non-empty items (each CTA merges the
//      score kernel's normaliser partials itself), written to global and kept in shared memory;
//   2. exact radix select of BOTH thresholds (the k_r-th and the (k_r + k_e)-th score) in one sequence
//      of 3 passes of 11/11/10-bit digits over the order-preserving integer image of the scores: each CTA
//      builds warp-aggregated histograms of its items, adds the non-zero bins into rank 0's shared
//      histogram through distributed shared memory, and after a cluster barrier every CTA reads the merged
//      histogram and finds the same digits (while the two prefixes agree one histogram serves both);
//   3. compaction in ascending id order with the ties at a threshold taken in id order (= sort by (score
//      desc, id asc) and cut, the CPU rule): each CTA publishes its (> t1, == t1, > t2, == t2) counts, so
//      every CTA knows how many ties lower ranks take and where its ids go;
//   4. expansion: each CTA scans the lengths of its own retrieval items, publishes the total, and all
//      CTAs of the cluster then expand the head's retrieval items warp by warp (balanced whatever the ids).
// 7 cluster barriers per head in all, against the single CTA's 8 radix passes of 1024 threads.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <cstdlib>

#include "kernels/common.cuh"
#include "kernels/kernels.h"

namespace retroinfer::cuda::detail {

namespace {

namespace cg = cooperative_groups;

constexpr int kCl = 8;  // CTAs per head: the portable cluster-size maximum
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 2048;  // 11-bit digits
constexpr int kPasses = 3;   // bits 31..21, 20..10, 9..0
constexpr int kBinsPerThread = kBins / kThreads;
constexpr int kPer = 8;  // consecutive items per thread in the compaction
// Dynamic shared memory: rank 0's merged histograms of each pass, this CTA's histograms, then the scores.
constexpr size_t kHistBytes = size_t(kPasses * 2 + 2) * kBins * 4;  // 64 KiB
constexpr int kMaxChunk = 32768;                                      // scores in shared memory: 128 KiB
static_assert(kBins % kThreads == 0, "each thread scans whole bins");

struct ClusterSmem {
  int wa[kWarps + 1], wb[kWarps + 1];
  int found_digit[2], found_rem[2];
  int4 counts;     // published: (> t1, == t1, > t2, == t2) over this CTA's items
  int len_total;   // published: exact tokens of this CTA's retrieval items
  int4 all[kCl];   // every rank's counts
  int n1[kCl], off1[kCl], take1[kCl], take2[kCl], ne[kCl], offe[kCl], lbase[kCl];
  int tot1, tote, total_len;
  float gmax[kMaxGroup], ginv[kMaxGroup];
};

__device__ __forceinline__ void ms_merge(float& m, float& s, float m2, float s2) {
  if (m2 == -INFINITY) return;
  if (m == -INFINITY) { m = m2; s = s2; return; }
  const float mx = fmaxf(m, m2);
  s = s * __expf(m - mx) + s2 * __expf(m2 - mx);
  m = mx;
}

// Inclusive scan of the pair (a, b) over the block; *ta, *tb receive the block sums.
__device__ int2 block_scan2(int a, int b, ClusterSmem& sm, int* ta, int* tb) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int ia = a, ib = b;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const int ya = __shfl_up_sync(0xffffffffu, ia, off), yb = __shfl_up_sync(0xffffffffu, ib, off);
    if (lane >= off) { ia += ya; ib += yb; }
  }
  if (lane == 31) { sm.wa[warp] = ia; sm.wb[warp] = ib; }
  __syncthreads();
  if (warp == 0) {
    const int x = lane < kWarps ? sm.wa[lane] : 0, y = lane < kWarps ? sm.wb[lane] : 0;
    int xi = x, yi = y;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int u = __shfl_up_sync(0xffffffffu, xi, off), v = __shfl_up_sync(0xffffffffu, yi, off);
      if (lane >= off) { xi += u; yi += v; }
    }
    if (lane < kWarps) { sm.wa[lane] = xi - x; sm.wb[lane] = yi - y; }
    if (lane == 31) { sm.wa[kWarps] = xi; sm.wb[kWarps] = yi; }
  }
  __syncthreads();
  const int2 r = make_int2(sm.wa[warp] + ia, sm.wb[warp] + ib);
  *ta = sm.wa[kWarps];
  *tb = sm.wb[kWarps];
  __syncthreads();
  return r;
}

template <bool kInSmem>
__global__ void __cluster_dims__(kCl, 1, 1) __launch_bounds__(kThreads)
    select_cluster_kernel(const SelectParams p, int chunk) {
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ ClusterSmem sm;
  extern __shared__ __align__(16) unsigned char dsm[];
  unsigned* merged = reinterpret_cast<unsigned*>(dsm);  // [kPasses][2][kBins]: rank 0's is the merged one
  unsigned* hist = merged + kPasses * 2 * kBins;        // [2][kBins]
  float* ssc = reinterpret_cast<float*>(hist + 2 * kBins);  // [chunk] when kInSmem
  const int rank = static_cast<int>(cluster.block_rank());
  const int h = blockIdx.x / kCl, N = p.num_items, G = p.group;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int b0 = min(N, rank * chunk), b1 = min(N, b0 + chunk);
  float* gsc = p.scores + int64_t{h} * N;
  auto sc_at = [&](int i) -> float {
    if constexpr (kInSmem) return ssc[i - b0];
    else return gsc[i];
  };

  if (rank == 0)
    for (int i = tid; i < kPasses * 2 * kBins; i += kThreads) merged[i] = 0;
  // 1. Scores of this CTA's items.
  if (G > 0) {
    if (warp < G) {
      const float2* part = p.norm_partial + (int64_t{h} * G + warp) * p.norm_parts;
      float m = -INFINITY, s = 0.0f;
      for (int i = lane; i < p.norm_parts; i += 32) ms_merge(m, s, part[i].x, part[i].y);
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
        const float m2 = __shfl_xor_sync(0xffffffffu, m, off), s2 = __shfl_xor_sync(0xffffffffu, s, off);
        ms_merge(m, s, m2, s2);
      }
      if (lane == 0) {
        sm.gmax[warp] = m;
        sm.ginv[warp] = s > 0.0f ? 1.0f / s : 0.0f;
      }
    }
    __syncthreads();
    const float* lgh = p.logits + int64_t{h} * G * N;
    for (int i = b0 + tid; i < b1; i += kThreads) {
      float lv[kMaxGroup];
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) lv[g] = g < G ? __ldg(lgh + int64_t{g} * N + i) : 0.0f;
      float s = 0.0f;
      bool empty = false;
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g)
        if (g < G) {
          if (lv[g] == -INFINITY) empty = true;
          else s += __expf(lv[g] - sm.gmax[g]) * sm.ginv[g];
        }
      s = empty ? -INFINITY : s;
      gsc[i] = s;
      if constexpr (kInSmem) ssc[i - b0] = s;
    }
  } else if constexpr (kInSmem) {
    for (int i = b0 + tid; i < b1; i += kThreads) ssc[i - b0] = gsc[i];
  }
  cluster.sync();  // rank 0's histograms are zero, every CTA runs, the scores are in place

  // 2. Both thresholds: prefix[j] / rem[j] of threshold j (k1, then k2) after each pass.
  uint32_t prefix[2] = {0u, 0u}, hi_mask = 0u;
  int rem[2] = {0, 0}, k1 = 0, k2 = 0;
  for (int pass = 0; pass < kPasses; ++pass) {
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const uint32_t dmask = pass == 2 ? 1023u : 2047u;
    const bool same = prefix[0] == prefix[1];  // one histogram serves both thresholds
    const int nh = same ? kBins : 2 * kBins;
    for (int i = tid; i < nh; i += kThreads) hist[i] = 0;
    __syncthreads();
    for (int i0 = b0; i0 < b1; i0 += kThreads) {
      const int i = i0 + tid;
      uint32_t u = 0;
      bool ok = false;
      if (i < b1) {
        const float f = sc_at(i);
        ok = f != -INFINITY;
        u = ok ? float_order_key(f) : 0u;
      }
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        if (j == 1 && same) break;
        // The scores share their high bits, so plain atomics would serialise on one bin: lanes with the
        // same digit add once through their leader.
        const unsigned key = ok && (u & hi_mask) == prefix[j] ? (u >> shift) & dmask : unsigned{kBins};
        if (__any_sync(0xffffffffu, key < kBins)) {
          const unsigned peers = __match_any_sync(0xffffffffu, key);
          if (key < kBins && lane == __ffs(peers) - 1) atomicAdd(&hist[j * kBins + key], __popc(peers));
        }
      }
    }
    __syncthreads();
    unsigned* mg = cluster.map_shared_rank(merged + pass * 2 * kBins, 0);
    for (int i = tid; i < nh; i += kThreads) {
      const unsigned v = hist[i];
      if (v != 0u) atomicAdd(mg + i, v);
    }
    cluster.sync();
    // Thread t owns bins kBins-1-4t .. kBins-4-4t (descending) of the merged histograms.
    unsigned ca[kBinsPerThread], cb[kBinsPerThread];
    int a = 0, b = 0;
#pragma unroll
    for (int jj = 0; jj < kBinsPerThread; ++jj) {
      const int d = kBins - 1 - kBinsPerThread * tid - jj;
      ca[jj] = mg[d];
      cb[jj] = same ? ca[jj] : mg[kBins + d];
      a += static_cast<int>(ca[jj]);
      b += static_cast<int>(cb[jj]);
    }
    int ta, tb;
    const int2 inc = block_scan2(a, b, sm, &ta, &tb);
    if (pass == 0) {
      k1 = min(p.k_retrieval, ta);  // ta = the cluster's finite items
      k2 = min(p.k_retrieval + p.k_estimation, ta);
      rem[0] = k1;
      rem[1] = k2;
      if (k1 == 0) break;  // the same in every CTA
    }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int incl = j == 0 ? inc.x : inc.y, own = j == 0 ? a : b, excl = incl - own;
      if (excl < rem[j] && rem[j] <= incl) {
        int cum = excl;
#pragma unroll
        for (int jj = 0; jj < kBinsPerThread; ++jj) {
          const int c = static_cast<int>(j == 0 ? ca[jj] : cb[jj]);
          if (cum + c >= rem[j]) {
            sm.found_digit[j] = kBins - 1 - kBinsPerThread * tid - jj;
            sm.found_rem[j] = rem[j] - cum;
            break;
          }
          cum += c;
        }
      }
    }
    __syncthreads();
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      prefix[j] |= static_cast<uint32_t>(sm.found_digit[j]) << shift;
      rem[j] = sm.found_rem[j];
    }
    hi_mask |= dmask << shift;
    __syncthreads();
  }
  const uint32_t t1 = prefix[0], t2 = prefix[1];

  // 3. Compaction. Counts of this CTA, published; every CTA derives every rank's share of the ties.
  {
    int gt1 = 0, eq1 = 0, gt2 = 0, eq2 = 0;
    if (k1 > 0)
      for (int i = b0 + tid; i < b1; i += kThreads) {
        const float f = sc_at(i);
        if (f == -INFINITY) continue;
        const uint32_t u = float_order_key(f);
        gt1 += u > t1;
        eq1 += u == t1;
        gt2 += u > t2;
        eq2 += u == t2;
      }
    int s1, s2, s3, s4;
    block_scan2(gt1, eq1, sm, &s1, &s2);
    block_scan2(gt2, eq2, sm, &s3, &s4);
    if (tid == 0) sm.counts = make_int4(s1, s2, s3, s4);
  }
  cluster.sync();
  if (tid < kCl) sm.all[tid] = *cluster.map_shared_rank(&sm.counts, tid);
  __syncthreads();
  if (tid == 0) {
    int o1 = 0, oe = 0, tb1 = 0, tb2 = 0;
    for (int r = 0; r < kCl; ++r) {
      const int4 c = sm.all[r];
      const int x1 = max(0, min(rem[0] - tb1, c.y)), x2 = max(0, min(rem[1] - tb2, c.w));
      const int n1 = c.x + x1, ne = c.z + x2 - n1;
      sm.take1[r] = x1;
      sm.take2[r] = x2;
      sm.n1[r] = n1;
      sm.ne[r] = ne;
      sm.off1[r] = o1;
      sm.offe[r] = oe;
      o1 += n1;
      oe += ne;
      tb1 += c.y;
      tb2 += c.w;
    }
    sm.tot1 = o1;
    sm.tote = oe;
  }
  __syncthreads();
  int* ret = p.retrieval_ids + int64_t{h} * p.k_retrieval;
  int* est = p.k_estimation > 0 ? p.estimation_ids + int64_t{h} * p.k_estimation : nullptr;
  const int my_take1 = sm.take1[rank], my_take2 = sm.take2[rank], my_off1 = sm.off1[rank];
  {
    int ties1 = 0, ties2 = 0, o1 = my_off1, o2 = sm.offe[rank];
    for (int base = b0; base < b1; base += kThreads * kPer) {
      const int i0 = base + tid * kPer;
      uint32_t u[kPer];
      bool valid[kPer];
      int e1 = 0, e2 = 0;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const int i = i0 + j;
        const float f = i < b1 && k1 > 0 ? sc_at(i) : -INFINITY;
        valid[j] = f != -INFINITY;
        u[j] = valid[j] ? float_order_key(f) : 0u;
        e1 += valid[j] && u[j] == t1;
        e2 += valid[j] && u[j] == t2;
      }
      int te1, te2;
      const int2 pre = block_scan2(e1, e2, sm, &te1, &te2);
      int r1 = ties1 + pre.x - e1, r2 = ties2 + pre.y - e2;
      ties1 += te1;
      ties2 += te2;
      bool in1[kPer], ine[kPer];
      int c1 = 0, ce = 0;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const bool eqa = valid[j] && u[j] == t1, eqb = valid[j] && u[j] == t2;
        in1[j] = valid[j] && (u[j] > t1 || (eqa && r1 < my_take1));
        const bool in2 = valid[j] && (u[j] > t2 || (eqb && r2 < my_take2));
        r1 += eqa;
        r2 += eqb;
        ine[j] = in2 && !in1[j];
        c1 += in1[j];
        ce += ine[j];
      }
      int tc1, tce;
      const int2 pos = block_scan2(c1, ce, sm, &tc1, &tce);
      int w1 = o1 + pos.x - c1, w2 = o2 + pos.y - ce;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        if (in1[j]) ret[w1++] = i0 + j;
        if (ine[j]) est[w2++] = i0 + j;
      }
      o1 += tc1;
      o2 += tce;
    }
  }
  const int tot1 = sm.tot1;
  for (int i = sm.tot1 + rank * kThreads + tid; i < p.k_retrieval; i += kCl * kThreads) ret[i] = -1;
  for (int i = sm.tote + rank * kThreads + tid; i < p.k_estimation; i += kCl * kThreads) est[i] = -1;

  // 4. Expansion: steady tokens, then the retrieval items' tokens in id order.
  const int64_t w_begin = p.idx_begin + p.n_idx;
  const int steady = static_cast<int>(p.idx_begin + (p.num_tokens - w_begin));
  int* list = p.token_list + int64_t{h} * p.list_stride;
  for (int i = rank * kThreads + tid; i < steady; i += kCl * kThreads)
    list[i] = static_cast<int>(i < p.idx_begin ? i : w_begin + (i - p.idx_begin));
  auto item_len = [&](int c) -> int {
    if (p.page_tokens > 0) {
      const int64_t b = int64_t{c} * p.page_tokens;
      return static_cast<int>(b + p.page_tokens < p.n_idx ? p.page_tokens : p.n_idx - b);
    }
    const int64_t hc = int64_t{h} * N + c;
    return p.offsets[hc + 1] - p.offsets[hc];
  };
  int* pre = p.scan_scratch + int64_t{h} * (p.k_retrieval + 1);
  __syncthreads();  // this CTA's retrieval ids are visible to the CTA
  {
    const int my_n1 = sm.n1[rank];
    int running = 0;
    for (int base = 0; base < my_n1; base += kThreads) {
      const int i = base + tid;
      const int len = i < my_n1 ? item_len(ret[my_off1 + i]) : 0;
      int tot, unused;
      const int2 inc = block_scan2(len, 0, sm, &tot, &unused);
      if (i < my_n1) pre[my_off1 + i] = running + inc.x - len;
      running += tot;
    }
    if (tid == 0) sm.len_total = running;
  }
  cluster.sync();  // every CTA's ids, offsets (global) and length total (shared) are visible
  if (tid < kCl) sm.lbase[tid] = *cluster.map_shared_rank(&sm.len_total, tid);
  __syncthreads();
  if (tid == 0) {
    int l = 0;
    for (int r = 0; r < kCl; ++r) {
      const int x = sm.lbase[r];
      sm.lbase[r] = l;
      l += x;
    }
    sm.total_len = l;
  }
  __syncthreads();
  for (int i = rank * kWarps + warp; i < tot1; i += kCl * kWarps) {
    int owner = kCl - 1;  // the last rank whose ids start at or before i
    while (sm.off1[owner] > i) --owner;
    const int c = ret[i], at = steady + sm.lbase[owner] + pre[i];
    if (p.page_tokens > 0) {
      const int64_t b = int64_t{c} * p.page_tokens;
      const int len = item_len(c);
      for (int t = lane; t < len; t += 32) list[at + t] = static_cast<int>(p.idx_begin + b + t);
    } else {
      const int64_t hc = int64_t{h} * N + c;
      const int b = p.offsets[hc], e = p.offsets[hc + 1];
      for (int t = b + lane; t < e; t += 32) list[at + (t - b)] = static_cast<int>(p.idx_begin + p.members[t]);
    }
  }
  if (rank == 0 && tid == 0) p.token_count[h] = steady + sm.total_len;
  cluster.sync();  // no CTA leaves while another may still read its shared memory
}

template <bool kInSmem>
cudaError_t launch_cluster(const SelectParams& p, int chunk, cudaStream_t s) {
  static bool attr_set = false;
  const size_t max_bytes = kHistBytes + (kInSmem ? size_t(kMaxChunk) * 4 : 0);
  if (!attr_set) {
    const cudaError_t e = cudaFuncSetAttribute(select_cluster_kernel<kInSmem>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(max_bytes));
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  const size_t bytes = kHistBytes + (kInSmem ? size_t(chunk) * 4 : 0);
  select_cluster_kernel<kInSmem><<<kCl * p.num_heads, kThreads, bytes, s>>>(p, chunk);
  return cudaGetLastError();
}

}  // namespace

cudaError_t select_and_expand_cluster(const SelectParams& p, cudaStream_t s) {
  const int chunk = (p.num_items + kCl - 1) / kCl;
  return chunk <= kMaxChunk ? launch_cluster<true>(p, chunk, s) : launch_cluster<false>(p, chunk, s);
}

cudaError_t select_and_expand(const SelectParams& p, cudaStream_t s) {
  // Runs 4 and 5 (bench/results): the cluster kernel takes ~47 us at 32K batch 1 whatever the size below
  // (a chain of ~50 barrier phases, several through distributed shared memory) and grows with the batch
  // (117 / 364 us at batch 4 / 16), so it loses to a one-CTA kernel while the scores fit that kernel's
  // shared memory, and wins beyond (1M tokens, batch 1: 87 us against 416 us). Run 6: the one-CTA kernel
  // is the few-barrier one (select_and_expand_bins). RETROINFER_SELECT=radix (or single) / cluster / bins
  // forces run 5's one-CTA radix kernel / the cluster kernel / the bins kernel up to 40K items.
  constexpr int kSingleSmemItems = 40 * 1024;  // select.cu: scores in shared memory up to 160 KiB
  static const int forced = [] {
    const char* e = std::getenv("RETROINFER_SELECT");
    if (e == nullptr) return 0;
    return e[0] == 's' || e[0] == 'r' ? 1 : (e[0] == 'c' ? 2 : (e[0] == 'b' ? 3 : 0));
  }();
  // Run 19: the grid selection (several CTAs per head) past kSelectGridMinItems = 40960 items (kernels.h) instead
  // of the cluster kernel (1M tokens, batch 1: 29 against 76 us), where the caller gives it a workspace and it
  // fits; below, the one-CTA bins kernel stays (128K batch 4: 12.3 against 23.7 us: the per-head barriers cost
  // more than one multiprocessor's work). RETROINFER_SELECT forces a kernel; RETROINFER_SELECT_GRID=0 / force.
  const SelectGridMode grid = p.grid_ws != nullptr ? select_grid_mode() : SelectGridMode::kOff;
  if (forced == 0 && (grid == SelectGridMode::kForce || (grid == SelectGridMode::kLarge && p.num_items > kSelectGridMinItems))) {
    int ipt = 0, chunks = 0;
    const cudaError_t e = select_grid_plan(p, &ipt, &chunks);
    if (e != cudaSuccess) return e;
    if (ipt > 0) return select_and_expand_grid(p, ipt, chunks, s);
  }
  const bool cluster = forced == 2 || ((forced == 0 || forced == 3) && p.num_items > kSingleSmemItems);
  if (cluster) return select_and_expand_cluster(p, s);
  return forced == 1 ? select_and_expand_single_cta(p, s) : select_and_expand_bins(p, s);
}

}  // namespace retroinfer::cuda::detail
