// A weight matrix of the CPU runner: [rows, cols], row-major, in the types it was stored in. Rows come in
// parts of one type each (a fused matrix such as QKV may join tensors of different types: Q5_0 q/k rows with
// Q8_0 v rows). The ggml block types stay as their blocks (the file's bytes, copied), so memory and the bytes a
// decode step reads match the file; float types are widened to f32. Decode's block types are then laid out in
// row groups (pack_row_groups). linear.h multiplies by it.
#pragma once

#include <cstdint>
#include <vector>

#include "model/quant_dot.h"
#include "retroinfer/model_file.h"

namespace retroinfer::model {

// Threading contract: built once at load (append), then read-only; any number of threads may read.
class WeightMatrix {
 public:
  struct Part {
    WeightType type = WeightType::kF32;  // kF32 or a ggml block type
    int64_t row0 = 0, rows = 0;          // the matrix rows [row0, row0 + rows) this part holds
    size_t row_bytes = 0;                // bytes of one row in `type`
    std::vector<uint8_t> data;           // [rows, row_bytes]; f32 rows as floats; or the row groups
    bool grouped = false;                // data holds row groups (quant_dot.h), rows rounded up to whole groups
    // Row r as stored in the file (not for grouped parts: unpack_group_row rebuilds their rows).
    const uint8_t* row(int64_t r) const { return data.data() + static_cast<size_t>(r - row0) * row_bytes; }
    // Group g of a grouped part (rows row0 + 16 g ..).
    const uint8_t* group(int64_t g) const { return data.data() + static_cast<size_t>(g) * kGroupRows * row_bytes; }
    const float* f32_row(int64_t r) const { return reinterpret_cast<const float*>(row(r)); }
  };

  WeightMatrix() = default;
  explicit WeightMatrix(int64_t cols) : cols_(cols) {}

  // Appends the rows of t ([rows, cols] or, for a vector, [cols] as one row). keep_blocks: keep a ggml block
  // type as stored (else widened to f32, bit for bit what ModelFile::to_f32 gives); float types are always
  // widened.
  void append(const ModelFile& f, const TensorInfo& t, bool keep_blocks);
  void append_f32(const float* x, int64_t rows);
  // Appends rows of a ggml block type (has_quant_kernel(t), cols a multiple of its block) as they are.
  void append_blocks(WeightType t, const uint8_t* data, int64_t rows);
  // Lays out every part of a type with a row-group layout in row groups (decode's layout; quant_dot.h), after
  // the last append. The bytes stay those of the file's blocks (up to the zero rows of a last partial group).
  void pack_row_groups();

  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  const std::vector<Part>& parts() const { return parts_; }
  bool empty() const { return rows_ == 0; }
  bool all_f32() const;
  int64_t bytes() const;
  // dst [count, cols] = rows [row0, row0 + count) in f32.
  void widen_rows(int64_t row0, int64_t count, float* dst) const;
  std::vector<float> to_f32() const;

 private:
  Part& part_for(WeightType type, size_t row_bytes);
  int64_t rows_ = 0, cols_ = 0;
  std::vector<Part> parts_;
};

}  // namespace retroinfer::model
