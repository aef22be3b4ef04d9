// Dot products of quantized weight rows (ggml blocks as stored in a GGUF file) with activations quantized to
// 8 bits, the CPU decode's products (src/model/linear.cpp). One portable scalar kernel per weight type is the
// reference; AVX2 and AVX-512 VNNI kernels (quant_dot_avx2.cpp, quant_dot_avx512.cpp, compiled with their own
// target flags) are chosen once at run time from what the processor supports.
//
// Activations: blocks of 32 floats, each stored as int8 q[32] with one f32 scale d = max|x| / 127, so that
// x ~= d * q (|x - d q| <= d / 2, q rounded to the nearest, ties to even), plus the block's integer sum of q
// (the min terms of Q4_1 / Q5_1 / K-quants need sum(x) of the block). The integer part of every block product is exact; only the per-block f32
// scaling and the f32 sum over blocks round.
#pragma once

#include <cstdint>
#include <vector>

#include "retroinfer/model_file.h"

namespace retroinfer::model {

inline constexpr int kQ8Block = 32;  // activation elements per scale

// One or more rows of activations in 8 bits. Row r: q [r * cols .. (r + 1) * cols), d and sum
// [r * blocks .. (r + 1) * blocks), blocks = cols / 32.
struct Q8Rows {
  int64_t rows = 0, cols = 0;
  std::vector<int8_t> q;     // [rows, cols]
  std::vector<float> d;      // [rows, cols / 32]: the block scales
  std::vector<int32_t> sum;  // [rows, cols / 32]: sum of the block's q
  std::vector<float> ds;     // [rows, cols / 32]: d * sum, the block's sum of x as quantized (min terms)
  int64_t blocks() const { return cols / kQ8Block; }
};

// x [rows, cols] (cols a multiple of 32) -> out. q = round-to-nearest-even(x / d), d = max|x| / 127 (0 for an
// all-zero block, whose q are all 0). Deterministic: a row quantizes the same whatever the other rows.
void quantize_q8_rows(const float* x, int64_t rows, int64_t cols, Q8Rows& out);

// One activation row in the form the kernels read.
struct Q8Row {
  const int8_t* q = nullptr;      // [blocks * 32]
  const float* d = nullptr;       // [blocks]
  const int32_t* sum = nullptr;   // [blocks]
  const float* ds = nullptr;      // [blocks]
};
inline Q8Row q8_row(const Q8Rows& a, int64_t r) {
  const int64_t nb = a.blocks();
  return {a.q.data() + r * a.cols, a.d.data() + r * nb, a.sum.data() + r * nb, a.ds.data() + r * nb};
}

// w: `rows` weight rows of `blocks32 * 32` elements in their stored type, row_bytes apart (for the K-quants
// blocks32 is a multiple of 8). out[r] = sum_i w[r]_i * (d q)_i, each row summed alone (a row's result does not
// depend on `rows`): several rows per call keep the per-row call overhead out of the decode products.
using RowDot = void (*)(const uint8_t* w, size_t row_bytes, int64_t rows, Q8Row a, int64_t blocks32, float* out);

enum class QuantIsa : uint8_t { kScalar, kAvx2, kAvx512Vnni };
const char* quant_isa_name(QuantIsa isa);
// The best instruction set this processor supports among those compiled in (decided once per process).
QuantIsa best_quant_isa();
// True when weights of type t are multiplied through the kernels above (the ggml block types); false for the
// float types (kept as f32 and multiplied by the f32 paths).
bool has_quant_kernel(WeightType t);
// The kernel for weight type t on isa; an ISA without a kernel of its own for t falls back to the next lower
// one (down to the scalar reference). Throws Error for a type without a kernel.
RowDot row_dot_kernel(WeightType t, QuantIsa isa);

// The scalar reference kernels, per type (the tests compare the SIMD kernels against these).
RowDot scalar_row_dot(WeightType t);
// The SIMD tables: nullptr where the ISA has no kernel of its own for t (quant_dot_avx2.cpp / _avx512.cpp).
RowDot avx2_row_dot(WeightType t);
RowDot avx512_row_dot(WeightType t);

// ---- Row groups: the decode layout of the 32-element block types -------------------------------------------
// A decode product reads each weight once per token, so its kernel must spend few instructions per weight.
// Row by row, a block of 32 weights costs a dot of 32 bytes, a scalar f16 scale and a horizontal sum at the
// row's end. In row groups, kGroupRows rows are interleaved block by block: the 16 rows' scales of block b lie
// side by side (one vector load and conversion), and their quantized bytes in 4-byte runs, so that one integer
// dot instruction multiplies 4 weights of each of 8 (AVX2) rows by the same 4 broadcast activation bytes and
// leaves each row's sum in its own lane: no horizontal sums, no per-row scale loads, ~3x fewer instructions.
//
// Group block (block b of rows 16 g .. 16 g + 15; groups stored one after another, each as its blocks in order):
//   d[16] f16 at 0; m[16] f16 next for the types with a min (Q4_1, Q5_1); for the 5-bit types 8 u64 masks next,
//   mask k holding bit 4 r + j = the fifth bit of row r's element e(k, j), e = 4 k + j for k < 4 and
//   16 + 4 (k - 4) + j after; then the quantized bytes as 64-byte vectors, vector c holding bytes 4 c .. 4 c + 3
//   of row r's block bytes at 4 r (Q4/Q5: the packed nibble bytes, whose low nibbles are elements 4 c + j and high
//   nibbles 16 + 4 c + j; Q8_0: the signed bytes, 8 vectors). A group block is 16 x the type's block bytes; rows
//   past the matrix's end are zero blocks (d = m = 0: their results are 0, and unused).
inline constexpr int kGroupRows = 16;

// Where a block's fields lie in the file's block (src) and in a group block (dst: d at 0); -1: absent. The one
// description of the layout: the packing (quant_dot.cpp) and the SIMD kernels (quant_dot_x86.h) read it.
struct GroupLayout {
  int block_bytes = 0;  // of the file's block (0: the type has no row-group layout)
  int d_src = 0, m_src = -1, qh_src = -1, qs_src = 0, qs_bytes = 0;
  int m_dst = -1, qh_dst = -1, qs_dst = 0;
  int code_offset = 0;  // Q4_0: 8, Q5_0: 16 (value = code - offset); 0: codes with a min, or Q8_0's signed bytes
};
constexpr GroupLayout group_layout(WeightType t) {
  switch (t) {
    case WeightType::kQ8_0: return {34, 0, -1, -1, 2, 32, -1, -1, 32, 0};
    case WeightType::kQ4_0: return {18, 0, -1, -1, 2, 16, -1, -1, 32, 8};
    case WeightType::kQ4_1: return {20, 0, 2, -1, 4, 16, 32, -1, 64, 0};
    case WeightType::kQ5_0: return {22, 0, -1, 2, 6, 16, -1, 32, 96, 16};
    case WeightType::kQ5_1: return {24, 0, 2, 4, 8, 16, 32, 64, 128, 0};
    default: return {};
  }
}
// True for the types with a row-group layout (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1).
bool has_group_layout(WeightType t);
// Bytes of `rows` rows of `cols` elements in row groups (rows rounded up to whole groups).
size_t row_groups_bytes(WeightType t, int64_t rows, int64_t cols);
// rows x cols elements stored row by row (the file's blocks) -> out[row_groups_bytes(t, rows, cols)].
void pack_row_groups(WeightType t, const uint8_t* rows_data, int64_t rows, int64_t cols, uint8_t* out);
// Row r of a row-group copy back as the file stored it: dst[weight_type_row_bytes(t, cols)].
void unpack_group_row(WeightType t, const uint8_t* groups, int64_t r, int64_t cols, uint8_t* dst);

// w: `groups` row groups of blocks32 blocks each; out[16 g + r] = the dot of row r of group g with a, as the
// row-by-row kernel of the same ISA computes it up to the f32 rounding order of the per-block terms (the scalar
// group kernel equals the scalar row kernel bit for bit). A row's result does not depend on `groups`.
using GroupDot = void (*)(const uint8_t* w, int64_t groups, Q8Row a, int64_t blocks32, float* out);
// The group kernel for type t on isa (falling back as row_dot_kernel does); throws for a type without a layout.
GroupDot group_dot_kernel(WeightType t, QuantIsa isa);
GroupDot scalar_group_dot(WeightType t);
GroupDot avx2_group_dot(WeightType t);
GroupDot avx512_group_dot(WeightType t);

}  // namespace retroinfer::model
