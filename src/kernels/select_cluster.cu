// Zone selection split over a thread-block cluster (docs/design.md §2 "Scoring"; also Quest's page selection): the
// selection past the bins kernel's 40960 items where the grid selection does not apply (no workspace, scores
// still to form, or its CTAs would not all be resident at once).
//
// One cluster of kCl = 8 CTAs per flat head; CTA r owns the items [r * chunk, (r + 1) * chunk). The result is
// the one of the other selection kernels ("sort by (score desc, id asc) and cut at k_r and k_r + k_e", ids
// ascending, the retrieval items expanded into the head's exact-token list after the steady zone):
//   1. scores = sum over the group of the per-head softmax over the non-empty items (each CTA merges the
//      score kernel's normaliser partials itself), written to global and kept in shared memory;
//   2. exact radix select of both thresholds (select_common.cuh radix_select2): each CTA builds
//      warp-aggregated histograms of its items, adds the non-zero bins into rank 0's histogram of the pass
//      through distributed shared memory, and after a cluster barrier every CTA reads the merged histogram
//      and finds the same digits;
//   3. compaction in ascending id order with the ties at a threshold taken in id order: each CTA publishes
//      its (> t1, == t1, > t2, == t2) counts, so every CTA knows how many ties lower ranks take and where its
//      ids go;
//   4. expansion: each CTA scans the lengths of its own retrieval items, publishes the total, and all
//      CTAs of the cluster then expand the head's retrieval items warp by warp (balanced whatever the ids).
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include "kernels/common.cuh"
#include "kernels/kernels.h"
#include "kernels/select_common.cuh"

