// The fused CPU prefill attention's tile (model::fused_prefill_attention): one thread's share of one KV head,
// computed by prefill_attention_avx2.cpp or prefill_attention_avx512.cpp (the body: prefill_attention_x86.h).
// Internal to src/model.
#pragma once

#include <cstdint>

namespace retroinfer::model {

inline constexpr int kFusedMaxStripRows = 12;  // query rows of one register block (6 on AVX2, 12 on AVX-512)
inline constexpr int kFusedKeyPanel = 16;      // keys of one register block (two AVX2 vectors)
inline constexpr int64_t kFusedKeyBlock = 512; // keys per online-softmax step (a multiple of kFusedKeyPanel)
inline constexpr int64_t kFusedTileRows = 48;  // packed rows a thread takes at a time (a multiple of the strip)
inline constexpr int kFusedMaxHeadDim = 256;     // the packing's row buffer

// Packed rows [r0, r0 + rows) of one KV head: row r is query position pos0 + r / group of group member r % group.
struct FusedAttentionTile {
  const float* q = nullptr;  // member 0 of position 0: row r's query at q + (r / group) * q_stride + (r % group) * d
  float* out = nullptr;      // the same layout as q
  int64_t q_stride = 0;      // floats from one position to the next (num_heads_q * d)
  const float* kp = nullptr; // the head's keys in panels: kp[(p * d + c) * 16 + j] = K[16 p + j][c], zero past T
  const float* vp = nullptr; // the head's values in panels of 16 dims: vp[(c / 16) * v_panel_stride + t * 16 + c % 16]
  int64_t v_panel_stride = 0;  // T * 16
  int d = 0, group = 1;      // head_dim (a multiple of 16), query heads per KV head
  int64_t pos0 = 0, r0 = 0, rows = 0;
  float scale = 1.0f;
  // Scratch of the calling thread: s [kFusedMaxStripRows * kFusedKeyBlock], o [kFusedTileRows * d],
  // m and l [kFusedTileRows].
  float *s = nullptr, *o = nullptr, *m = nullptr, *l = nullptr;
};

// Need AVX2 and FMA (core::cpu_has_avx2_fma), and AVX-512 for the second (core::cpu_has_avx512).
void fused_attention_tile_avx2(const FusedAttentionTile& tile);
void fused_attention_tile_avx512(const FusedAttentionTile& tile);

}  // namespace retroinfer::model
