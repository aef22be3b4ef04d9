// Decode attention kernels: split-K flash decoding over a dense token range or a token list (steady +
// retrieval zone, quest pages), estimation-zone attention from cluster summaries, and the merge of the
// partial softmax states of all splits (include/retroinfer/softmax_state.h).
//
// decode_kernel<D, kIndirect>: one CTA per (split, flat KV head) handles every query head of the GQA
// group, so each K/V row is read once from memory. Each warp streams tiles of kDecodeTile tokens into
// shared memory with cp.async (two stages per warp, K rows padded by 16 bytes so that the per-token row
// reads of the QK step hit distinct banks), computes the tile's logits (lane = token, the two half-warps
// split the head dimension), updates its online softmax state, and accumulates P.V with lane = 4 (D=128)
// or 2 (D=64) output dimensions. The warps' states merge in shared memory at the end; the CTA writes one
// partial state per query head.
#include <cuda_runtime.h>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"
#include "retroinfer/softmax_state.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kW = kDecodeWarps;
constexpr int kT = kDecodeTile;
static_assert(kT == 16, "the QK mapping uses lane & 15 as the token of the tile");

template <int D>
struct DecodeSmem {
  static constexpr int kKRow = D + 8;  // bf16 elements per padded K row (16 bytes of padding)
  static constexpr size_t kWarpBytes =
      2 * (size_t{kT} * kKRow * 2 + size_t{kT} * D * 2) + size_t{kT} * kMaxGroup * 4;
  static constexpr size_t kBytes = size_t{kMaxGroup} * D * 4 + kW * kWarpBytes;
};

template <int D, bool kIndirect>
__global__ void __launch_bounds__(kW * 32) decode_kernel(const DecodeParams p) {
  constexpr int kKRow = DecodeSmem<D>::kKRow;
  constexpr int kChunks = D / 8;           // 16-byte chunks per row
  constexpr int kLoads = kT * kChunks / 32;  // chunks per lane per tile (K or V)
  constexpr int kDl = D / 32;              // output dims per lane
  extern __shared__ __align__(16) unsigned char smem_raw[];
  float* qs = reinterpret_cast<float*>(smem_raw);  // [G, D] scaled query
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  unsigned char* wbase = smem_raw + size_t{kMaxGroup} * D * 4 + warp * DecodeSmem<D>::kWarpBytes;
  uint16_t* ks = reinterpret_cast<uint16_t*>(wbase);           // [2][kT][kKRow]
  uint16_t* vs = ks + 2 * kT * kKRow;                          // [2][kT][D]
  float* ps = reinterpret_cast<float*>(vs + 2 * kT * D);       // [kT][kMaxGroup]

  const int h = blockIdx.y, split = blockIdx.x, G = p.group;
  const int64_t count = kIndirect ? p.token_count[h] : p.num_tokens;
  const int64_t begin = int64_t{split} * p.split_tokens;
  const int64_t end = begin + p.split_tokens < count ? begin + p.split_tokens : count;
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) qs[i] = p.q[int64_t{h} * G * D + i] * p.scale;
  __syncthreads();

  const uint16_t* kh = p.k + int64_t{h} * p.kv_stride * D;
  const uint16_t* vh = p.v + int64_t{h} * p.kv_stride * D;
  const int* list = kIndirect ? p.token_list + int64_t{h} * p.list_stride : nullptr;
  const int ntiles = end > begin ? static_cast<int>((end - begin + kT - 1) / kT) : 0;

  auto load_tile = [&](int t, int buf) {
    const int64_t p0 = begin + int64_t{t} * kT;
    const int valid = static_cast<int>(end - p0 < kT ? end - p0 : kT);
    int tok_lane = 0;
    if constexpr (kIndirect) {
      if (lane < valid) tok_lane = list[p0 + lane];
    }
#pragma unroll
    for (int i = 0; i < kLoads; ++i) {
      const int c = lane + 32 * i;
      const int row = c / kChunks, col = c % kChunks;
      int64_t tok;
      if constexpr (kIndirect) {
        tok = __shfl_sync(0xffffffffu, tok_lane, row);
      } else {
        tok = p0 + row;
      }
      if (row < valid) {
        cp_async16(ks + (buf * kT + row) * kKRow + col * 8, kh + tok * D + col * 8);
        cp_async16(vs + (buf * kT + row) * D + col * 8, vh + tok * D + col * 8);
      }
    }
    cp_async_commit();
  };

  float m[kMaxGroup], l[kMaxGroup], o[kMaxGroup][kDl];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int j = 0; j < kDl; ++j) o[g][j] = 0.0f;
  }

  const int row = lane & 15, half = lane >> 4;
  if (warp < ntiles) load_tile(warp, 0);
  for (int it = 0;; ++it) {
    const int t = warp + it * kW;
    if (t >= ntiles) break;
    const int buf = it & 1;
    if (t + kW < ntiles) {
      load_tile(t + kW, buf ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncwarp();
    const int64_t p0 = begin + int64_t{t} * kT;
    const int valid = static_cast<int>(end - p0 < kT ? end - p0 : kT);

    // Logits: lane (row, half) dots its half of the head dimension, then the halves add.
    float acc[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) acc[g] = 0.0f;
    const uint16_t* krow = ks + (buf * kT + row) * kKRow + half * (D / 2);
#pragma unroll
    for (int c = 0; c < D / 16; ++c) {
      float kf[8];
      bf16x8_to_float(*reinterpret_cast<const uint4*>(krow + c * 8), kf);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g < G) {
          const float4 qa = *reinterpret_cast<const float4*>(qs + g * D + half * (D / 2) + c * 8);
          const float4 qb = *reinterpret_cast<const float4*>(qs + g * D + half * (D / 2) + c * 8 + 4);
          acc[g] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] +
                    qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
        }
      }
    }
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      if (g < G) {
        float s = acc[g] + __shfl_xor_sync(0xffffffffu, acc[g], 16);
        s = row < valid ? s : -INFINITY;
        float mt = s;
#pragma unroll
        for (int off = 8; off > 0; off >>= 1) mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, off));
        const float m_new = fmaxf(m[g], mt);
        const float alpha = softmax_rescale(m[g], m_new);
        const float pr = row < valid ? __expf(s - m_new) : 0.0f;
        l[g] = l[g] * alpha + (half == 0 ? pr : 0.0f);
        if (half == 0) ps[row * kMaxGroup + g] = pr;
