#include "model/prefill_attention.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/simd.h"
#include "core/vec_math.h"
#include "model/linear.h"
#include "model/prefill_attention_tiles.h"
#include "retroinfer/error.h"

namespace retroinfer::model {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One row's step of the online softmax over a key block: s [kb] scores of which the first `valid` are visible
// -> their weights e^(score - m') (0 past valid), m' the row's new running maximum; the running sum l and the
// output row o [d] rescaled to m', the weights' sum added. Maximum and sum by core::max_lanes / sum_lanes and
// the exponential by core::exp_nonpositive, so that the loops vectorise without -ffast-math (libm's expf is ~2 ns
// a call; at 32K tokens a prompt's prefill takes ~10^11 of them); compiled per instruction set.
RETROINFER_TARGET_CLONES
void softmax_block_row(float* s, int64_t valid, int64_t kb, float& m, float& l, float* o, int d) {
  const float mx = core::max_lanes(s, valid, m);
  if (valid == 0 || mx == kNegInf) {
    std::fill(s, s + kb, 0.0f);
    return;
  }
  const float a = m == kNegInf ? 0.0f : core::exp_nonpositive(m - mx);  // rescale the earlier blocks
  for (int c = 0; c < d; ++c) o[c] *= a;
  for (int64_t j = 0; j < valid; ++j) s[j] = core::exp_nonpositive(s[j] - mx);
  const float sum = core::sum_lanes(s, valid);
  std::fill(s + valid, s + kb, 0.0f);
  l = l * a + sum;
  m = mx;
}

// Both kernels' argument checks: the shape, the cache's heads against it, and positions within the cache.
void check_prefill_arguments(const KvCache& kv, const AttentionShape& shape, int64_t pos0, int64_t n) {
  validate(shape);
  RETROINFER_CHECK(kv.num_heads_kv() == shape.num_heads_kv && kv.head_dim() == shape.head_dim,
                   "prefill attention: KV cache shape does not match the attention shape");
  RETROINFER_CHECK(pos0 >= 0 && n >= 1 && pos0 + n <= kv.size(), "prefill attention: positions [", pos0, ", ",
                   pos0 + n, ") exceed the ", kv.size(), " cached tokens");
}

}  // namespace

