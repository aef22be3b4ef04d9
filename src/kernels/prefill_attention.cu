// Causal GQA prefill attention kernel (flash-attention-2 style, mma.sync bf16), the launch dispatch between
// it and the Hopper kernel (prefill_attention_hopper.cu), and the split merge. Layout, tiling and precision:
// prefill_kernels.h.
#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>

#include "kernels/common.cuh"
#include "kernels/prefill_common.cuh"
#include "kernels/prefill_kernels.h"
#include "kernels/tensor_map.h"

namespace retroinfer::cuda::detail {
namespace {

constexpr int kBM = kPrefillRows;   // packed query rows per CTA
constexpr int kThreads = kPrefillWarps * 32;
constexpr int kWarpRows = kBM / kPrefillWarps;  // 32: two m16 tiles per warp
static_assert(kWarpRows == 32, "each warp owns two m16 tiles");

// Shared-memory tiles are [rows][D] bf16 with 16-byte chunk c of row r stored at chunk c ^ (r & 7): the 8
// rows that one ldmatrix 8x8 matrix (or one quarter-warp of 16-byte cp.async writes) touches then fall in 8
// different 16-byte bank groups. D / 8 >= 8 chunks per row, so the XOR stays inside the row.
template <int D>
__device__ __forceinline__ int swz(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// ldmatrix on a shared-space address (32-bit): the per-lane base plus a compile-time offset, which ptxas
// folds into the instruction's immediate (no per-(kk, tile) address registers stay live across the loop).
__device__ __forceinline__ void ldsm_x4(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}
__device__ __forceinline__ void ldsm_x4_trans(uint32_t* r, uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
}

// Byte address of logical chunk 2 * kk + hi of a row whose low three bits are r7, split so that only
// kk & 3 needs a register: (2kk + hi) ^ r7 = 8 (kk >> 2) + ((2 (kk & 3) + hi) ^ r7) because r7 < 8 and
// 2 (kk & 3) + hi < 8. pat[b] holds the row's byte offset plus 16 ((2b + hi) ^ r7); chunk 2kk + hi of the
// row is at pat[kk & 3] + 128 (kk >> 2).
template <int D>
__device__ __forceinline__ void chunk_patterns(uint32_t* pat, uint32_t base, int row, int hi) {
#pragma unroll
  for (int b = 0; b < 4; ++b) pat[b] = base + uint32_t(row * D * 2) + uint32_t(((2 * b + hi) ^ (row & 7)) << 4);
}

template <int D, int BN>
struct PrefillSmem {
  static_assert(BN % 16 == 0 && BN <= kPrefillKeys, "key tiles are whole k16 steps of the PV product");
  static constexpr int kQ = kBM * D;       // bf16 elements of the Q tile
  static constexpr int kKV = BN * D;       // bf16 elements of one K (or V) tile
  // K/V stages: tile j + kStages - 1 is copied while tile j is computed. Three (two tiles of prefetch,
  // which covers the L2 latency under load better than one) where two CTAs still fit a multiprocessor
  // (228 KiB of shared memory, 1 KiB reserved per CTA): D=64 64 KiB; D=128 would take 128 KiB and keeps
  // two stages (96 KiB).
  static constexpr size_t kSmPerCta = 113 * 1024;
  static constexpr int kStages = size_t(kQ + 2 * 3 * kKV) * 2 <= kSmPerCta ? 3 : 2;
  // Q, then K[stage], then V[stage].
  static constexpr size_t kBytes = size_t(kQ + 2 * kStages * kKV) * 2;
  static_assert(kBytes <= kSmPerCta, "two CTAs per multiprocessor");
};

// Issues the cp.async copies of K/V tile `kb` (tokens [kb, kb + BN)) into one stage; tokens >= kv_end
// are zero-filled (a masked probability 0 times a stale NaN would poison the row). Thread tid copies
// chunk tid % (D / 8) of rows tid / (D / 8) + i * kRowsPerPass: one swizzled offset serves every pass
// (kRowsPerPass is a multiple of 8, so row & 7 and the XOR do not change).
template <int D, int BN>
__device__ __forceinline__ void load_kv_tile(uint16_t* sk, uint16_t* sv, const uint16_t* gk, const uint16_t* gv,
                                             int kb, int kv_end) {
  constexpr int kChunks = D / 8;
  constexpr int kRowsPerPass = kThreads / kChunks;
  static_assert(kRowsPerPass % 8 == 0 && BN % kRowsPerPass == 0, "whole passes of whole swizzle groups");
  const int row0 = threadIdx.x / kChunks, c = threadIdx.x % kChunks;
  const int soff = swz<D>(row0, c);
  const int tok0 = kb + row0;
  const int64_t goff = int64_t(tok0) * D + c * 8;
#pragma unroll
  for (int i = 0; i < BN / kRowsPerPass; ++i) {
    const bool valid = tok0 + i * kRowsPerPass < kv_end;
    // An invalid row reads nothing (src-size 0); its address is token 0's chunk, always in range.
    const int64_t off = valid ? goff + i * kRowsPerPass * D : c * 8;
    cp_async16_zfill(sk + soff + i * kRowsPerPass * D, gk + off, valid);
    cp_async16_zfill(sv + soff + i * kRowsPerPass * D, gv + off, valid);
  }
}

template <int D, int BN>
__global__ void __launch_bounds__(kThreads, 2) prefill_kernel(const PrefillParams p) {
  using Smem = PrefillSmem<D, BN>;
  constexpr int kChunks = D / 8;
  constexpr int kDT = D / 8;              // n8 tiles of the output per m16 tile
  constexpr int kNT = BN / 8;            // n8 tiles of the logits per m16 tile
  constexpr bool kQInRegs = (D == 64);    // D=64: Q fragments (32 registers) stay in registers
  extern __shared__ __align__(128) uint16_t smem[];
  uint16_t* sq = smem;
  uint16_t* sk0 = smem + Smem::kQ;
  uint16_t* sv0 = sk0 + Smem::kStages * Smem::kKV;

  const PrefillCta cta = prefill_cta(p, kBM, BN, static_cast<int>(blockIdx.x));
  const int h = cta.h, r0 = cta.r0, kv_end = cta.kv_end, first_masked = cta.first_masked;
  const int j0 = cta.j0, num_tiles = cta.num_tiles;

  const uint16_t* gk = p.k + int64_t(h) * p.kv_stride * D;
  const uint16_t* gv = p.v + int64_t(h) * p.kv_stride * D;

  // Prologue: K/V tiles 0 .. kStages - 2 in flight (one commit group each, empty past the last tile)
  // while Q is converted to bf16.
#pragma unroll
  for (int st = 0; st < Smem::kStages - 1; ++st) {
    if (j0 + st < num_tiles)
      load_kv_tile<D, BN>(sk0 + st * Smem::kKV, sv0 + st * Smem::kKV, gk, gv, (j0 + st) * BN, kv_end);
    cp_async_commit();
  }
  for (int idx = threadIdx.x; idx < kBM * kChunks; idx += kThreads) {
    const int row = idx / kChunks, c = idx % kChunks;
    *reinterpret_cast<uint4*>(sq + swz<D>(row, c)) = q_chunk_bf16<D>(p, cta, r0 + row, c);
  }

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int quad = lane >> 2, tig = lane & 3;
  const int wrow = warp * kWarpRows;  // first row of this warp in the CTA tile
  // ldmatrix lane addresses (see chunk_patterns). Q (A operand, 16x16 per x4): lanes 0-15 rows 0-15 of
  // chunk 2kk, lanes 16-31 rows 0-15 of chunk 2kk + 1. K (B operand of two n8 key tiles): lanes 0-7 keys
  // 0-7 chunk 2kk, 8-15 keys 0-7 chunk 2kk + 1, 16-23 keys 8-15 chunk 2kk, 24-31 keys 8-15 chunk 2kk + 1.
  // V (transposed B operand of two n8 output tiles, chunk 2dp + hi): lanes 0-7 keys 0-7 / 8-15 keys 8-15
  // of chunk 2dp, 16-23 keys 0-7 / 24-31 keys 8-15 of chunk 2dp + 1.
  uint32_t q_pat[4], k_pat[4], v_pat[4];
  chunk_patterns<D>(q_pat, static_cast<uint32_t>(__cvta_generic_to_shared(sq)), wrow + (lane & 15), lane >> 4);
  chunk_patterns<D>(k_pat, static_cast<uint32_t>(__cvta_generic_to_shared(sk0)),
                    (lane & 7) + ((lane >> 4) << 3), (lane >> 3) & 1);
  chunk_patterns<D>(v_pat, static_cast<uint32_t>(__cvta_generic_to_shared(sv0)),
                    (lane & 7) + (((lane >> 3) & 1) << 3), lane >> 4);

  float o[2][kDT][4];
  float row_max[2][2], row_sum[2][2];  // running max (log2 units, scaled) and this thread's partial sum
#pragma unroll
  for (int mt = 0; mt < 2; ++mt) {
#pragma unroll
    for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][dt][e] = 0.0f;
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      row_max[mt][hf] = -INFINITY;
      row_sum[mt][hf] = 0.0f;
    }
  }

