// DenseDecoder: exact split-K decode attention over GPU-resident K/V (decode_dense.h dense_decode).
#include "kernels/cuda_check.h"
#include "kernels/decode_dense.h"
#include "attention/cuda/layer_common.h"
#include "retroinfer/cuda_backend.h"

namespace retroinfer::cuda {

struct DenseDecoder::Impl {
  AttentionShape shape;
  int num_seqs = 1;
  int64_t max_tokens = 0;
  int max_splits = 0;
  DeviceBuffer part_ml;        // [H, max_splits, G] float2
  DeviceBuffer part_o;         // [H, max_splits, G, D] f32
  DeviceBuffer merge_counter;  // [H] int: the fused merge's per-head CTA count (zeroed once; kept zero)
};

DenseDecoder::DenseDecoder(const AttentionShape& shape, int num_seqs, int64_t max_tokens) : impl_(new Impl) {
  detail::validate_layer_shape(shape, num_seqs, "DenseDecoder");
  RETROINFER_CHECK(max_tokens >= 1, "DenseDecoder: max_tokens must be >= 1, got ", max_tokens);
  impl_->shape = shape;
  impl_->num_seqs = num_seqs;
  impl_->max_tokens = max_tokens;
  const int H = num_seqs * shape.num_heads_kv, G = shape.num_heads_q / shape.num_heads_kv;
  impl_->max_splits = num_splits(max_tokens);  // the splits grow with the tokens
  impl_->part_ml = DeviceBuffer(size_t(H) * impl_->max_splits * G * 8);
  impl_->part_o = DeviceBuffer(size_t(H) * impl_->max_splits * G * shape.head_dim * 4);
  impl_->merge_counter = DeviceBuffer(size_t(H) * 4);
  impl_->merge_counter.fill_bytes(0);
  RETROINFER_CUDA_CHECK(cudaStreamSynchronize(nullptr));  // zero before run() on any stream
}
DenseDecoder::~DenseDecoder() = default;
DenseDecoder::DenseDecoder(DenseDecoder&&) noexcept = default;
DenseDecoder& DenseDecoder::operator=(DenseDecoder&&) noexcept = default;

namespace {
// The launch arguments both runs share: the shape, the scale and the split workspace of `m`.
template <typename Impl>
detail::DenseDecodeArgs dense_args(const Impl& m, const float* q, int64_t num_tokens, int64_t kv_stride, float scale,
                                   float* out) {
  const auto& sh = m.shape;
  detail::DenseDecodeArgs a;
  a.q = q;
  a.kv_stride = kv_stride;
  a.num_tokens = num_tokens;
  a.num_heads = m.num_seqs * sh.num_heads_kv;
  a.group = sh.num_heads_q / sh.num_heads_kv;
  a.head_dim = sh.head_dim;
  a.scale = detail::effective_scale(scale, sh.head_dim);
  a.part_ml = m.part_ml.template as<float2>();
  a.part_o = m.part_o.template as<float>();
  a.max_splits = m.max_splits;
  a.out = out;
  return a;
}
}  // namespace

void DenseDecoder::run_int8(const float* q, const detail::KvInt8Rows& kv, int64_t num_tokens, int64_t kv_stride,
                            float scale, float* out, Stream s) {
  RETROINFER_CHECK(kv.on() && q != nullptr && out != nullptr, "DenseDecoder::run_int8: null K rows, q or out");
  RETROINFER_CHECK(num_tokens >= 1 && num_tokens <= impl_->max_tokens && kv_stride >= num_tokens,
                   "DenseDecoder::run_int8: num_tokens ", num_tokens, " outside [1, ", impl_->max_tokens,
                   "] or past the row stride ", kv_stride);
  detail::DenseDecodeArgs a = dense_args(*impl_, q, num_tokens, kv_stride, scale, out);
  a.kv8 = kv;
  detail::dense_decode(a, static_cast<cudaStream_t>(s), "dense_decode(DenseDecoder, int8)");
}

int DenseDecoder::num_splits(int64_t num_tokens) const {
  // One full wave of CTAs: long splits amortise each CTA's pipeline fill and state merge (two waves of
  // shorter splits leave HBM bandwidth unused).
  return detail::dense_splits(detail::DenseKernel::kTensorMap, num_tokens, impl_->num_seqs * impl_->shape.num_heads_kv,
                              impl_->shape.head_dim);
}

void DenseDecoder::run(const float* q, const uint16_t* k, const uint16_t* v, int64_t num_tokens,
                       int64_t kv_stride, float scale, float* out, Stream s) {
  detail::validate_kv(k, v, num_tokens, kv_stride, "DenseDecoder::run");
  RETROINFER_CHECK(q != nullptr && out != nullptr, "DenseDecoder::run: null q or out");
  RETROINFER_CHECK(num_tokens <= impl_->max_tokens, "DenseDecoder::run: num_tokens ", num_tokens,
                   " exceeds the max_tokens ", impl_->max_tokens, " the decoder was made for");
  detail::DenseDecodeArgs a = dense_args(*impl_, q, num_tokens, kv_stride, scale, out);
  a.k = k;
  a.v = v;
  a.merge_counter = impl_->merge_counter.as<int>();
  detail::dense_decode(a, static_cast<cudaStream_t>(s), "dense_decode(DenseDecoder)");
}

}  // namespace retroinfer::cuda
