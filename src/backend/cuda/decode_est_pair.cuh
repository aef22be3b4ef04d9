// RETROINFER_EXACT=split64w: the chained estimation grid with two 64-cluster chunks per CTA. Included by
// decode.cu only, after the definitions it uses (kW, EstSmem, est_load, the wide fused merge).
//
// Run 16's timeline (128K, batch 4, split64): the estimation grid ran 43.8-70.6 us for ~17 MB of value-sum
// rows. While the exact CTAs run (three of 68 KiB per multiprocessor), shared memory leaves room for one
// estimation CTA of 18.3 KiB beside them, and each such CTA keeps only its 16 KiB of rows in flight through
// a chain of dependent steps (ids, rows, weights, sums, state, count). Here each CTA owns chunks 2b and
// 2b + 1 (slots split_offset + 2b, + 2b + 1): the first chunk's rows go to shared memory by cp.async as in
// estimate_cta, the second chunk's straight into registers (thread = row slot x 4 dims, the layout of
// estimate_cta's step 3 for kVec = 4, 32 registers at D = 128), both issued before any math, so 32 KiB fly
// per CTA in the same shared memory. The chunks are then reduced one after the other with estimate_cta's
// operations in its order (weights, per-thread sums over rows in row order, shuffles, warp sums in warp
// order), so both partial states equal split64's bit for bit. One fused-merge count of 2 per CTA (1 for a
// lone last chunk), by the wide merge.
// Registers: the second chunk's rows and logits stay live through the first chunk's reduction (~100 at
// D = 128): __launch_bounds__(128, 4) (128 registers: one CTA still fits beside three exact CTAs of 128, and
// four to a multiprocessor without them, i.e. eight chunks as split64's eight CTAs).
//
// kJoin (RETROINFER_EXACT=split128w): the same CTA over the 128 clusters [128 b, 128 b + 128) of one slot
// (split_offset + b; ceil(n_e / 128) slots, as split / v1), its two 64-cluster halves reduced as above and
// their states joined in the CTA before the one write: M = max(m_A, m_B), o = o_A e^{m_A - M} + o_B e^{m_B - M},
// l likewise (softmax_merge's arithmetic; the first half's sums kept in registers, its m and l in shared
// memory). 27 states per head at 128K batch 4 instead of 42, so the fused merge reads 2 batches of 16 instead
// of 3; within rounding of v1 (the halves' maxima and sum order differ: decode_path_test_util.h's bounds).
#pragma once

