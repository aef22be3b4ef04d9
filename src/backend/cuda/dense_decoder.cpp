// DenseDecoder: exact split-K decode attention over GPU-resident K/V.
#include "backend/cuda/cuda_check.h"
#include "backend/cuda/layer_common.h"
#include "retroinfer/cuda_backend.h"

namespace retroinfer::cuda {

struct DenseDecoder::Impl {
  AttentionShape shape;
  int num_seqs = 1;
  int64_t max_tokens = 0;
  int max_splits = 0;
  DeviceBuffer part_ml;  // [H, max_splits, G] float2
  DeviceBuffer part_o;   // [H, max_splits, G, D] f32
};

DenseDecoder::DenseDecoder(const AttentionShape& shape, int num_seqs, int64_t max_tokens) : impl_(new Impl) {
  detail::validate_layer_shape(shape, num_seqs, "DenseDecoder");
  RETROINFER_CHECK(max_tokens >= 1, "DenseDecoder: max_tokens must be >= 1, got ", max_tokens);
  impl_->shape = shape;
  impl_->num_seqs = num_seqs;
  impl_->max_tokens = max_tokens;
  const int H = num_seqs * shape.num_heads_kv, G = shape.num_heads_q / shape.num_heads_kv;
  impl_->max_splits = num_splits(max_tokens);
  impl_->part_ml = DeviceBuffer(size_t(H) * impl_->max_splits * G * 8);
  impl_->part_o = DeviceBuffer(size_t(H) * impl_->max_splits * G * shape.head_dim * 4);
}
DenseDecoder::~DenseDecoder() = default;
DenseDecoder::DenseDecoder(DenseDecoder&&) noexcept = default;
DenseDecoder& DenseDecoder::operator=(DenseDecoder&&) noexcept = default;

int DenseDecoder::num_splits(int64_t num_tokens) const {
  // One full wave of CTAs (3 per multiprocessor): long splits amortise each CTA's pipeline fill and
  // state merge (run 2: 2.9 TB/s at 128K batch 1 with two waves of shorter splits).
  return detail::decode_splits(num_tokens, impl_->num_seqs * impl_->shape.num_heads_kv, 1);
}

void DenseDecoder::run(const float* q, const uint16_t* k, const uint16_t* v, int64_t num_tokens,
                       int64_t kv_stride, float scale, float* out, Stream s) {
  detail::validate_kv(k, v, num_tokens, kv_stride, "DenseDecoder::run");
  RETROINFER_CHECK(q != nullptr && out != nullptr, "DenseDecoder::run: null q or out");
  RETROINFER_CHECK(num_tokens <= impl_->max_tokens, "DenseDecoder::run: num_tokens ", num_tokens,
                   " exceeds the max_tokens ", impl_->max_tokens, " the decoder was made for");
  const auto& sh = impl_->shape;
  const int H = impl_->num_seqs * sh.num_heads_kv, G = sh.num_heads_q / sh.num_heads_kv;
  const int splits = num_splits(num_tokens);
  detail::DecodeParams p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.kv_stride = kv_stride;
  p.num_tokens = num_tokens;
  p.num_heads = H;
  p.group = G;
  p.head_dim = sh.head_dim;
  p.scale = detail::effective_scale(scale, sh.head_dim);
  p.num_splits = splits;
  p.split_tokens = detail::split_tokens(num_tokens, splits);
  p.part_ml = impl_->part_ml.as<float2>();
  p.part_o = impl_->part_o.as<float>();
  p.total_splits = splits;
  p.split_offset = 0;
  auto st = static_cast<cudaStream_t>(s);
  detail::launch_check(detail::decode_attention(p, st), "decode_attention(dense)", st);
  detail::CombineParams c;
  c.part_ml = p.part_ml;
  c.part_o = p.part_o;
  c.num_heads = H;
  c.group = G;
  c.head_dim = sh.head_dim;
  c.total_splits = splits;
  c.out = out;
  detail::launch_check(detail::combine_states(c, st), "combine_states(dense)", st);
}

}  // namespace retroinfer::cuda