void blas_prefill_attention(const KvCache& kv, const AttentionShape& shape, float scale, int64_t pos0, int64_t n,
                            const float* q, float* out, PrefillAttentionScratch& sc) {
  check_prefill_arguments(kv, shape, pos0, n);
  const int d = shape.head_dim, hq = shape.num_heads_q, group = hq / shape.num_heads_kv;
  const float sm = scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t T = pos0 + n;  // keys visible to the last query
  const int64_t rows = group * n;
  // Row tiles: query head g's positions [i0, i0 + kRowTile) of the chunk; each is one thread's work at a time.
  const int64_t tiles_per_head = (n + kRowTile - 1) / kRowTile, tiles = group * tiles_per_head;
  // Tiles on the OpenMP threads only where each tile's BLAS calls then stay on its thread.
  const int workers = blas_serial_in_parallel_regions()
                          ? std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>(tiles)))
                          : 1;
  sc.q.resize(rows * d);
  sc.o.resize(rows * d);
  sc.m.resize(rows);
  sc.l.resize(rows);
  const int64_t tile_rows = std::min(kRowTile, n), key_block = std::min(T, kKeyBlock);
  sc.s.resize(workers * tile_rows * key_block);

  for (int h = 0; h < shape.num_heads_kv; ++h) {
    // Keys and values of head h as contiguous [T, d] f32 rows.
    const float* K;
    const float* V;
    if (kv.dtype() == DType::kF32) {
      K = static_cast<const float*>(kv.key_row(h, 0));
      V = static_cast<const float*>(kv.value_row(h, 0));
    } else {
      sc.k.resize(T * d);
      sc.v.resize(T * d);
#pragma omp parallel for schedule(static) if (T * d >= (1 << 16))
      for (int64_t t = 0; t < T; ++t) {
        kv.load_key(h, t, &sc.k[t * d]);
        kv.load_value(h, t, &sc.v[t * d]);
      }
      K = sc.k.data();
      V = sc.v.data();
    }
    // Row r = g * n + i holds query head h * group + g at position pos0 + i.
    for (int g = 0; g < group; ++g)
      for (int64_t i = 0; i < n; ++i)
        std::copy_n(q + (i * hq + h * group + g) * d, d, &sc.q[(g * n + i) * d]);
    // The tiles run in parallel, each calling BLAS on its own: a tile's scores (kRowTile x kKeyBlock floats)
    // stay in the core's L2 between the two products and the softmax, where one call over all the group's rows
    // sent ~15 MB of scores through memory three times per key block. Later positions see more keys: dynamic
    // scheduling.
#pragma omp parallel for schedule(dynamic, 1) num_threads(workers) if (workers > 1)
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const int64_t g = tile / tiles_per_head, i0 = (tile % tiles_per_head) * kRowTile;
      const int64_t tr = std::min(kRowTile, n - i0), r0 = g * n + i0;
      const int worker = workers > 1 ? omp_get_thread_num() : 0;
      float* s = &sc.s[worker * tile_rows * key_block];
      float* o = &sc.o[r0 * d];
      float* m = &sc.m[r0];
      float* l = &sc.l[r0];
      std::fill(o, o + tr * d, 0.0f);
      std::fill(m, m + tr, kNegInf);
      std::fill(l, l + tr, 0.0f);
      const int64_t visible = pos0 + i0 + tr;  // keys the tile's last row sees; later blocks are masked whole
      for (int64_t k0 = 0; k0 < visible; k0 += kKeyBlock) {
        const int64_t kb = std::min(kKeyBlock, visible - k0);
        // S = scale * Q K[k0:k0+kb]^T: [tr, kb].
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(tr), static_cast<int>(kb), d, sm,
                    &sc.q[r0 * d], d, K + k0 * d, d, 0.0f, s, static_cast<int>(kb));
        for (int64_t r = 0; r < tr; ++r) {
          const int64_t valid = std::clamp<int64_t>(pos0 + i0 + r + 1 - k0, 0, kb);  // causal: keys <= pos0 + i
          softmax_block_row(&s[r * kb], valid, kb, m[r], l[r], &o[r * d], d);
        }
        // O += P V[k0:k0+kb]: [tr, d].
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(tr), d, static_cast<int>(kb), 1.0f,
                    s, static_cast<int>(kb), V + k0 * d, d, 1.0f, o, d);
      }
      for (int64_t r = 0; r < tr; ++r) {
        const float inv = 1.0f / l[r];  // l >= 1: the row's own max contributes exp(0)
        float* dst = out + ((i0 + r) * hq + h * group + g) * d;
        for (int c = 0; c < d; ++c) dst[c] = o[r * d + c] * inv;
      }
    }
  }
}

bool fused_prefill_attention_supported(const AttentionShape& shape) {
#if RETROINFER_PREFILL_X86
  return core::cpu_has_avx2_fma() && shape.head_dim % kFusedKeyPanel == 0 && shape.head_dim <= kFusedMaxHeadDim;
#else
  (void)shape;
  return false;
#endif
}

