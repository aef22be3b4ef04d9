// Dense decode attention that streams K and V at the copy engine's pace (decode_dense.h).
//
// Grid (num_splits, H): one CTA per (split, flat head) streams the split's contiguous token range once for
// all G query heads of the GQA group. Few, long-lived CTAs (kDenseCtasPerSm per multiprocessor over all
// heads) with many bytes in flight each: a ring of S stages, stage = the K tile and the V tile of
// kDenseTile = 64 consecutive tokens, filled by one producer thread and drained by kCW = kDenseComputeWarps
// compute warps, each stage with two mbarriers:
//   full[s]  completes when the stage's bytes have landed: one arrive.expect_tx(bytes) by the producer
//            thread, the copies' complete_tx;
//   empty[s] completes when the kCW compute warps have read the stage (one arrive per warp).
// Tile i uses stage s = i % S for the u-th time, u = i / S: the consumers wait full[s] for parity u & 1;
// the producer refills it for tile i >= S after empty[s] completed phase u - 1 (parity (u & 1) ^ 1). The
// producer cannot get a phase ahead of a waiting consumer (it needs that consumer's release first), so
// parities never alias. Every issued copy completes a full barrier that the consumers wait on, so all
// copies have landed when the consumers leave the loop; the CTA barrier after it orders the reuse of the
// stage buffers for the warps' state merge.
//
// bulk's shared-memory layout of a tile (K or V; tma2d's: "tma2d layout" below): the 64 rows as 8 blocks of 8
// consecutive tokens, each block one contiguous copy of 8 * 2D bytes (the rows are contiguous in global memory),
// blocks kBlockBytes = 8 * 2D + 16 bytes apart. The 16-byte skew per block makes the ldmatrix reads
// conflict-free without swizzling the copies: compute warp w takes the tokens 8b + 2w + x (block b = 0..7, x =
// 0, 1), so the 8 row addresses of every 8x8 ldmatrix matrix are the same row and 16-byte column of the 8
// blocks, at byte offsets b * kBlockBytes + c: 16-byte bank groups (b * (D + 1) + c / 16) mod 8 = (b + c / 16)
// mod 8, all different. (Unskewed, rows 2D bytes apart would put the 8 rows in one bank group: 8-way conflicts,
// 32 shared-memory wavefronts per ldmatrix.x4 instead of 4, ~2 K cycles of shared-memory traffic per 32 KiB tile
// per CTA, the same order as the time HBM takes to deliver it; the skew costs 8 copies of 2 KiB per tile instead
// of one of 16 KiB.) A tail tile copies only its valid rows; the compute warps mask the logits of the rest and
// zero their V rows before P.V (0 * stale shared memory could be NaN).
//
// Math per compute warp and tile (its 16 tokens): decode.cu's (decode_math.cuh), tensor-core flash decoding with
// mma m16n8k16 (S^T = Q K^T with the query split into bf16 hi + lo rows, online softmax on the fragments, O^T +=
// P V with P split likewise: both carried to 2^-18 relative), then the warps' states merge in shared memory and
// the CTA writes one partial state per query head (the softmax_state.h format of the split-K path), merged by
// the fused merge of the head's last CTA (decode_merge.cuh) or combine_states.
//
// The two kernels (DenseVariant: bulk and tma2d, decode_dense.h DenseKernel kBulkCopy and kTensorMap) differ only
// in how a tile is copied and laid out.
#include <cuda.h>  // CUtensorMap and its encoder's declaration (the encoder itself: cudaGetDriverEntryPoint)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>

#include "kernels/async_copy.cuh"
#include "kernels/common.cuh"
#include "kernels/decode_dense.h"
#include "kernels/decode_math.cuh"
#include "kernels/decode_merge.cuh"
#include "kernels/kernels.h"
#include "kernels/tensor_map.h"
#include "retroinfer/softmax_state.h"