#pragma unroll
        for (int j = 0; j < kDl; ++j) o[g][j] *= alpha;
        m[g] = m_new;
      }
    }
    __syncwarp();
    // P.V: lane owns kDl consecutive output dimensions.
    for (int r = 0; r < valid; ++r) {
      float vf[kDl];
      if constexpr (kDl == 4) {
        const uint2 w = *reinterpret_cast<const uint2*>(vs + (buf * kT + r) * D + lane * 4);
        const float2 a = bf16x2_to_float2(w.x), b = bf16x2_to_float2(w.y);
        vf[0] = a.x; vf[1] = a.y; vf[2] = b.x; vf[3] = b.y;
      } else {
        const uint32_t w = *reinterpret_cast<const uint32_t*>(vs + (buf * kT + r) * D + lane * 2);
        const float2 a = bf16x2_to_float2(w);
        vf[0] = a.x; vf[1] = a.y;
      }
      const float4 pa = *reinterpret_cast<const float4*>(ps + r * kMaxGroup);
      const float4 pb = *reinterpret_cast<const float4*>(ps + r * kMaxGroup + 4);
      const float pg[kMaxGroup] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g)
        if (g < G) {
#pragma unroll
          for (int j = 0; j < kDl; ++j) o[g][j] += pg[g] * vf[j];
        }
    }
    __syncwarp();
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) l[g] = warp_sum(l[g]);

  // Merge the warps' states: stage them in shared memory (reusing the tile buffers), then one thread per
  // (query head, dimension) merges over warps in warp order.
  __syncthreads();
  float* stage_o = reinterpret_cast<float*>(smem_raw + size_t{kMaxGroup} * D * 4);  // [kW, G, D]
  float2* stage_ml = reinterpret_cast<float2*>(stage_o + kW * kMaxGroup * D);         // [kW, G]
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
    if (g < G) {
#pragma unroll
      for (int j = 0; j < kDl; ++j) stage_o[(warp * kMaxGroup + g) * D + lane * kDl + j] = o[g][j];
      if (lane == 0) stage_ml[warp * kMaxGroup + g] = make_float2(m[g], l[g]);
    }
  __syncthreads();
  const int slot = p.split_offset + split;
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    SoftmaxScalars st;
    float acc_o = 0.0f;
    for (int w = 0; w < kW; ++w) {
      const float2 ml = stage_ml[w * kMaxGroup + g];
      SoftmaxScalars b;
      b.m = ml.x;
      b.l = ml.y;
      const float ob = stage_o[(w * kMaxGroup + g) * D + d];
      softmax_merge(st, &acc_o, b, &ob, 1);
    }
    const int64_t base = (int64_t{h} * p.total_splits + slot) * G + g;
    p.part_o[base * D + d] = acc_o;
    if (d == 0) p.part_ml[base] = make_float2(st.m, st.l);
  }
}