  uint32_t qreg[2][kQInRegs ? D / 16 : 1][4];  // D=64 only: Q fragments of the whole head
  if constexpr (kQInRegs) {
    __syncthreads();  // the Q tile is complete
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
        ldsm_x4(qreg[mt][kk], q_pat[kk & 3] + (kk >> 2) * 128 + mt * 16 * D * 2);
  }

  int stage = 0;  // stage of tile j: (j - j0) % kStages
  for (int j = j0; j < num_tiles; ++j) {
    // One commit group per tile (empty ones past the end): at most kStages - 2 groups younger than tile
    // j's may still be in flight.
    cp_async_wait<Smem::kStages - 2>();
    __syncthreads();  // tile j (and Q) visible to all; every warp finished tile j - 1, so its stage is free
    {
      const int next = j + Smem::kStages - 1;  // goes into tile j - 1's stage
      const int st = stage == 0 ? Smem::kStages - 1 : stage - 1;
      if (next < num_tiles) load_kv_tile<D, BN>(sk0 + st * Smem::kKV, sv0 + st * Smem::kKV, gk, gv, next * BN, kv_end);
      cp_async_commit();
    }
    const uint32_t stage_off = uint32_t(stage * Smem::kKV * 2);
    stage = stage + 1 == Smem::kStages ? 0 : stage + 1;
    const int kb = j * BN;
    // (A warp whose rows all end before this tile could skip it; the branch cost the D=128, 64-key
    // variant a register spill and saves only part of the diagonal tiles, so every warp computes.)

    // S = Q K^T for the warp's 32 rows x BN keys.
    float s[2][kNT][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[mt][nt][e] = 0.0f;
    if constexpr (kQInRegs) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
        for (int np = 0; np < kNT / 2; ++np) {
          uint32_t bk[4];  // b0, b1 of key tiles 2np and 2np + 1
          ldsm_x4(bk, k_pat[kk & 3] + stage_off + (kk >> 2) * 128 + np * 16 * D * 2);
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) {
            mma_bf16_16816(s[mt][2 * np], qreg[mt][kk], bk[0], bk[1]);
            mma_bf16_16816(s[mt][2 * np + 1], qreg[mt][kk], bk[2], bk[3]);
          }
        }
    } else {
      // Groups of four k16 steps (one 128-byte swizzle span); not unrolled across groups, which keeps the
      // compiler from hoisting every fragment load of the tile (D=128 spilled otherwise).
#pragma unroll 1
      for (uint32_t span = 0; span < uint32_t(D / 64) * 128; span += 128) {
#pragma unroll
        for (int b = 0; b < 4; ++b) {
          uint32_t a[2][4];
#pragma unroll
          for (int mt = 0; mt < 2; ++mt) ldsm_x4(a[mt], q_pat[b] + span + mt * 16 * D * 2);
#pragma unroll
          for (int np = 0; np < kNT / 2; ++np) {
            uint32_t bk[4];  // b0, b1 of key tiles 2np and 2np + 1
            ldsm_x4(bk, k_pat[b] + stage_off + span + np * 16 * D * 2);
#pragma unroll
            for (int mt = 0; mt < 2; ++mt) {
              mma_bf16_16816(s[mt][2 * np], a[mt], bk[0], bk[1]);
              mma_bf16_16816(s[mt][2 * np + 1], a[mt], bk[2], bk[3]);
            }
          }
        }
      }
    }

