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
    r.host_store = session_->options().wave.store_dtype;
    // Counted by the session after each step, its own or a joined one (CudaSessionOptions::count_wave_traffic).
    const CudaWaveTraffic& t = session_->wave_traffic();
    r.step_pcie_bytes = t.step_bytes;
    r.pcie_bytes = t.total_bytes;
    r.decode_steps = t.steps;
  }
  return r;
}

std::unique_ptr<SequenceSession> CudaSequenceSession::fork_session(const AttentionConfig& attention) const {
  return std::make_unique<CudaSequenceSession>(session_->fork(attention));
}

void CudaSequenceSession::load_prefix(const KvPrefix& prefix) { session_->load_prefix(prefix); }
KvBlock CudaSequenceSession::export_kv(int64_t from, int64_t to) const { return session_->export_kv(from, to); }
bool CudaSequenceSession::supports_prefix() const { return session_->supports_prefix(); }

int64_t CudaSequenceSession::position() const { return session_->positions()[0]; }
int64_t CudaSequenceSession::max_context() const { return session_->max_context(); }
const ModelConfig& CudaSequenceSession::model_config() const { return session_->model().config(); }
const AttentionConfig& CudaSequenceSession::attention_config() const { return session_->options().attention; }
const AttentionStats& CudaSequenceSession::last_stats() const { return session_->last_stats(); }

}  // namespace retroinfer::cuda
