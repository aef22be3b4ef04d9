// PrefillAttention over the reference kernel (prefill_attention_ref.h), so that this branch builds and runs
// on its own. The tensor-core PrefillAttention (src/backend/cuda/prefill_attention*.cu) replaces this file:
// delete it when merging that one.
#include "backend/cuda/model/prefill_attention_ref.h"
#include "retroinfer/cuda_model.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda {

struct PrefillAttention::Impl {
  AttentionShape shape;
};

PrefillAttention::PrefillAttention(const AttentionShape& shape) : impl_(new Impl{shape}) {
  validate(shape);
  RETROINFER_CHECK(shape.head_dim % 2 == 0 && shape.head_dim <= model::kRefMaxHeadDim, "PrefillAttention: head_dim ",
                   shape.head_dim, " must be even and <= ", model::kRefMaxHeadDim);
}
PrefillAttention::~PrefillAttention() = default;
PrefillAttention::PrefillAttention(PrefillAttention&&) noexcept = default;
PrefillAttention& PrefillAttention::operator=(PrefillAttention&&) noexcept = default;

void PrefillAttention::run(const float* q, const uint16_t* k, const uint16_t* v, int64_t kv_stride, int64_t pos0,
                           int64_t n, float scale, float* out, Stream s) {
  model::RefAttentionArgs a;
  a.q = q;
  a.k = k;
  a.v = v;
  a.out = out;
  a.kv_stride = kv_stride;
  a.pos0 = pos0;
  a.n = n;
  a.num_seqs = 1;
  a.scale = scale;
  model::prefill_attention_reference(impl_->shape, a, s);
}

}  // namespace retroinfer::cuda