    if (j >= first_masked) {
      // Causal limit of this thread's rows wrow + mt * 16 + hf * 8 + quad (prefill_common.cuh).
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int hf = 0; hf < 2; ++hf) {
          const int lim = causal_limit(p, r0 + wrow + mt * 16 + hf * 8 + quad, kb, tig);
#pragma unroll
          for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
            for (int e = 0; e < 2; ++e)
              if (nt * 8 + e > lim) s[mt][nt][hf * 2 + e] = -INFINITY;
        }
    }

    // Online softmax: new running max, probabilities in place of the logits, and the accumulators
    // rescaled only when some row of the warp raised its max (after the first tiles of a long row this
    // is rare, and it saves 2 * D multiplies per thread and tile).
    float alpha[2][2];
    bool raised = false;
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int hf = 0; hf < 2; ++hf)
        alpha[mt][hf] = online_softmax_row<kNT>([&](int i, int e) -> float& { return s[mt][i][hf * 2 + e]; },
                                                p.scale_log2, row_max[mt][hf], row_sum[mt][hf], raised);

    if (__any_sync(0xffffffffu, raised)) {
#pragma unroll
      for (int mt = 0; mt < 2; ++mt)
#pragma unroll
        for (int dt = 0; dt < kDT; ++dt)
#pragma unroll
          for (int e = 0; e < 4; ++e) o[mt][dt][e] *= alpha[mt][e >> 1];
    }

    // P in bf16, packed at once (half the registers of the f32 logits): the accumulators of key tiles
    // 2kk, 2kk + 1 are the A fragment of k16 step kk of O += P V.
    uint32_t pa[2][BN / 16][4];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk) {
        pa[mt][kk][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
        pa[mt][kk][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
        pa[mt][kk][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
        pa[mt][kk][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
      }
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t bv[4];  // b0, b1 of output tiles 2dp and 2dp + 1
        ldsm_x4_trans(bv, v_pat[dp & 3] + stage_off + (dp >> 2) * 128 + kk * 16 * D * 2);
#pragma unroll
        for (int mt = 0; mt < 2; ++mt) {
          mma_bf16_16816(o[mt][2 * dp], pa[mt][kk], bv[0], bv[1]);
          mma_bf16_16816(o[mt][2 * dp + 1], pa[mt][kk], bv[2], bv[3]);
        }
      }
    }
  }
  cp_async_wait<0>();  // nothing may stay in flight at exit (the last commit is empty, but be explicit)

  // Normalise and write the valid rows; a split launch writes its unnormalised part and the row's (max, sum)
  // instead, which prefill_merge_splits combines.
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int hf = 0; hf < 2; ++hf) {
      const PrefillRowOut ro =
          prefill_row_out<D>(p, cta, r0 + wrow + mt * 16 + hf * 8 + quad, row_max[mt][hf], row_sum[mt][hf], tig);
      if (!ro.written()) continue;
#pragma unroll
      for (int dt = 0; dt < kDT; ++dt) ro.store(dt * 8, o[mt][dt][hf * 2], o[mt][dt][hf * 2 + 1]);
    }
}

