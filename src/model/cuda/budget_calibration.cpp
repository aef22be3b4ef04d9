// Retrieval budgets by layer on the CUDA runner (docs/wave-index.md, "Retrieval budgets by layer"): the prefill
// keeps each layer's queries of the prompt's last tokens on the device; after the index builds, every GPU-tier
// retro layer measures the mass its clusters leave out at each retrieval multiple (RetroLayer::
// calibration_missed_mass) and the layers get the multiples of index::allocate_calibrated_layers, as the CPU
// runner's Session::index_prompt does.
#include <algorithm>

#include "index/layer_budgets.h"
#include "kernels/cuda_check.h"
#include "model/cuda/session_state.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda {

int64_t CudaSession::Impl::prompt_queries_kept() const {
  if (num_seqs != 1 || joint) return 0;
  return index::prompt_queries_to_keep(opt.attention);
}

void CudaSession::Impl::keep_prompt_queries(int l, int64_t rows, int64_t pos0) {
  const int64_t keep = prompt_queries_kept();
  if (keep == 0 || rows <= 0) return;
  const int L = num_layers();
  const size_t row_bytes = size_t(shape.num_heads_q) * shape.head_dim * 4;
  if (prompt_q.size() != size_t(L)) {
    prompt_q.clear();
    prompt_q_swap.clear();
    for (int i = 0; i < L; ++i) {
      prompt_q.emplace_back(size_t(keep) * row_bytes);
      prompt_q_swap.emplace_back(size_t(keep) * row_bytes);
    }
    prompt_q_rows.assign(L, 0);
    prompt_q_end.assign(L, -1);
  }
  auto st = static_cast<cudaStream_t>(stream);
  const auto* q = static_cast<const char*>(a.q.data());
  // The kept rows continue only when this chunk follows them.
  const int64_t before = prompt_q_end[l] == pos0 ? prompt_q_rows[l] : 0;
  const int64_t take = std::min(rows, keep), old = std::min(before, keep - take);
  char* dst = prompt_q_swap[l].as<char>();
  if (old > 0)
    RETROINFER_CUDA_CHECK(cudaMemcpyAsync(dst, prompt_q[l].as<char>() + (before - old) * row_bytes, old * row_bytes,
                                          cudaMemcpyDeviceToDevice, st));
  RETROINFER_CUDA_CHECK(cudaMemcpyAsync(dst + old * row_bytes, q + (rows - take) * row_bytes, take * row_bytes,
                                        cudaMemcpyDeviceToDevice, st));
  std::swap(prompt_q[l], prompt_q_swap[l]);
  prompt_q_rows[l] = old + take;
  prompt_q_end[l] = pos0 + rows;
}

void CudaSession::Impl::copy_prompt_queries(const Impl& parent) {
  prompt_q.clear();
  prompt_q_swap.clear();
  prompt_q_rows = parent.prompt_q_rows;
  prompt_q_end = parent.prompt_q_end;
  auto st = static_cast<cudaStream_t>(stream);
  for (size_t l = 0; l < parent.prompt_q.size(); ++l) {
    const DeviceBuffer& src = parent.prompt_q[l];
    prompt_q.emplace_back(src.bytes());
    prompt_q_swap.emplace_back(src.bytes());
    RETROINFER_CUDA_CHECK(cudaMemcpyAsync(prompt_q.back().data(), src.data(), src.bytes(), cudaMemcpyDeviceToDevice, st));
  }
}

void CudaSession::Impl::calibrate_layer_budgets() {
  layer_multipliers.clear();
  const int64_t want = opt.attention.layer_budget_queries;
  const int L = num_layers();
  if (want <= 0 || opt.attention.kind != AttentionKind::kRetro || num_seqs != 1 || attn_per_seq ||
      prompt_q.size() != size_t(L) || attn.size() != size_t(L))
    return;
  synchronize(stream);
  const int64_t row = int64_t{shape.num_heads_q} * shape.head_dim;
  std::vector<std::vector<double>> missed(L);
  for (int l = 0; l < L; ++l) {
    // The kept queries must be those of the cache's last tokens (not so after a loaded prefix's shorter prefill
    // of fewer rows, or a fill without prefill: then fewer or none).
    if (prompt_q_end[l] != pos[0] || prompt_q_rows[l] == 0) continue;
    const int64_t rows = std::min(want, prompt_q_rows[l]);
    const float* q = prompt_q[l].as<float>() + (prompt_q_rows[l] - rows) * row;
    missed[l] = attn[l]->calibration_missed_mass(q, rows, stream);  // empty: host tier or no index
  }
  layer_multipliers = index::allocate_calibrated_layers(missed);
  for (size_t l = 0; l < layer_multipliers.size(); ++l) attn[l]->set_retrieval_multiplier(layer_multipliers[l], stream);
}

const std::vector<double>& CudaSession::layer_budget_multipliers() const { return impl_->layer_multipliers; }

}  // namespace retroinfer::cuda