namespace retroinfer::cuda::detail {
namespace {

// A kernel (decode_dense.h DenseKernel): kCW compute warps, each taking 16 tokens of every tile of kT
// tokens; kTma (tma2d): the tiles copied by 2-D tensor-map copies (see "tma2d layout" below), else (bulk)
// by 1-D bulk copies into the skewed blocks of the file comment. Both: one producer thread's bulk-copy
// protocol, kDenseCtasPerSm CTAs per multiprocessor.
template <bool kTmaCopies>
struct DenseVariant {
  static constexpr int kCW = kDenseComputeWarps;
  static constexpr bool kTma = kTmaCopies;
  static constexpr int kT = kDenseTile;  // tokens per tile
  static constexpr int kBlocks = kT / 8;
  static constexpr int kThreads = kDenseThreads;
  static constexpr int kCtasPerSm = kDenseCtasPerSm;
  static_assert(kT == 16 * kCW && kThreads == (kCW + 1) * 32, "decode_dense.h constants: 16 tokens per warp");
};
using VariantBulk = DenseVariant<false>;
using VariantTma2d = DenseVariant<true>;

// tma2d layout: a K (or V) tile is D / 64 boxes of 64 tokens x 64 dims (128-byte box rows: box b holds
// dims 64b..64b+63), each box one copy of the tensor map [H][kv_stride][D] with CU_TENSOR_MAP_SWIZZLE_128B:
// the 16-byte chunk c of box row r lies at chunk c ^ (r % 8) (boxes 1024-byte aligned). Compute warp w
// takes the consecutive tokens 16w..16w+15; the 8 rows of an ldmatrix matrix are 8 consecutive tokens at
// one logical chunk, so 8 different physical chunks: conflict-free. Rows past the tensor's kv_stride are
// zero-filled by the copy and count in its bytes, so every box completes kBoxBytes.
template <int D, class V>
struct DenseLayout {
  static constexpr int kCW = V::kCW;
  static constexpr int kRowBytes = D * 2;                     // one token's K (or V) row, bf16
  static constexpr int kBlockBytes = 8 * kRowBytes + 16;      // 8 rows + the 16-byte skew
  static constexpr int kBoxBytes = 64 * 128;                  // tma2d: one box
  static constexpr int kAlign = V::kTma ? 1024 : 0;           // tma2d: slack to align the stages to 1 KiB
  static constexpr int kTileBytes = V::kTma ? D / 64 * kBoxBytes : V::kBlocks * kBlockBytes;  // K or V
  static constexpr int kStageBytes = 2 * kTileBytes;          // K tile, then V tile
  // Stages: as many as fit the shared-memory budget of a CTA: 100,000 bytes with two CTAs per
  // multiprocessor (bulk, D = 128: 3 x 32.25 KiB; D = 64: 6 x 16.25 KiB: 2 x (97 + 1 reserved) KiB + the
  // static barriers fit the 227 KiB a multiprocessor gives; tma2d: 3 x 32 KiB + 1 KiB of alignment slack,
  // 6 x 16 KiB). While a tile is computed, the other S - 1 stages' copies are in flight: 64 KiB per CTA at
  // D = 128, 128 KiB per multiprocessor, against the ~36 KB HBM's bandwidth-latency product needs per
  // multiprocessor (4.8 TB/s x ~1 us / 132).
  static_assert(V::kCtasPerSm == 2, "the budget below is half a multiprocessor's shared memory");
  static constexpr int kBudget = 100000;
  static constexpr int kStages = (kBudget - kAlign) / kStageBytes;
  static constexpr size_t kBytes = size_t{kStages} * kStageBytes + kAlign;  // dynamic shared memory
  static_assert(kStages >= 2, "at least double buffering");
  static_assert(kBlockBytes % 16 == 0 && kRowBytes % 16 == 0, "bulk copies need 16-byte addresses and sizes");
  // The warps' state staging and the fused merge's weights reuse the stages after the loop.
  static constexpr size_t kStageO = size_t{kCW} * kMaxGroup * D * 4;
  static constexpr size_t kStageMl = size_t{kCW} * kMaxGroup * 8;
  static_assert(kStageO + kStageMl + size_t{kMergeMaxStates} * 4 <= kBytes - kAlign, "staging fits in the stages");
};
static_assert(DenseLayout<128, VariantBulk>::kStages == 3 && DenseLayout<64, VariantBulk>::kStages == 6,
              "bulk's ring as measured");

// The tensor maps of tma2d (zero for bulk): K and V as [H][kv_stride][D] bf16, boxes of
// 64 x 64 x 1, 128-byte swizzle.
struct DenseMaps {
  CUtensorMap k, v;
};

template <int D, class V>
__global__ void __launch_bounds__(V::kThreads, V::kCtasPerSm)
    dense_decode_kernel(const DenseParams p, const __grid_constant__ DenseMaps maps) {
  using L = DenseLayout<D, V>;
  constexpr int S = L::kStages;
  constexpr int kT = V::kT, kCW = V::kCW;
  constexpr int kKs = D / 16;     // QK k-steps
  constexpr int kNt = D / 8;      // PV n-tiles (8 dims each)
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw;  // the stages (tma2d: 1 KiB aligned for the 128-byte swizzle)
  if constexpr (L::kAlign > 0) smem += (L::kAlign - (smem_u32(smem_raw) & (L::kAlign - 1))) & (L::kAlign - 1);
  __shared__ __align__(8) uint64_t full_bar[S];
  __shared__ __align__(8) uint64_t empty_bar[S];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = blockIdx.y, split = blockIdx.x, G = p.group;
  const int64_t n = p.num_tokens;
  const int64_t begin = int64_t{split} * n / p.num_splits;
  const int64_t end = int64_t{split + 1} * n / p.num_splits;
  const int64_t len = end - begin;
  const int ntiles = len > 0 ? static_cast<int>((len + kT - 1) / kT) : 0;

  if (threadIdx.x == 0) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      mbar_init(&full_bar[s], 1);
      mbar_init(&empty_bar[s], kCW);
    }
    mbar_init_fence();
  }
  __syncthreads();