// Estimation zone: one warp per estimated cluster, lane = kDl dims of the value sum; every lane keeps
// the (identical) scalars of each query head. softmax_push with weight = cluster size and the value sum
// as the value gives numerator e^logit * VS and denominator size * e^logit (DESIGN.md §2).
template <int D>
__global__ void __launch_bounds__(kW * 32) estimate_kernel(const EstimateParams p) {
  constexpr int kDl = D / 32;
  __shared__ float stage_o[kW * kMaxGroup * D];
  __shared__ float2 stage_ml[kW * kMaxGroup];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = blockIdx.y, split = blockIdx.x, G = p.group;
  const int per = (p.k_estimation + p.num_splits - 1) / p.num_splits;
  const int begin = split * per;
  const int end = begin + per < p.k_estimation ? begin + per : p.k_estimation;
  SoftmaxScalars st[kMaxGroup];
  float o[kMaxGroup][kDl];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
#pragma unroll
    for (int j = 0; j < kDl; ++j) o[g][j] = 0.0f;
  const int* ids = p.estimation_ids + int64_t{h} * p.k_estimation;
  for (int i = begin + warp; i < end; i += kW) {
    const int c = ids[i];
    if (c < 0) break;  // padding comes last
    const int64_t hc = int64_t{h} * p.num_clusters + c;
    const float size = static_cast<float>(p.sizes[hc]);
    float vf[kDl];
    const uint16_t* vrow = p.value_sums_bf16 + hc * D + lane * kDl;
#pragma unroll
    for (int j = 0; j < kDl; ++j) vf[j] = bf16_to_f32(vrow[j]);
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g)
      if (g < G) {
        const float logit = p.logits[(int64_t{h} * G + g) * p.num_clusters + c];
        softmax_push(st[g], o[g], logit, size, vf, kDl);
      }
  }
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g)
    if (g < G) {
#pragma unroll
      for (int j = 0; j < kDl; ++j) stage_o[(warp * kMaxGroup + g) * D + lane * kDl + j] = o[g][j];
      if (lane == 0) stage_ml[warp * kMaxGroup + g] = make_float2(st[g].m, st[g].l);
    }
  __syncthreads();
  const int slot = p.split_offset + split;
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    SoftmaxScalars acc;
    float acc_o = 0.0f;
    for (int w = 0; w < kW; ++w) {
      const float2 ml = stage_ml[w * kMaxGroup + g];
      SoftmaxScalars b;
      b.m = ml.x;
      b.l = ml.y;
      const float ob = stage_o[(w * kMaxGroup + g) * D + d];
      softmax_merge(acc, &acc_o, b, &ob, 1);
    }
    const int64_t base = (int64_t{h} * p.total_splits + slot) * G + g;
    p.part_o[base * D + d] = acc_o;
    if (d == 0) p.part_ml[base] = make_float2(acc.m, acc.l);
  }
}

// One thread per (query head, dimension): merges every split in slot order and normalises.
__global__ void combine_kernel(const CombineParams p) {
  const int h = blockIdx.x, D = p.head_dim, G = p.group;
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
    const int g = i / D, d = i % D;
    SoftmaxScalars st;
    float acc_o = 0.0f;
    for (int s = 0; s < p.total_splits; ++s) {
      const int64_t base = (int64_t{h} * p.total_splits + s) * G + g;
      const float2 ml = p.part_ml[base];
      SoftmaxScalars b;
      b.m = ml.x;
      b.l = ml.y;
      const float ob = p.part_o[base * D + d];
      softmax_merge(st, &acc_o, b, &ob, 1);
    }
    softmax_finish(st, &acc_o, p.out + (int64_t{h} * G + g) * D + d, 1);
  }
}

template <int D, bool kIndirect>
cudaError_t launch_decode(const DecodeParams& p, cudaStream_t s) {
  constexpr size_t bytes = DecodeSmem<D>::kBytes;
  static_assert(DecodeSmem<D>::kWarpBytes * kW >= size_t{kW} * kMaxGroup * D * 4 + kW * kMaxGroup * 8,
                "the warp-merge staging must fit in the tile buffers");
  static bool attr_set = false;  // once per instantiation (host-side; the layers are single-threaded)
  if (!attr_set) {
    const cudaError_t e = cudaFuncSetAttribute(decode_kernel<D, kIndirect>,
                                               cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  decode_kernel<D, kIndirect><<<dim3(p.num_splits, p.num_heads), kW * 32, bytes, s>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t decode_attention(const DecodeParams& p, cudaStream_t s) {
  const bool indirect = p.token_list != nullptr;
  if (p.head_dim == 128) return indirect ? launch_decode<128, true>(p, s) : launch_decode<128, false>(p, s);
  if (p.head_dim == 64) return indirect ? launch_decode<64, true>(p, s) : launch_decode<64, false>(p, s);
  return cudaErrorInvalidValue;
}

cudaError_t estimate_attention(const EstimateParams& p, cudaStream_t s) {
  const dim3 grid(p.num_splits, p.num_heads);
  if (p.head_dim == 128) estimate_kernel<128><<<grid, kW * 32, 0, s>>>(p);
  else if (p.head_dim == 64) estimate_kernel<64><<<grid, kW * 32, 0, s>>>(p);
  else return cudaErrorInvalidValue;
  return cudaGetLastError();
}

cudaError_t combine_states(const CombineParams& p, cudaStream_t s) {
  const int threads = p.group * p.head_dim < 1024 ? p.group * p.head_dim : 1024;
  combine_kernel<<<p.num_heads, threads, 0, s>>>(p);
  return cudaGetLastError();
}

}  // namespace retroinfer::cuda::detail