// out[row] = sum_s o_s 2^(m_s - M) / sum_s l_s 2^(m_s - M), M = max_s m_s (log2 units), over the key splits of
// row (t, qh); a split that saw no visible key has m = -inf and l = 0 and adds nothing. One CTA of D / 4 threads
// per row, a float4 each.
template <int D>
__global__ void prefill_merge_splits(const PrefillParams p) {
  const int64_t row = blockIdx.x, rows = int64_t(p.n) * p.num_heads_q;
  float m = -INFINITY;
  for (int s = 0; s < p.splits; ++s) m = fmaxf(m, p.part_ml[(s * rows + row) * 2]);
  const float base = m == -INFINITY ? 0.0f : m;
  float l = 0.0f;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int s = 0; s < p.splits; ++s) {
    const float2 ml = *reinterpret_cast<const float2*>(p.part_ml + (s * rows + row) * 2);
    const float w = exp2f(ml.x - base);
    l += ml.y * w;
    const float4 o = reinterpret_cast<const float4*>(p.part_o + (s * rows + row) * D)[threadIdx.x];
    acc.x += o.x * w;
    acc.y += o.y * w;
    acc.z += o.z * w;
    acc.w += o.w * w;
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  if (p.out_bf16 != nullptr)
    reinterpret_cast<uint2*>(p.out_bf16 + row * D)[threadIdx.x] =
        make_uint2(pack_bf16(acc.x * inv, acc.y * inv), pack_bf16(acc.z * inv, acc.w * inv));
  else
    reinterpret_cast<float4*>(p.out + row * D)[threadIdx.x] =
        make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
}