  float m = -INFINITY, l = 0.0f;  // compute warps: query head gq; l is this lane's partial sum
  float o[kNt][4];
#pragma unroll
  for (int j = 0; j < kNt; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  const int gq = (lane >> 2), tq = lane & 3;

  if (warp == kCW) {
    // ---- producer warp ----
    const uint64_t pol = l2_evict_first_policy();  // K/V are streamed once
    const uint16_t* kh = p.k + (int64_t{h} * p.kv_stride + begin) * D;
    const uint16_t* vh = p.v + (int64_t{h} * p.kv_stride + begin) * D;
    if (lane == 0) {
      for (int i = 0; i < ntiles; ++i) {
        const int s = i % S;
        if (i >= S) mbar_wait(&empty_bar[s], ((i / S) & 1) ^ 1);
        const int64_t left = len - int64_t{i} * kT;
        const int rows = static_cast<int>(left < kT ? left : kT);
        unsigned char* kst = smem + s * L::kStageBytes;
        unsigned char* vst = kst + L::kTileBytes;
        if constexpr (V::kTma) {  // whole boxes (rows past the split: masked / zeroed by the consumers)
          mbar_arrive_expect_tx(&full_bar[s], static_cast<uint32_t>(L::kStageBytes));
          const int t = static_cast<int>(begin + int64_t{i} * kT);  // < kv_stride <= INT32_MAX (host check)
#pragma unroll
          for (int bx = 0; bx < D / 64; ++bx) {
            tma_load_3d(kst + bx * L::kBoxBytes, &maps.k, 64 * bx, t, h, &full_bar[s], pol);
            tma_load_3d(vst + bx * L::kBoxBytes, &maps.v, 64 * bx, t, h, &full_bar[s], pol);
          }
          continue;
        }
        mbar_arrive_expect_tx(&full_bar[s], static_cast<uint32_t>(2 * rows * L::kRowBytes));
        const uint16_t* ks = kh + int64_t{i} * kT * D;
        const uint16_t* vs = vh + int64_t{i} * kT * D;
        for (int b = 0; b * 8 < rows; ++b) {
          const int r = rows - b * 8 < 8 ? rows - b * 8 : 8;
          const uint32_t bytes = static_cast<uint32_t>(r * L::kRowBytes);
          bulk_copy_g2s(kst + b * L::kBlockBytes, ks + b * 8 * D, bytes, &full_bar[s], pol);
          bulk_copy_g2s(vst + b * L::kBlockBytes, vs + b * 8 * D, bytes, &full_bar[s], pol);
        }
      }
    }
    __syncwarp();
  } else {
    // ---- compute warps ----
    // Query A fragments (decode_math.cuh); rows of heads >= G are zero.
    uint32_t qa[kKs][4];
    query_fragments<D>(qa, p.q, h, G, gq, tq, p.scale);
    // ldmatrix row addresses (matrix mi = lane >> 3, row ri = lane & 7 = the block). n index j of the QK
    // n-tile x (and k index j / 8 + j of P.V) is the token 8j + 2w + x of the tile.
    //   QK, matrices (x 0, k lo), (x 0, k hi), (x 1, k lo), (x 1, k hi): token 8ri + 2w + (mi >> 1),
    //       16-byte column 2k + (mi & 1) at k-step k;
    //   PV, matrices (x 0, dims d0), (x 1, d0), (x 0, d0 + 8), (x 1, d0 + 8): token 8ri + 2w + (mi & 1),
    //       column 2jj + (mi >> 1) for dims d0 = 16jj.
    const int mi = lane >> 3, ri = lane & 7;
    int k_off = ri * L::kBlockBytes + (2 * warp + (mi >> 1)) * L::kRowBytes + (mi & 1) * 16;
    int v_off = ri * L::kBlockBytes + (2 * warp + (mi & 1)) * L::kRowBytes + (mi >> 1) * 16;
    // This lane's accumulator tokens: s[0] (x 0, n 2tq), s[1] (x 0, n 2tq + 1), s[2] (x 1, n 2tq),
    // s[3] (x 1, n 2tq + 1).
    int t0 = 2 * warp;  // the warp's first token of a tile
    int tok[4] = {16 * tq + t0, 16 * tq + t0 + 8, 16 * tq + t0 + 1, 16 * tq + t0 + 9};
    if constexpr (V::kTma) {
      // n index j of the QK n-tile x (and k index 8x + j of P.V) is the token 16w + 8x + j. Row parts of the
      // ldmatrix offsets here; the chunk part (2k + (mi & 1)) ^ ri, i.e. (2k mod 8) ^ k_x, per step below.
      //   QK matrices (x 0, k lo), (x 0, k hi), (x 1, k lo), (x 1, k hi): token 16w + 8 (mi >> 1) + ri;
      //   PV matrices (x 0, d0), (x 1, d0), (x 0, d0 + 8), (x 1, d0 + 8): token 16w + 8 (mi & 1) + ri.
      t0 = 16 * warp;
      k_off = (t0 + 8 * (mi >> 1) + ri) * 128;
      v_off = (t0 + 8 * (mi & 1) + ri) * 128;
      tok[0] = t0 + 2 * tq; tok[1] = t0 + 2 * tq + 1; tok[2] = t0 + 8 + 2 * tq; tok[3] = t0 + 9 + 2 * tq;
    }
    const int k_x = (mi & 1) ^ ri, v_x = (mi >> 1) ^ ri;  // tma2d: this lane's chunk swizzle terms
    // Shared-memory byte offsets of QK step k's and P.V column pair jj's ldmatrix in a tile.
    auto k_at = [&](int k) {
      return V::kTma ? (k >> 2) * L::kBoxBytes + k_off + ((((2 * k) & 7) ^ k_x) << 4) : k_off + k * 32;
    };
    auto v_at = [&](int jj) {
      return V::kTma ? (jj >> 2) * L::kBoxBytes + v_off + ((((2 * jj) & 7) ^ v_x) << 4) : v_off + jj * 32;
    };
    for (int i = 0; i < ntiles; ++i) {
      const int s_idx = i % S;
      mbar_wait(&full_bar[s_idx], (i / S) & 1);
      const int64_t left = len - int64_t{i} * kT;
      const int valid = static_cast<int>(left < kT ? left : kT);
      const unsigned char* kst = smem + s_idx * L::kStageBytes;
      unsigned char* vst = smem + s_idx * L::kStageBytes + L::kTileBytes;
      if (t0 < valid) {  // else none of the warp's tokens (>= t0) is in the tile
        if (valid < kT) {
          // Tail tile (the split's last): zero this warp's V rows past the end (bulk: never copied, stale or
          // uninitialised shared memory; tma2d: the next split's rows, rows past n, or zeros past
          // kv_stride). No copy writes this stage again.
          for (int c = lane; c < 16 * kChunks; c += 32) {
            const int r = c / kChunks, col = c % kChunks, b = r >> 1, x = r & 1;
            if (V::kTma ? t0 + r >= valid : t0 + 8 * b + x >= valid) {  // tma2d: every chunk of the row
              const int off = V::kTma ? (col >> 3) * L::kBoxBytes + (t0 + r) * 128 + (col & 7) * 16
                                      : b * L::kBlockBytes + (2 * warp + x) * L::kRowBytes + col * 16;
              *reinterpret_cast<uint4*>(vst + off) = make_uint4(0u, 0u, 0u, 0u);
            }
          }
          __syncwarp();
        }
        float c0[4] = {0, 0, 0, 0}, c1[4] = {0, 0, 0, 0};
#pragma unroll
        for (int k = 0; k < kKs; ++k) {
          uint32_t b[4];
          ldmatrix_x4(b, kst + k_at(k));
          mma_bf16_16816(c0, qa[k], b[0], b[1]);
          mma_bf16_16816(c1, qa[k], b[2], b[3]);
        }
        float sv[4] = {c0[0] + c0[2], c0[1] + c0[3], c1[0] + c1[2], c1[1] + c1[3]};
        // The new running max is finite: token t0 is valid (the quad's max covers it).
        uint32_t pa[4];
        softmax_tile<kNt>(sv, tok, valid, m, l, o, pa);
#pragma unroll
        for (int jj = 0; jj < kNt / 2; ++jj) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, vst + v_at(jj));
          mma_bf16_16816(o[2 * jj], pa, b[0], b[1]);
          mma_bf16_16816(o[2 * jj + 1], pa, b[2], b[3]);
        }
      }
      __syncwarp();  // every lane's reads of the stage are done (their results are in registers)
      if (lane == 0) mbar_arrive(&empty_bar[s_idx]);
    }
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
  }

  // Merge the compute warps' states: staged in shared memory (the stage buffers: every copy has landed,
  // see the file comment), then one thread per (query head, dimension) merges them in warp order.
  __syncthreads();
  float* stage_o = reinterpret_cast<float*>(smem);                              // [kCW, kMaxGroup, D]
  float2* stage_ml = reinterpret_cast<float2*>(stage_o + kCW * kMaxGroup * D);  // [kCW, kMaxGroup]
  if (warp < kCW && gq < G) stage_warp_state<D>(stage_o, stage_ml, o, m, l, warp, gq, tq);
  __syncthreads();
  merge_warp_states<D, kCW>(stage_o, stage_ml, G, int64_t{h} * p.num_splits + split, p.part_ml, p.part_o);
  if (p.merge.counter != nullptr)  // merge_if_last's first barrier ends the reads of the staging above
    merge_if_last(p.merge, p.part_ml, p.part_o, p.num_splits, G, D, h,
                  reinterpret_cast<float*>(stage_ml + kCW * kMaxGroup), nullptr);
}

