// Device pieces shared by the two prefill attention kernels (prefill_attention.cu: portable mma.sync;
// prefill_attention_hopper.cu: wgmma): which rows and key tiles a CTA owns, the bf16 staging of Q, the online
// softmax of one row's logits, and where a row's output goes. Layout and notation: prefill_kernels.h.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "kernels/common.cuh"
#include "kernels/prefill_kernels.h"

namespace retroinfer::cuda::detail {

// Tokens per row tile: a tile of `rows` packed rows holds whole tokens (rows / G of them, rows_used = that times
// G rows; the rows past rows_used are padding, never read from q nor written), so that the Hopper kernel loads a
// tile's Q with one tensor-map box per column block. G divides rows for every power-of-two group (no padding);
// G = 3, 6 or 7 leave 2 of 128 rows unused, G = 5 three. G <= kMaxGroup < rows.
__host__ __device__ __forceinline__ int prefill_tile_tokens(int rows, int group) { return rows / group; }

// CTA blockIdx.x of a launch with `rows` packed query rows per CTA and key tiles of `keys` tokens: heaviest CTAs
// (largest query positions) first, in bands of kPrefillBandTiles row tiles; inside a band the KV heads take
// turns (every row tile of the band for head 0, then for head 1, ...), and consecutive CTAs share a row tile's
// key splits in a split launch. So the CTAs running at once read the K/V of one or two heads, not of all: at
// 32K a head's K/V is 16 MB, eight heads' 128 MB would not stay in L2 once the CTAs of a head drift apart.
// `item` is the work item in that order: the portable kernel's blockIdx.x, the Hopper kernel's fetched index.
struct PrefillCta {
  int split = 0, h = 0;
  int r0 = 0;            // first packed row (of token t0 = r0 / G)
  int r_end = 0;         // rows [r0, r_end) are this tile's (whole tokens, < n); the rest up to r0 + rows: padding
  int kv_end = 0;        // keys [0, kv_end) are read
  int first_masked = 0;  // key tiles >= this cross some row's diagonal
  int j0 = 0, num_tiles = 0;  // this CTA's key tiles [j0, num_tiles): all of them, or its split's share
};
// 32-bit arithmetic throughout: PrefillAttention::run keeps n * G and the item count below 2^31.
__device__ __forceinline__ PrefillCta prefill_cta(const PrefillParams& p, int rows, int keys, int item) {
  PrefillCta c;
  const int G = p.group, T = prefill_tile_tokens(rows, G);
  const int m_tiles = (p.n + T - 1) / T;
  const int b = item / p.splits;
  c.split = item % p.splits;
  const int band = b / (kPrefillBandTiles * p.num_heads_kv);
  const int in_band = b - band * kPrefillBandTiles * p.num_heads_kv;
  const int band_tiles = min(kPrefillBandTiles, m_tiles - band * kPrefillBandTiles);  // the last: fewer
  c.h = in_band / band_tiles;
  const int tile = band * kPrefillBandTiles + in_band % band_tiles;  // 0: the heaviest
  const int t_lo = (m_tiles - 1 - tile) * T;
  const int t_hi = min(p.n - 1, t_lo + T - 1);
  c.r0 = t_lo * G;
  c.r_end = (t_hi + 1) * G;
  c.kv_end = p.pos0 + t_hi + 1;
  const int all_tiles = (c.kv_end + keys - 1) / keys;
  c.first_masked = (p.pos0 + t_lo + 1) / keys;
  const int per_split = (all_tiles + p.splits - 1) / p.splits;
  c.j0 = min(all_tiles, c.split * per_split);
  c.num_tiles = min(all_tiles, c.j0 + per_split);
  return c;
}

// 16-byte chunk ch (elements 8 ch .. 8 ch + 7) of packed row r (token r / G, query head h G + r % G) of the
// CTA's tile, rounded to bf16; zeros for its padding rows.
template <int D>
__device__ __forceinline__ uint4 q_chunk_bf16(const PrefillParams& p, const PrefillCta& c, int r, int ch) {
  if (r >= c.r_end) return make_uint4(0, 0, 0, 0);
  const int t = r / p.group, qh = c.h * p.group + (r - t * p.group);
  const float4* src = reinterpret_cast<const float4*>(p.q + (int64_t(t) * p.num_heads_q + qh) * D + ch * 8);
  const float4 a = __ldg(src), b = __ldg(src + 1);
  return make_uint4(pack_bf16(a.x, a.y), pack_bf16(a.z, a.w), pack_bf16(b.x, b.y), pack_bf16(b.z, b.w));
}

// Causal masking on a diagonal key tile starting at key kb: packed row r (token pos0 + r / G) sees keys up to
// its own position, so the thread holding key columns 2 tig, 2 tig + 1 of each 8-column block masks column
// 8 i + e when 8 i + e > causal_limit(...). Padding rows keep their nominal limit; they are never written.
__device__ __forceinline__ int causal_limit(const PrefillParams& p, int r, int kb, int tig) {
  return p.pos0 + r / p.group - kb - tig * 2;
}

__device__ __forceinline__ float approx_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));  // ex2(-inf) = +0
  return y;
}

