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

std::unique_ptr<SequenceSession> CudaSequenceSession::fork_session(const AttentionConfig& attention) const {
  return std::make_unique<CudaSequenceSession>(session_->fork(attention));
}

int64_t CudaSequenceSession::position() const { return session_->positions()[0]; }
int64_t CudaSequenceSession::max_context() const { return session_->max_context(); }
const ModelConfig& CudaSequenceSession::model_config() const { return session_->model().config(); }
const AttentionConfig& CudaSequenceSession::attention_config() const { return session_->options().attention; }
const AttentionStats& CudaSequenceSession::last_stats() const { return session_->last_stats(); }

}  // namespace retroinfer::cuda