template <int D, int BN>
cudaError_t launch_prefill(const PrefillParams& p, cudaStream_t s) {
  constexpr size_t bytes = PrefillSmem<D, BN>::kBytes;
  static bool attr_set = false;  // once per instantiation (host side; callers are single-threaded per object)
  if (!attr_set) {
    cudaError_t e =
        cudaFuncSetAttribute(prefill_kernel<D, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (e != cudaSuccess) return e;
    // All of the unified L1/shared memory as shared memory: two CTAs of up to 96 KiB per multiprocessor.
    e = cudaFuncSetAttribute(prefill_kernel<D, BN>, cudaFuncAttributePreferredSharedMemoryCarveout,
                             cudaSharedmemCarveoutMaxShared);
    if (e != cudaSuccess) return e;
    attr_set = true;
  }
  const int64_t ctas = prefill_ctas(p);
  if (ctas <= 0) return cudaSuccess;
  prefill_kernel<D, BN><<<static_cast<unsigned>(ctas), kThreads, bytes, s>>>(p);
  return cudaGetLastError();
}

template <int D>
cudaError_t merge_splits(const PrefillParams& p, cudaStream_t s) {
  prefill_merge_splits<D><<<static_cast<unsigned>(int64_t(p.n) * p.num_heads_q), D / 4, 0, s>>>(p);
  return cudaGetLastError();
}

}  // namespace

namespace {
int64_t row_tiles(const PrefillParams& p) {
  const int tokens = prefill_tile_tokens(kBM, p.group);
  return (int64_t(p.n) + tokens - 1) / tokens;
}
}  // namespace

int64_t prefill_ctas(const PrefillParams& p) { return row_tiles(p) * p.num_heads_kv * p.splits; }

int prefill_splits(const PrefillParams& p, int sm_count) {
  const int64_t ctas = row_tiles(p) * p.num_heads_kv;
  const int64_t tiles = (int64_t(p.pos0) + p.n + kPrefillKeys - 1) / kPrefillKeys;
  const int64_t target = 2 * int64_t(sm_count);  // two CTAs fit a multiprocessor
  if (ctas >= target) return 1;
  const int64_t by_ctas = (target + ctas - 1) / ctas, by_tiles = tiles / kPrefillMinSplitTiles;
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>({by_ctas, by_tiles, kPrefillMaxSplits})));
}

// 64-key tiles at both head dims: at D=128 they halve the Q fragment reloads and per-tile softmax work of
// 32-key tiles (ptxas: 255 registers, 4 bytes of spill stores; 32-key tiles measured 9% slower on the H200
// at 32K and 128K tokens).
cudaError_t prefill_attention(const PrefillParams& p, cudaStream_t s, bool hopper) {
  if (p.head_dim != 64 && p.head_dim != 128) return cudaErrorInvalidValue;
  cudaError_t e = hopper                ? prefill_attention_hopper(p, s)
                  : p.head_dim == 128   ? launch_prefill<128, kPrefillKeys>(p, s)
                                        : launch_prefill<64, kPrefillKeys>(p, s);
  if (e != cudaSuccess || p.splits == 1 || prefill_ctas(p) <= 0) return e;
  return p.head_dim == 128 ? merge_splits<128>(p, s) : merge_splits<64>(p, s);
}

bool prefill_hopper_supported() {
  int dev = 0, major = 0, minor = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess)
    return false;
  return major == 9 && minor == 0 && tensor_map_encoder() != nullptr;  // the kernel's K/V copies are tensor-map copies
}

}  // namespace retroinfer::cuda::detail