namespace retroinfer::cuda::detail {
namespace {

template <int D, bool kJoin>
__device__ void estimate_pair(const DecodeParams& p, int b, int h, unsigned char* smem) {
  constexpr int kC = kEstimateChunk;             // clusters per chunk
  constexpr int kVec = 4;                        // dims per thread in the sums (split64's kVec)
  constexpr int kThreads = kW * 32;
  constexpr int kChunks = D / 8;                 // 16-byte chunks per value-sum row
  constexpr int kRowsW = kC / kW;                // clusters (rows) loaded by each warp (first chunk)
  constexpr int kCopies = kRowsW * kChunks / 32;  // 16-byte copies per lane
  constexpr int kPerLane = kC / 32;              // clusters per lane in the weights
  constexpr int kCols = D / kVec;                // dim groups per row
  constexpr int kRowSlots = kThreads / kCols;    // rows read at once by the CTA
  constexpr int kSlotsW = 32 / kCols;            // row slots per warp
  constexpr int kRowsB = kC / kRowSlots;         // second-chunk rows per thread (registers)
  static_assert(kRowsW <= 32 && (kRowsW * kChunks) % 32 == 0 && 32 % kCols == 0, "whole warps");
  static_assert(kSlotsW * kRowsB == 16, "a warp's second-chunk ids fit in lanes 0..15");
  uint16_t* rows = reinterpret_cast<uint16_t*>(smem);  // [kC][D] bf16 value sums (first chunk)
  float* wl = reinterpret_cast<float*>(rows + kC * D);   // [kMaxGroup][kC]: logits, then weights
  float* sz = wl + kMaxGroup * kC;                       // [kC]: cluster sizes
  __shared__ float s_m[kMaxGroup], s_l[kMaxGroup];
  __shared__ float s_ma[kMaxGroup], s_la[kMaxGroup];  // kJoin: the first half's m, l
  const EstimateParams& e = p.est;
  const int G = p.group, C = e.num_clusters, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  phase_first(p.phase, h, kSlotEst);  // no PDL wait: see estimate_chained_kernel
  const int j0 = 2 * b, j1 = 2 * b + 1;  // 64-cluster chunks (kJoin: the halves of slot b)
  const int begin_a = j0 * kC, begin_b = j1 * kC;
  const bool has_b = kJoin ? begin_b < e.k_estimation : j1 < p.est_ctas;  // uniform per CTA
  const int cnt_a = e.k_estimation - begin_a < kC ? e.k_estimation - begin_a : kC;  // >= 1 (host checks)
  const int cnt_b = !has_b ? 0 : (e.k_estimation - begin_b < kC ? e.k_estimation - begin_b : kC);
  const int* ids = e.estimation_ids + int64_t{h} * e.k_estimation;
  const uint16_t* vsh = e.value_sums_bf16 + int64_t{h} * C * D;

  // 1. Every load of both chunks before any math. Ids in estimate_cta's layout (lane < kRowsW: cluster
  // warp * kRowsW + lane) for both chunks, and the second chunk's in the sums' layout (lane L < 16 of warp w:
  // row slot w * kSlotsW + L % kSlotsW, its (L / kSlotsW)-th row).
  const int ci = warp * kRowsW + lane;
  const bool own = lane < kRowsW;
  const int ca = own && ci < cnt_a ? est_load<true>(ids + begin_a + ci, false) : -1;
  const int cb = own && ci < cnt_b ? est_load<true>(ids + begin_b + ci, false) : -1;
  const int rs = tid / kCols, dc = tid % kCols;  // the sums' row slot and dim group
  int cr3 = -1;
  if (lane < 16) {
    const int r = warp * kSlotsW + lane % kSlotsW + kRowSlots * (lane / kSlotsW);
    if (r < cnt_b) cr3 = est_load<true>(ids + begin_b + r, false);
  }
#pragma unroll
  for (int k = 0; k < kCopies; ++k) {  // first chunk: the warp's kRowsW rows x kChunks chunks, 32 per step
    const int q = k * 32 + lane, r = q / kChunks, col = q % kChunks;
    const int cr = __shfl_sync(0xffffffffu, ca, r);
    cp_async16_zfill(rows + (warp * kRowsW + r) * D + col * 8, vsh + int64_t{cr < 0 ? 0 : cr} * D + col * 8,
                     cr >= 0);
  }
  cp_async_commit();
  uint2 rb[kRowsB];  // second chunk: row rs + kRowSlots * k, dims dc * 4 .. + 3 (zero past cnt_b)
#pragma unroll
  for (int k = 0; k < kRowsB; ++k) {
    const int c3 = __shfl_sync(0xffffffffu, cr3, k * kSlotsW + lane / kCols);
    rb[k] = c3 >= 0 ? __ldcg(reinterpret_cast<const uint2*>(vsh + int64_t{c3} * D + dc * 4)) : make_uint2(0u, 0u);
  }
  float lg[kMaxGroup], lgb[kMaxGroup];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    lg[g] = g < G && ca >= 0 ? est_load<true>(e.logits + (int64_t{h} * G + g) * C + ca, true) : -INFINITY;
    lgb[g] = g < G && cb >= 0 ? est_load<true>(e.logits + (int64_t{h} * G + g) * C + cb, true) : -INFINITY;
  }
  if (own) sz[ci] = ca < 0 ? 0.0f : static_cast<float>(est_load<true>(e.sizes + int64_t{h} * C + ca, true));
  const float szb = cb < 0 ? 0.0f : static_cast<float>(est_load<true>(e.sizes + int64_t{h} * C + cb, true));
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
    if (g < G && own) wl[g * kC + ci] = lg[g];
  __syncthreads();

  // 2. Weights of the chunk whose logits and sizes are in wl / sz (estimate_cta's step 2).
  auto weights = [&]() {
    for (int g = warp; g < G; g += kW) {
      float x[kPerLane];
      float mx = -INFINITY;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        x[k] = wl[g * kC + lane + 32 * k];
        mx = fmaxf(mx, x[k]);
      }
      mx = warp_max(mx);
      float l = 0.0f;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        const float ev = x[k] == -INFINITY ? 0.0f : __expf(x[k] - mx);
        wl[g * kC + lane + 32 * k] = ev;
        l += sz[lane + 32 * k] * ev;
      }
      l = warp_sum(l);
      if (lane == 0) {
        s_m[g] = mx;
        s_l[g] = l;
      }
    }
  };
  float acc[kMaxGroup][kVec];
  auto zero_acc = [&]() {
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
      for (int k = 0; k < kVec; ++k) acc[g][k] = 0.0f;
  };
  auto add_row = [&](const uint2 w2, int i) {  // acc[g] += w_g[i] * row i's dims dc * 4 .. + 3
    const float2 x0 = bf16x2_to_float2(w2.x), x1 = bf16x2_to_float2(w2.y);
    const float v[kVec] = {x0.x, x0.y, x1.x, x1.y};
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
      if (g < G) {
        const float wg = wl[g * kC + i];
#pragma unroll
        for (int k = 0; k < kVec; ++k) acc[g][k] += wg * v[k];
      }
  };
  // 4. The chunk's partial state into slot (estimate_cta's steps 3 end and 4): the warp's row slots by
  // shuffles, the warps' sums in shared memory (over the rows, whose reads the first barrier ends), in
  // warp order.
  auto reduce_to_red = [&]() {
#pragma unroll
    for (int off = kCols; off < 32; off <<= 1)
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g)
        if (g < G)