// The kernel with its attributes set, once per instantiation (thread-safe static initialisation): > 48 KiB
// of dynamic shared memory, and the largest shared-memory carveout so that V::kCtasPerSm CTAs fit on a
// multiprocessor. Its occupancy (CTAs per multiprocessor, queried once) sizes the splits.
struct DenseKernelInfo {
  void (*kernel)(const DenseParams, const DenseMaps) = nullptr;
  cudaError_t status = cudaSuccess;
  int ctas_per_sm = 0;
};
template <int D, class V>
const DenseKernelInfo& dense_kernel_info() {
  static const DenseKernelInfo info = [] {
    DenseKernelInfo k;
    k.kernel = dense_decode_kernel<D, V>;
    const int bytes = static_cast<int>(DenseLayout<D, V>::kBytes);
    k.status = cudaFuncSetAttribute(k.kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (k.status == cudaSuccess)
      k.status = cudaFuncSetAttribute(k.kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                      cudaSharedmemCarveoutMaxShared);
    if (k.status == cudaSuccess)
      k.status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&k.ctas_per_sm, k.kernel, V::kThreads, bytes);
    return k;
  }();
  return info;
}

template <class V>
const DenseKernelInfo* dense_kernel_info_dim(int head_dim) {
  if (head_dim == 128) return &dense_kernel_info<128, V>();
  if (head_dim == 64) return &dense_kernel_info<64, V>();
  return nullptr;
}

