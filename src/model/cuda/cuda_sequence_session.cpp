// CudaSequenceSession: the SequenceSession interface over a CudaSession of one sequence.
#include "retroinfer/cuda_model.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda {

CudaSequenceSession::CudaSequenceSession(const CudaModel& model, const CudaSessionOptions& opt)
    : session_(std::make_unique<CudaSession>(model, opt, 1)) {}

CudaSequenceSession::CudaSequenceSession(std::unique_ptr<CudaSession> session) : session_(std::move(session)) {
  RETROINFER_CHECK(session_ != nullptr, "CudaSequenceSession: null session");
  RETROINFER_CHECK(session_->num_seqs() == 1, "CudaSequenceSession: the session holds ", session_->num_seqs(),
                   " sequences; it must hold exactly one");
}

CudaSequenceSession::~CudaSequenceSession() = default;

std::vector<float> CudaSequenceSession::prefill(std::span<const int32_t> tokens, bool all_logits,
                                                const PrefillProgress& progress) {
  return session_->prefill({std::vector<int32_t>(tokens.begin(), tokens.end())}, all_logits, progress);
}

void CudaSequenceSession::decode(int32_t token, std::span<float> logits) {
  session_->decode(std::span<const int32_t>(&token, 1), logits);
  if (session_->memory_plan().host_layers > 0) {
    const CudaWaveCounts c = session_->last_wave_counts();
    // Each missed row is one K and one V row of head_dim bf16 values read over PCIe.
    step_pcie_bytes_ = c.step.miss_rows * 2 * int64_t{session_->model().config().head_dim} * 2;
    pcie_bytes_ += step_pcie_bytes_;
    ++pcie_steps_;
  }
}

std::optional<KvPlacementReport> CudaSequenceSession::kv_placement_report() {
  const CudaSessionPlan& p = session_->memory_plan();
  KvPlacementReport r;
  r.gpu_layers = p.gpu_layers;
  r.host_layers = p.host_layers;
  r.placement = p.host_layers == 0 ? KvPlacement::kGpu : p.gpu_layers == 0 ? KvPlacement::kHost : KvPlacement::kSplit;
  if (p.host_layers > 0) {
    const CudaWaveCounts c = session_->last_wave_counts();
    r.cache_hits = c.totals.hits;
    r.cache_misses = c.totals.misses;
    r.step_pcie_bytes = step_pcie_bytes_;
    r.pcie_bytes = pcie_bytes_;
    r.decode_steps = pcie_steps_;
  }
  return r;
}

std::unique_ptr<SequenceSession> CudaSequenceSession::fork_session(const AttentionConfig& attention) const {
  return std::make_unique<CudaSequenceSession>(session_->fork(attention));
}

int64_t CudaSequenceSession::position() const { return session_->positions()[0]; }
int64_t CudaSequenceSession::max_context() const { return session_->max_context(); }
const ModelConfig& CudaSequenceSession::model_config() const { return session_->model().config(); }
const AttentionConfig& CudaSequenceSession::attention_config() const { return session_->options().attention; }
const AttentionStats& CudaSequenceSession::last_stats() const { return session_->last_stats(); }

}  // namespace retroinfer::cuda