namespace retroinfer::cuda::detail {

namespace {

namespace cg = cooperative_groups;

constexpr int kCl = 8;  // CTAs per head: the portable cluster-size maximum
constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kPasses = 3;  // radix_select2's passes
constexpr int kPer = 8;     // consecutive items per thread in the compaction
// Dynamic shared memory: rank 0's merged histograms of each pass, then the CTA's scores.
constexpr size_t kMergedBytes = size_t(kPasses) * 2 * kRadixBins * 4;  // 48 KiB
constexpr int kMaxChunk = 32768;                                         // scores in shared memory: 128 KiB

struct ClusterSmem {
  RadixSmem<kThreads> radix;  // the radix passes' own histograms and the block scan's scratch
  int4 counts;     // published: (> t1, == t1, > t2, == t2) over this CTA's items
  int len_total;   // published: exact tokens of this CTA's retrieval items
  int4 all[kCl];   // every rank's counts
  int n1[kCl], off1[kCl], take1[kCl], take2[kCl], ne[kCl], offe[kCl], lbase[kCl];
  int tot1, tote, total_len;
  float gmax[kMaxGroup], ginv[kMaxGroup];
};

// radix_select2's histograms of a pass as the cluster's sum: every CTA adds its non-zero counters into rank
// 0's histogram of the pass (one per pass, so no pass waits for the previous one's readers), then after the
// cluster barrier reads that sum through distributed shared memory.
struct ClusterHistograms {
  unsigned* merged;  // [kPasses][2][kRadixBins] of this CTA (rank 0's is the one used)
  __device__ const unsigned* operator()(const unsigned* local, int pass, int words) const {
    cg::cluster_group cluster = cg::this_cluster();
    unsigned* mg = cluster.map_shared_rank(merged + pass * 2 * kRadixBins, 0);
    for (int i = threadIdx.x; i < words; i += blockDim.x) {
      const unsigned v = local[i];
      if (v != 0u) atomicAdd(mg + i, v);
    }
    cluster.sync();
    return mg;
  }
};

template <bool kInSmem>
__global__ void __cluster_dims__(kCl, 1, 1) __launch_bounds__(kThreads)
    select_cluster_kernel(const SelectParams p, int chunk) {
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ ClusterSmem sm;
  extern __shared__ __align__(16) unsigned char dsm[];
  unsigned* merged = reinterpret_cast<unsigned*>(dsm);               // [kPasses][2][kRadixBins]
  float* ssc = reinterpret_cast<float*>(dsm + kMergedBytes);         // [chunk] when kInSmem
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
    for (int i = tid; i < kPasses * 2 * kRadixBins; i += kThreads) merged[i] = 0;
  // 1. Scores of this CTA's items.
  if (G > 0) {
    if (warp < G)
      merge_head_normaliser(p.norm_partial + (int64_t{h} * G + warp) * p.norm_parts, p.norm_parts, warp, sm.gmax,
                            sm.ginv);
    __syncthreads();
    const float* lgh = p.logits + int64_t{h} * G * N;
    for (int i = b0 + tid; i < b1; i += kThreads) {
      float lv[1][kMaxGroup];
      load_logits<1, false>(lv, lgh, N, G, i, kThreads, b1);
      const float s = form_head_score(lv[0], G, sm.gmax, sm.ginv);
      gsc[i] = s;
      if constexpr (kInSmem) ssc[i - b0] = s;
    }
  } else if constexpr (kInSmem) {
    for (int i = b0 + tid; i < b1; i += kThreads) ssc[i - b0] = gsc[i];
  }
  cluster.sync();  // rank 0's histograms are zero, every CTA runs, the scores are in place

  // 2. Both thresholds over the cluster's items (every CTA gets the same k, thr and take).
  const int budget[2] = {p.k_retrieval, p.k_retrieval + p.k_estimation};
  int k[2], take[2];
  uint32_t thr[2];
  radix_select2(kInSmem ? ssc : gsc + b0, b1 - b0, budget, sm.radix, k, thr, take, ClusterHistograms{merged});
  const int k1 = k[0], k2 = k[1];  // k1 == 0 < k2: no retrieval budget, the second cut alone
  const bool on1 = k1 > 0, on2 = k2 > 0;
  const uint32_t t1 = thr[0], t2 = thr[1];

  // 3. Compaction. Counts of this CTA, published; every CTA derives every rank's share of the ties.
  {
    int gt1 = 0, eq1 = 0, gt2 = 0, eq2 = 0;
    if (on2)
      for (int i = b0 + tid; i < b1; i += kThreads) {
        const float f = sc_at(i);
        if (f == -INFINITY) continue;
        const uint32_t u = float_order_key(f);
        if (on1) {
          gt1 += u > t1;
          eq1 += u == t1;
        }
        gt2 += u > t2;
        eq2 += u == t2;
      }
    int s1, s2, s3, s4;
    block_scan2(gt1, eq1, sm.radix.scan, &s1, &s2);
    block_scan2(gt2, eq2, sm.radix.scan, &s3, &s4);
    if (tid == 0) sm.counts = make_int4(s1, s2, s3, s4);
  }
  cluster.sync();
  if (tid < kCl) sm.all[tid] = *cluster.map_shared_rank(&sm.counts, tid);
  __syncthreads();
  if (tid == 0) {
    int o1 = 0, oe = 0, tb1 = 0, tb2 = 0;
    for (int r = 0; r < kCl; ++r) {
      const int4 c = sm.all[r];
      const int x1 = max(0, min(take[0] - tb1, c.y)), x2 = max(0, min(take[1] - tb2, c.w));
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
        const float f = i < b1 && on2 ? sc_at(i) : -INFINITY;
        valid[j] = f != -INFINITY;
        u[j] = valid[j] ? float_order_key(f) : 0u;
        e1 += valid[j] && on1 && u[j] == t1;
        e2 += valid[j] && u[j] == t2;
      }
      int te1, te2;
      const int2 pre = block_scan2(e1, e2, sm.radix.scan, &te1, &te2);
      int r1 = ties1 + pre.x - e1, r2 = ties2 + pre.y - e2;
      ties1 += te1;
      ties2 += te2;
      bool in1[kPer], ine[kPer];
      int c1 = 0, ce = 0;
#pragma unroll
      for (int j = 0; j < kPer; ++j) {
        const bool eqa = valid[j] && on1 && u[j] == t1, eqb = valid[j] && u[j] == t2;
        in1[j] = valid[j] && on1 && (u[j] > t1 || (eqa && r1 < my_take1));
        const bool in2 = valid[j] && (u[j] > t2 || (eqb && r2 < my_take2));
        r1 += eqa;
        r2 += eqb;
        ine[j] = in2 && !in1[j];
        c1 += in1[j];
        ce += ine[j];
      }
      int tc1, tce;
      const int2 pos = block_scan2(c1, ce, sm.radix.scan, &tc1, &tce);
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
      const int2 inc = block_scan2(len, 0, sm.radix.scan, &tot, &unused);
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
  const size_t max_bytes = kMergedBytes + (kInSmem ? size_t(kMaxChunk) * 4 : 0);
  if (!attr_set) {
    const cudaError_t e = cudaFuncSetAttribute(select_cluster_kernel<kInSmem>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(max_bytes));
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  const size_t bytes = kMergedBytes + (kInSmem ? size_t(chunk) * 4 : 0);
  select_cluster_kernel<kInSmem><<<kCl * p.num_heads, kThreads, bytes, s>>>(p, chunk);
  return cudaGetLastError();
}

}  // namespace

cudaError_t select_and_expand_cluster(const SelectParams& p, cudaStream_t s) {
  const int chunk = (p.num_items + kCl - 1) / kCl;
  return chunk <= kMaxChunk ? launch_cluster<true>(p, chunk, s) : launch_cluster<false>(p, chunk, s);
}

}  // namespace retroinfer::cuda::detail
