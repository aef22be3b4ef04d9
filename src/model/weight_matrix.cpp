// WeightMatrix (weight_matrix.h): row parts in their stored types, widened rows on demand.
#include "model/weight_matrix.h"

#include <algorithm>
#include <cstring>

#include "model/quant_dot.h"
#include "retroinfer/error.h"

namespace retroinfer::model {

WeightMatrix::Part& WeightMatrix::part_for(WeightType type, size_t row_bytes) {
  if (parts_.empty() || parts_.back().type != type) {
    Part p;
    p.type = type;
    p.row0 = rows_;
    p.row_bytes = row_bytes;
    parts_.push_back(std::move(p));
  }
  return parts_.back();
}

void WeightMatrix::append(const ModelFile& f, const TensorInfo& t, bool keep_blocks) {
  const int64_t n = t.numel();
  RETROINFER_CHECK(cols_ > 0 && n % cols_ == 0, "model ", f.path(), ": tensor '", t.name, "' has ", n,
                   " elements, not a whole number of rows of ", cols_);
  const int64_t rows = n / cols_;
  // Blocks are kept only when a row is whole blocks and a kernel multiplies them.
  const bool keep = keep_blocks && has_quant_kernel(t.type) && cols_ % weight_type_block_elems(t.type) == 0;
  if (!keep) {
    const std::vector<float> v = f.to_f32(t);
    f.release_pages(t);
    append_f32(v.data(), rows);
    return;
  }
  RETROINFER_CHECK(weight_type_row_bytes(t.type, cols_) * static_cast<size_t>(rows) == t.nbytes, "model ", f.path(),
                   ": tensor '", t.name, "' holds ", t.nbytes, " bytes, inconsistent with its shape and type ",
                   weight_type_name(t.type));
  f.check_files_unchanged();
  append_blocks(t.type, t.data, rows);
  f.release_pages(t);  // the copy is what the runner reads: the mapped pages need not stay resident
}

void WeightMatrix::pack_row_groups() {
  for (Part& p : parts_) {
    if (p.grouped || !has_group_layout(p.type)) continue;
    std::vector<uint8_t> groups(model::row_groups_bytes(p.type, p.rows, cols_));
    model::pack_row_groups(p.type, p.data.data(), p.rows, cols_, groups.data());
    p.data = std::move(groups);
    p.grouped = true;
  }
}

void WeightMatrix::append_blocks(WeightType t, const uint8_t* data, int64_t rows) {
  RETROINFER_CHECK(has_quant_kernel(t) && cols_ % weight_type_block_elems(t) == 0, "WeightMatrix: rows of ", cols_,
                   " elements of type ", weight_type_name(t), " cannot be kept as blocks");
  const size_t row_bytes = weight_type_row_bytes(t, cols_);
  Part& p = part_for(t, row_bytes);
  RETROINFER_CHECK(!p.grouped, "WeightMatrix: append after pack_row_groups");
  p.data.insert(p.data.end(), data, data + row_bytes * static_cast<size_t>(rows));
  p.rows += rows;
  rows_ += rows;
}

void WeightMatrix::append_f32(const float* x, int64_t rows) {
  Part& p = part_for(WeightType::kF32, static_cast<size_t>(cols_) * 4);
  const auto* bytes = reinterpret_cast<const uint8_t*>(x);
  p.data.insert(p.data.end(), bytes, bytes + static_cast<size_t>(rows * cols_) * 4);
  p.rows += rows;
  rows_ += rows;
}

bool WeightMatrix::all_f32() const {
  for (const Part& p : parts_)
    if (p.type != WeightType::kF32) return false;
  return true;
}

int64_t WeightMatrix::bytes() const {
  int64_t n = 0;
  for (const Part& p : parts_) n += static_cast<int64_t>(p.data.size());
  return n;
}

void WeightMatrix::widen_rows(int64_t row0, int64_t count, float* dst) const {
  RETROINFER_CHECK(row0 >= 0 && count >= 0 && row0 + count <= rows_, "WeightMatrix::widen_rows: rows [", row0, ", ",
                   row0 + count, ") outside [0, ", rows_, ")");
  for (const Part& p : parts_) {
    const int64_t lo = std::max(row0, p.row0), hi = std::min(row0 + count, p.row0 + p.rows);
    if (lo >= hi) continue;
    if (!p.grouped) {
      dequantize(p.type, p.row(lo), (hi - lo) * cols_, dst + (lo - row0) * cols_);
      continue;
    }
    thread_local std::vector<uint8_t> file_row;  // one row as the file stores it
    file_row.resize(p.row_bytes);
    for (int64_t r = lo; r < hi; ++r) {
      model::unpack_group_row(p.type, p.data.data(), r - p.row0, cols_, file_row.data());
      dequantize(p.type, file_row.data(), cols_, dst + (r - row0) * cols_);
    }
  }
}

std::vector<float> WeightMatrix::to_f32() const {
  std::vector<float> out(static_cast<size_t>(rows_ * cols_));
  widen_rows(0, rows_, out.data());
  return out;
}

}  // namespace retroinfer::model