void fused_prefill_attention(const KvCache& kv, const AttentionShape& shape, float scale, int64_t pos0, int64_t n,
                             const float* q, float* out, PrefillAttentionScratch& sc) {
  check_prefill_arguments(kv, shape, pos0, n);
  RETROINFER_CHECK(fused_prefill_attention_supported(shape), "fused prefill attention needs AVX2 and FMA and a "
                   "head_dim that is a multiple of 16 up to 256 (head_dim ", shape.head_dim, "); use "
                   "blas_prefill_attention");
#if RETROINFER_PREFILL_X86
  const int d = shape.head_dim, hq = shape.num_heads_q, group = hq / shape.num_heads_kv;
  const float sm = scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(d));
  const int64_t T = pos0 + n;  // keys visible to the last query
  const int64_t rows = group * n, tiles = (rows + kFusedTileRows - 1) / kFusedTileRows;
  const int workers = std::max(1, std::min<int>(omp_get_max_threads(), static_cast<int>(tiles)));
  const int64_t panels = (T + kFusedKeyPanel - 1) / kFusedKeyPanel;
  sc.k.resize(panels * kFusedKeyPanel * d);
  sc.s.resize(workers * kFusedMaxStripRows * kFusedKeyBlock);
  sc.o.resize(workers * kFusedTileRows * d);
  sc.m.resize(workers * kFusedTileRows);
  sc.l.resize(workers * kFusedTileRows);
  sc.v.resize(T * d);
  void (*const tile_kernel)(const FusedAttentionTile&) =
      core::cpu_has_avx512() ? fused_attention_tile_avx512 : fused_attention_tile_avx2;
  for (int h = 0; h < shape.num_heads_kv; ++h) {
    // Keys into panels of 16 keys (kp[(p * d + c) * 16 + j] = K[16 p + j][c], zero past T), values into panels
    // of 16 dims (vp[(c / 16) * T * 16 + t * 16 + c % 16] = V[t][c]): both kernels then stream 64 bytes a step.
    float* kp = sc.k.data();
    float* vp = sc.v.data();
#pragma omp parallel for schedule(static) if (T * d >= (1 << 16))  // every thread: a short chunk has few tiles
    for (int64_t p = 0; p < panels; ++p) {
      float row[kFusedMaxHeadDim];
      float* dst = kp + p * d * kFusedKeyPanel;
      for (int j = 0; j < kFusedKeyPanel; ++j) {
        const int64_t t = p * kFusedKeyPanel + j;
        if (t < T) {
          kv.load_key(h, t, row);
        } else {
          std::fill(row, row + d, 0.0f);
        }
        for (int c = 0; c < d; ++c) dst[c * kFusedKeyPanel + j] = row[c];
        if (t < T) {
          kv.load_value(h, t, row);
          for (int c0 = 0; c0 < d; c0 += kFusedKeyPanel)
            std::copy_n(row + c0, kFusedKeyPanel,
                        vp + (c0 / kFusedKeyPanel) * T * kFusedKeyPanel + t * kFusedKeyPanel);
        }
      }
    }
    // Later rows see more keys: the heaviest tiles first, dynamically scheduled.
#pragma omp parallel for schedule(dynamic, 1) num_threads(workers) if (workers > 1)
    for (int64_t i = 0; i < tiles; ++i) {
      const int w = workers > 1 ? omp_get_thread_num() : 0;
      FusedAttentionTile t;
      t.q = q + int64_t{h} * group * d;
      t.out = out + int64_t{h} * group * d;
      t.q_stride = int64_t{hq} * d;
      t.kp = kp;
      t.vp = vp;
      t.v_panel_stride = T * kFusedKeyPanel;
      t.d = d;
      t.group = group;
      t.pos0 = pos0;
      t.r0 = (tiles - 1 - i) * kFusedTileRows;
      t.rows = std::min(kFusedTileRows, rows - t.r0);
      t.scale = sm;
      t.s = &sc.s[w * kFusedMaxStripRows * kFusedKeyBlock];
      t.o = &sc.o[w * kFusedTileRows * d];
      t.m = &sc.m[w * kFusedTileRows];
      t.l = &sc.l[w * kFusedTileRows];
      tile_kernel(t);
    }
  }
#endif
}

void cpu_prefill_attention(const KvCache& kv, const AttentionShape& shape, float scale, int64_t pos0, int64_t n,
                           const float* q, float* out, PrefillAttentionScratch& scratch) {
  if (fused_prefill_attention_supported(shape)) {
    fused_prefill_attention(kv, shape, scale, pos0, n, q, out, scratch);
  } else {
    blas_prefill_attention(kv, shape, scale, pos0, n, q, out, scratch);
  }
}

}  // namespace retroinfer::model