// Calls f(V{}) with the variant of kernel k.
template <class F>
cudaError_t with_variant(DenseKernel k, F&& f) {
  switch (k) {
    case DenseKernel::kBulkCopy:
      return f(VariantBulk{});
    case DenseKernel::kTensorMap:
      return f(VariantTma2d{});
  }
  return cudaErrorInvalidValue;
}

// tma2d: K's and V's tensor maps ([H][kv_stride][D] bf16, boxes 64 dims x 64 tokens x 1 head, 128-byte
// swizzle, zero fill past the bounds), encoded by the driver's cuTensorMapEncodeTiled, obtained once through
// the runtime (no link against libcuda); cached_dense_maps keeps the recent ones.
cudaError_t encode_dense_maps(const DenseParams& p, DenseMaps* maps) {
  const TensorMapEncode encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  if (p.kv_stride > 0x7fffffff) return cudaErrorInvalidValue;  // 32-bit token coordinates
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(p.head_dim), static_cast<cuuint64_t>(p.kv_stride),
                              static_cast<cuuint64_t>(p.num_heads)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p.head_dim) * 2,
                                 static_cast<cuuint64_t>(p.kv_stride) * p.head_dim * 2};  // bytes, dims 1 and 2
  const cuuint32_t box[3] = {64, 64, 1}, elem_strides[3] = {1, 1, 1};
  for (int t = 0; t < 2; ++t) {
    const CUresult r = encode(t == 0 ? &maps->k : &maps->v, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3,
                              const_cast<uint16_t*>(t == 0 ? p.k : p.v), dims, strides, box, elem_strides,
                              CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                              CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) return cudaErrorInvalidValue;
  }
  return cudaSuccess;
}