// One online-softmax step of a row whose logits of this tile are spread over the 4 threads of a quad, kPairs
// pairs per thread (at(i, e): element e of pair i): the new running max (log2 units, scale folded in), the
// probabilities in place of the logits, the running sum rescaled and raised by this thread's part. Returns the
// factor the row's output accumulators must be scaled by (1 when the max did not move; `raised` is set when it
// did). A row with no visible key yet keeps max -inf and subtracts 0 instead (every exponent is then -inf -> 0).
// With slack > 0 (log2 units) the running max moves only when the tile's max passes it by more than slack: the
// exponentials then reach at most 2^slack, which f32 sums and bf16 probabilities hold at full relative precision,
// and the output accumulators are rescaled far less often (row_max is the base the exponentials subtract, which
// is all that normalisation and the split merge need).
template <int kPairs, class At>
__device__ __forceinline__ float online_softmax_row(At at, float scale_log2, float& row_max, float& row_sum,
                                                    bool& raised, float slack = 0.0f) {
  float mx = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPairs; ++i) mx = fmaxf(mx, fmaxf(at(i, 0), at(i, 1)));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float tile_max = mx * scale_log2;
  const bool up = tile_max > row_max + slack;
  const float new_max = up ? tile_max : row_max;
  const float base = new_max == -INFINITY ? 0.0f : new_max;
  const float alpha = up ? approx_exp2(row_max - base) : 1.0f;
  raised |= up;
  row_max = new_max;
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kPairs; ++i)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const float pr = approx_exp2(fmaf(at(i, e), scale_log2, -base));
      at(i, e) = pr;
      sum += pr;
    }
  row_sum = row_sum * alpha + sum;
  return alpha;
}

// Stores that happen only where `pred` holds, without a branch: the Hopper kernel writes an item's output while
// a wgmma product runs, and a divergent branch there makes ptxas serialise every wgmma of the kernel.
__device__ __forceinline__ void store_if(float* dst, float a, float b, bool pred) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %3, 0;\n@p st.global.v2.f32 [%0], {%1, %2};\n}\n" ::"l"(dst), "f"(a),
               "f"(b), "r"(int(pred))
               : "memory");
}
__device__ __forceinline__ void store_if(uint16_t* dst, uint32_t bf16x2, bool pred) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p st.global.b32 [%0], %1;\n}\n" ::"l"(dst), "r"(bf16x2),
               "r"(int(pred))
               : "memory");
}

// Where packed row r's output goes: this thread's columns start at dst (f32: out, or a split's part_o) or dst16
// (bf16, p.out_bf16; column 2 tig; each n8 block of columns 8 further), scaled by `scale`; nothing is stored for
// the tile's padding rows (written() false). row_sum is this thread's part of the row sum (the quad's parts are
// added here, so every lane must call). A split launch gets its unnormalised part (f32, scale 1), and lane tig 0
// writes the row's (max, sum) for prefill_merge_splits. No branch depends on the row (store_if).
struct PrefillRowOut {
  float* dst = nullptr;
  uint16_t* dst16 = nullptr;
  float scale = 1.0f;
  bool valid = false;
  __device__ __forceinline__ bool written() const { return valid; }
  // Columns `col`, col + 1 of this thread's part: a, b times scale.
  __device__ __forceinline__ void store(int col, float a, float b) const {
    if (dst16 != nullptr) store_if(dst16 + col, pack_bf16(a * scale, b * scale), valid);
    else store_if(dst + col, a * scale, b * scale, valid);
  }
};
template <int D>
__device__ __forceinline__ PrefillRowOut prefill_row_out(const PrefillParams& p, const PrefillCta& c, int r,
                                                         float row_max, float row_sum, int tig) {
  float l = row_sum;
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  PrefillRowOut o;
  o.valid = r < c.r_end;
  const int t = r / p.group;
  const int qh = c.h * p.group + (r - t * p.group);
  const int64_t row = int64_t(t) * p.num_heads_q + qh;
  if (p.splits > 1) {
    const int64_t prow = int64_t(c.split) * p.n * p.num_heads_q + row;
    o.dst = p.part_o + prow * D + tig * 2;
    store_if(p.part_ml + prow * 2, row_max, l, o.valid && tig == 0);
    return o;
  }
  if (p.out_bf16 != nullptr) o.dst16 = p.out_bf16 + row * D + tig * 2;
  else o.dst = p.out + row * D + tig * 2;
  o.scale = l > 0.0f ? 1.0f / l : 0.0f;
  return o;
}

}  // namespace retroinfer::cuda::detail