#pragma unroll
          for (int k = 0; k < kVec; ++k) acc[g][k] += __shfl_xor_sync(0xffffffffu, acc[g][k], off);
    __syncthreads();
    float* red = reinterpret_cast<float*>(smem);  // [kW][kMaxGroup][D]
    if (lane < kCols)
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g)
        if (g < G)
          *reinterpret_cast<float4*>(red + (warp * kMaxGroup + g) * D + dc * kVec) =
              make_float4(acc[g][0], acc[g][1], acc[g][2], acc[g][3]);
    __syncthreads();
  };
  float* red = reinterpret_cast<float*>(smem);  // [kW][kMaxGroup][D] (after reduce_to_red)
  auto write_state = [&](int slot) {
    reduce_to_red();
    for (int x = tid; x < G * D; x += blockDim.x) {
      const int g = x / D, d = x % D;
      float sum = 0.0f;
#pragma unroll
      for (int w = 0; w < kW; ++w) sum += red[(w * kMaxGroup + g) * D + d];
      const int64_t base = (int64_t{h} * p.total_splits + slot) * G + g;
      p.part_o[base * D + d] = sum;
      if (d == 0) p.part_ml[base] = make_float2(s_m[g], s_l[g]);
    }
  };

  // First chunk: rows from shared memory.
  weights();
  cp_async_wait<0>();
  __syncthreads();  // rows landed, weights written
  zero_acc();
#pragma unroll 4
  for (int i = rs; i < cnt_a; i += kRowSlots) add_row(*reinterpret_cast<const uint2*>(rows + i * D + dc * 4), i);
  constexpr int kKeep = kMaxGroup * D / kThreads;  // kJoin: the first half's sums per thread (x = tid + k * 128)
  float keep[kKeep];
  if (!kJoin || !has_b) {
    write_state(e.split_offset + (kJoin ? b : j0));
  } else {
    reduce_to_red();
#pragma unroll
    for (int k = 0; k < kKeep; ++k) {
      const int x = tid + k * kThreads;
      keep[k] = 0.0f;
      if (x < G * D) {
        const int g = x / D, d = x % D;
#pragma unroll
        for (int w = 0; w < kW; ++w) keep[k] += red[(w * kMaxGroup + g) * D + d];
      }
    }
    if (tid < G) {
      s_ma[tid] = s_m[tid];
      s_la[tid] = s_l[tid];
    }
  }
  // Second chunk: its logits and sizes into wl / sz once the first state's reads (red, s_m, s_l) are done.
  if (has_b) {
    __syncthreads();
    if (own) sz[ci] = szb;
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
      if (g < G && own) wl[g * kC + ci] = lgb[g];
    __syncthreads();
    weights();
    __syncthreads();
    zero_acc();
#pragma unroll
    for (int k = 0; k < kRowsB; ++k)
      if (rs + kRowSlots * k < cnt_b) add_row(rb[k], rs + kRowSlots * k);
    if constexpr (!kJoin) {
      write_state(e.split_offset + j1);
    } else {  // join the halves (s_ma / s_la were written before the barriers above)
      reduce_to_red();
#pragma unroll
      for (int k = 0; k < kKeep; ++k) {
        const int x = tid + k * kThreads;
        if (x < G * D) {
          const int g = x / D, d = x % D;
          float sum = 0.0f;
#pragma unroll
          for (int w = 0; w < kW; ++w) sum += red[(w * kMaxGroup + g) * D + d];
          const float ma = s_ma[g], mb = s_m[g];
          const float mx = ma > mb ? ma : mb;
          const float sa = softmax_rescale(ma, mx), sb = softmax_rescale(mb, mx);  // 0 for an empty half
          const int64_t base = (int64_t{h} * p.total_splits + e.split_offset + b) * G + g;
          p.part_o[base * D + d] = keep[k] * sa + sum * sb;
          if (d == 0) p.part_ml[base] = make_float2(mx, s_la[g] * sa + s_l[g] * sb);
        }
      }
    }
  }
  if (p.phase != nullptr) {
    __syncthreads();
    phase_last(p.phase, h, kSlotEst + 1);
  }
  if (p.merge.counter != nullptr)  // its first barrier ends the reads of red above
    merge_if_last_wide<kWideBatchExact>(p.merge, p.part_ml, p.part_o, p.total_splits, G, D, h,
                                        !kJoin && has_b ? 2 : 1,
                                        reinterpret_cast<float*>(smem), p.phase);
}

// The grid: x = chunk pair b (ceil(est_ctas / 2); kJoin: slot b, est_ctas), y = flat head. Launched as
// estimate_chained_kernel is (a programmatic dependent of the exact grid, no wait before its work); its last
// CTA waits for the exact grid at its end for the same reason.
template <int D, bool kJoin>
__global__ void __launch_bounds__(kW * 32, 4) estimate_pair_kernel(const DecodeParams p) {
  extern __shared__ __align__(16) unsigned char est_smem[];
  estimate_pair<D, kJoin>(p, blockIdx.x, blockIdx.y, est_smem);
  if (blockIdx.x == gridDim.x - 1 && blockIdx.y == gridDim.y - 1) grid_dependency_wait();
}

}  // namespace
}  // namespace retroinfer::cuda::detail