// encode_dense_maps through a per-thread cache (tensor_map.h TensorMapCache): the maps depend only on
// (K, V, kv_stride, heads, head_dim), which a layer keeps from one decode to the next, and the encoder is host
// work on every launch (two encodings per layer and step in the model runner).
struct MapKey {
  const uint16_t *k = nullptr, *v = nullptr;
  int64_t kv_stride = 0;
  int num_heads = 0, head_dim = 0;
  bool operator==(const MapKey&) const = default;
};
cudaError_t cached_dense_maps(const DenseParams& p, DenseMaps* maps) {
  thread_local TensorMapCache<MapKey, DenseMaps> cache;
  return cache.get(MapKey{p.k, p.v, p.kv_stride, p.num_heads, p.head_dim}, maps,
                   [&](DenseMaps* m) { return encode_dense_maps(p, m); });
}

}  // namespace

cudaError_t dense_decode_stream(DenseKernel kernel, const DenseParams& p, cudaStream_t s) {
  if (p.num_splits < 1 || p.num_splits > p.num_tokens || p.num_heads < 1 || p.num_heads > 65535 || p.group < 1 ||
      p.group > kMaxGroup || p.kv_stride < p.num_tokens || (reinterpret_cast<uintptr_t>(p.k) & 15) != 0 ||
      (reinterpret_cast<uintptr_t>(p.v) & 15) != 0)
    return cudaErrorInvalidValue;
  return with_variant(kernel, [&](auto v) -> cudaError_t {
    using V = decltype(v);
    const DenseKernelInfo* k = dense_kernel_info_dim<V>(p.head_dim);
    if (k == nullptr) return cudaErrorInvalidValue;
    if (k->status != cudaSuccess) return k->status;
    const size_t bytes = p.head_dim == 128 ? DenseLayout<128, V>::kBytes : DenseLayout<64, V>::kBytes;
    DenseMaps maps;
    std::memset(&maps, 0, sizeof(maps));
    if constexpr (V::kTma) {
      // No tensor-map encoder in the driver, or token coordinates past 32 bits: the bulk kernel (the same
      // CTAs per multiprocessor, so the same splits).
      if (cached_dense_maps(p, &maps) != cudaSuccess) return dense_decode_stream(DenseKernel::kBulkCopy, p, s);
    }
    k->kernel<<<dim3(p.num_splits, p.num_heads), V::kThreads, bytes, s>>>(p, maps);
    return cudaGetLastError();
  });
}

cudaError_t dense_ctas_per_sm(DenseKernel kernel, int head_dim, int* ctas) {
  return with_variant(kernel, [&](auto v) -> cudaError_t {
    const DenseKernelInfo* k = dense_kernel_info_dim<decltype(v)>(head_dim);
    if (k == nullptr) return cudaErrorInvalidValue;
    *ctas = k->ctas_per_sm;
    return k->status;
  });
}

}  // namespace retroinfer::cuda::detail
