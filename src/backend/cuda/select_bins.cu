// Zone selection with a handful of barriers (DESIGN.md §2 "Scoring"; run 6 of docs/cuda-kernels.md), the
// default one-CTA-per-head selection up to 40K items. Same result as select.cu's radix kernel and
// select_cluster.cu's cluster kernel: "sort by (score desc, id asc) and cut at k_r and k_r + k_e", ids
// ascending, the retrieval items expanded into the head's exact-token list (steady zone first).
#include <cuda_runtime.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/select_common.cuh"

namespace retroinfer::cuda::detail {

namespace {

// The radix kernel (select.cu) is a chain of ~30 block barriers plus three warp-aggregated histogram passes
// (__match_any_sync per item and threshold). This one finds both thresholds with ONE histogram:
//   1. scores as in the radix kernel (sum over the group of the per-head softmax), and the smallest / largest order key of the finite scores (one block reduction);
//   2. one histogram of kBinBins bins over the key adapted to that range, bin = (key - lo) >> shift with the
//      smallest shift that fits the range into the bins (monotone in the key, so higher bins hold strictly
//      higher keys); one block scan finds the bins holding rank k1 and rank k2 and the ranks inside them;
//   3. the keys of those (at most two) bins gathered into shared memory; each candidate counts the
//      candidates above and equal to it, and the one whose (>, >=) counts bracket the rank is the threshold
//      (exact: the same k-th key as the radix passes, with `take` = how many of its ties are in);
//      a bin with more than kBinCand candidates (long runs of exact ties) falls back to the radix passes;
//   4. one compaction scan of (retrieval, estimation, exact tokens) in ascending id order, the tie-ranking
//      scan only when a threshold takes some but not all of its ties (the CPU rule: ties in id order);
//   5. expansion warp by warp from shared memory.
// About 13 barriers in all. Scores must fit shared memory (<= 40K items).
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

__global__ void __launch_bounds__(kSelThreads) select_bins_kernel(const SelectParams p) {
  __shared__ SelectSmem sm;
  __shared__ BinSmem bs;
  extern __shared__ float smem_scores[];
  const int h = blockIdx.x, N = p.num_items, G = p.group, tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31;
  float* gsc = p.scores + int64_t{h} * N;
  float* sc = smem_scores;
  unsigned* hist = &sm.hist[0][0];  // kBinBins counters
  for (int i = tid; i < kBinBins; i += blockDim.x) hist[i] = 0u;
  if (tid < 2) bs.cand_n[tid] = 0;
  // PDL (p.pdl): let the exact-attention CTAs launch (they wait for this grid in turn), then wait for the
  // score kernel's logits and partials. Nothing the score kernel writes is read before the wait.
  grid_launch_dependents();
  // Run 8: the head's CSR offsets (index data, not written by the score kernel) on their way into L2
  // before the wait; the compaction reads those of the retrieval items.
  if (p.prefetch && p.page_tokens == 0 && p.offsets != nullptr)
    for (int i = tid * 32; i <= N; i += blockDim.x * 32) prefetch_l2(p.offsets + int64_t{h} * N + i);
  grid_dependency_wait();
  sel_stamp(p.phase, h, 0);
  uint32_t kmin = 0xffffffffu, kmax = 0u;
  if (G > 0) {
    __shared__ float gmax[kMaxGroup], ginv[kMaxGroup];
    if (warp < G) merge_head_normaliser(p.norm_partial + (int64_t{h} * G + warp) * p.norm_parts, p.norm_parts, warp, gmax, ginv);
    __syncthreads();
    const float* lgh = p.logits + int64_t{h} * G * N;
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
  } else {
    // Ready scores (quest, outliers, oracle; run 9's form_scores): 4 independent loads in flight per thread
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
  sel_stamp(p.phase, h, 1);
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
  sel_stamp(p.phase, h, 2);
  // Thread t owns bins kBinBins-1-4t ... kBinBins-4-4t (descending).
  unsigned cnt[kBinBinsPerThread];
  int own = 0;
#pragma unroll
  for (int jj = 0; jj < kBinBinsPerThread; ++jj) {
    cnt[jj] = hist[kBinBins - 1 - kBinBinsPerThread * tid - jj];
    own += static_cast<int>(cnt[jj]);
  }
  int finite, unused;
  const int incl = block_scan2(own, 0, sm, &finite, &unused).x;  // (3-5)
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
  sel_stamp(p.phase, h, 3);
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
  sel_stamp(p.phase, h, 4);
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
  sel_stamp(p.phase, h, 5);  // after the barrier (8) or the radix passes' last one
  const int k1 = k[0], k2 = k[1];
  const uint32_t t1 = thr[0], t2 = thr[1];
  const int take1 = take[0], take2 = take[1];
  // Tie ranks are needed only when a threshold takes some but not all of its ties.
  const bool rank_ties = (k1 > 0 && take1 != eqn[0]) || (k2 > 0 && take2 != eqn[1]);

  constexpr int kPer = 8;  // chunk of 8192 items: the packed 16-bit counters cannot overflow
  int* ret = p.retrieval_ids + int64_t{h} * p.k_retrieval;
  int* est = p.k_estimation > 0 ? p.estimation_ids + int64_t{h} * p.k_estimation : nullptr;
  int* pre = p.scan_scratch + int64_t{h} * (p.k_retrieval + 1);
  const int64_t w_begin = p.idx_begin + p.n_idx;
  const int steady = static_cast<int>(p.idx_begin + (p.num_tokens - w_begin));
  int ties1 = 0, ties2 = 0, out1 = 0, out2 = 0, running = steady;
  for (int base = 0; base < N; base += blockDim.x * kPer) {
    const int i0 = base + tid * kPer;
    uint32_t u[kPer];
    bool valid[kPer];
    int e12 = 0;
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const int i = i0 + j;
      valid[j] = i < N && sc[i] != -INFINITY;
      u[j] = valid[j] ? float_order_key(sc[i]) : 0u;
      e12 += (valid[j] && k1 > 0 && u[j] == t1 ? 1 : 0) + (valid[j] && k2 > 0 && u[j] == t2 ? 1 << 16 : 0);
    }
    int r1 = 0, r2 = 0;
    if (rank_ties) {
      int tot;
      const int eq_pre = block_exclusive_scan(e12, sm, &tot);
      r1 = ties1 + (eq_pre & 0xffff);
      r2 = ties2 + (eq_pre >> 16);
      ties1 += tot & 0xffff;
      ties2 += tot >> 16;
    }
    bool in1[kPer], ine[kPer];
    int c12 = 0, toks = 0, len[kPer], beg[kPer];
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      const bool eq1 = valid[j] && k1 > 0 && u[j] == t1, eq2 = valid[j] && k2 > 0 && u[j] == t2;
      in1[j] = valid[j] && k1 > 0 && (u[j] > t1 || (eq1 && (!rank_ties || r1 < take1)));
      const bool in2 = valid[j] && k2 > 0 && (u[j] > t2 || (eq2 && (!rank_ties || r2 < take2)));
      r1 += eq1;
      r2 += eq2;
      ine[j] = in2 && !in1[j];
      c12 += (in1[j] ? 1 : 0) + (ine[j] ? 1 << 16 : 0);
      len[j] = 0;
      beg[j] = 0;
      if (in1[j]) {
        const int c = i0 + j;
        if (p.page_tokens > 0) {
          const int64_t b = int64_t{c} * p.page_tokens;
          beg[j] = static_cast<int>(b);
          len[j] = static_cast<int>(b + p.page_tokens < p.n_idx ? p.page_tokens : p.n_idx - b);
        } else {
          const int64_t hc = int64_t{h} * N + c;
          beg[j] = p.offsets[hc];
          len[j] = p.offsets[hc + 1] - beg[j];
          // Run 8: start the members' way into L2 now; the expansion reads them after two barriers.
          if (p.prefetch)
            for (int o = 0; o < len[j]; o += 32) prefetch_l2(p.members + beg[j] + o);
        }
        toks += len[j];
      }
    }
    int tot_c, tot_t;
    const int2 inc = block_scan2(c12, toks, sm, &tot_c, &tot_t);
    const int pos = inc.x - c12;
    int w1 = out1 + (pos & 0xffff), w2 = out2 + (pos >> 16), at = running + (inc.y - toks);
#pragma unroll
    for (int j = 0; j < kPer; ++j) {
      if (in1[j]) {
        ret[w1] = i0 + j;
        if (w1 < kBinExp) {
          bs.exp_begin[w1] = beg[j];
          bs.exp_at[w1] = at;
          bs.exp_len[w1] = len[j];
        } else {
          pre[w1] = at;
        }
        ++w1;
        at += len[j];
      }
      if (ine[j]) est[w2++] = i0 + j;
    }
    out1 += tot_c & 0xffff;
    out2 += tot_c >> 16;
    running += tot_t;
  }
  for (int i = out1 + tid; i < p.k_retrieval; i += blockDim.x) ret[i] = -1;
  for (int i = out2 + tid; i < p.k_estimation; i += blockDim.x) est[i] = -1;
  int* list = p.token_list + int64_t{h} * p.list_stride;
  for (int i = tid; i < steady; i += blockDim.x)
    list[i] = static_cast<int>(i < p.idx_begin ? i : w_begin + (i - p.idx_begin));
  __syncthreads();  // expansion table
  sel_stamp(p.phase, h, 6);
  // Run 8 (p.prefetch): a half-warp per retrieval item (clusters hold ~tokens_per_cluster = 16 tokens, so a
  // whole warp leaves half its lanes idle): 64 items per round instead of 32 (148 items at 128K: 3 dependent
  // rounds instead of 5). Run 6: a warp per item. The same list either way.
  const int sub = p.prefetch ? 16 : 32, per_warp = 32 / sub;
  const int slot = warp * per_warp + lane / sub, sl = lane % sub;
  for (int i = slot; i < out1; i += kSelWarps * per_warp) {
    int b, at, n;
    if (i < kBinExp) {
      b = bs.exp_begin[i];
      at = bs.exp_at[i];
      n = bs.exp_len[i];
    } else {
      const int c = ret[i];
      at = pre[i];
      if (p.page_tokens > 0) {
        const int64_t b64 = int64_t{c} * p.page_tokens;
        b = static_cast<int>(b64);
        n = static_cast<int>(b64 + p.page_tokens < p.n_idx ? p.page_tokens : p.n_idx - b64);
      } else {
        const int64_t hc = int64_t{h} * N + c;
        b = p.offsets[hc];
        n = p.offsets[hc + 1] - b;
      }
    }
    if (p.page_tokens > 0) {
      for (int t = sl; t < n; t += sub) list[at + t] = static_cast<int>(p.idx_begin + b + t);
    } else {
      for (int t = sl; t < n; t += sub) list[at + t] = static_cast<int>(p.idx_begin + p.members[b + t]);
    }
  }
  if (tid == 0) p.token_count[h] = running;
  if (p.phase != nullptr) {  // diagnostics: the end of the slowest warp's expansion
    __syncthreads();
    sel_stamp(p.phase, h, 7);
  }
}

}  // namespace

// The few-barrier selection (select_bins_kernel); the caller keeps it to <= 40K items (scores in shared
// memory).
cudaError_t select_and_expand_bins(const SelectParams& p, cudaStream_t s) {
  constexpr size_t kMaxSmemScores = 160 * 1024;
  const size_t bytes = size_t(p.num_items) * 4;
  if (bytes > kMaxSmemScores) return cudaErrorInvalidValue;
  static bool attr_set = false;
  if (!attr_set) {
    const cudaError_t e = cudaFuncSetAttribute(select_bins_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kMaxSmemScores));
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  return launch_maybe_pdl(select_bins_kernel, dim3(p.num_heads), dim3(kSelThreads), bytes, s, p.pdl, p);
}

}  // namespace retroinfer::cuda::detail
