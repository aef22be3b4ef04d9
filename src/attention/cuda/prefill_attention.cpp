// PrefillAttention: causal GQA prefill attention over GPU-resident bf16 K/V (kernel: prefill_attention.cu).
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda_check.h"
#include "kernels/kernel_common.h"
#include "attention/cuda/layer_common.h"
#include "kernels/model_kernels.h"
#include "kernels/prefill_kernels.h"
#include "retroinfer/cuda_backend.h"
#include "retroinfer/cuda_device.h"

namespace retroinfer::cuda {

struct PrefillAttention::Impl {
  AttentionShape shape;
  PrefillKernel kernel = PrefillKernel::kPortable;
  DeviceBuffer split_parts;  // kPrefillSplitWorkspaceBytes once a launch splits its keys (prefill_kernels.h)
  DeviceBuffer work;         // the Hopper kernel's work counter (PrefillParams::work)
  DeviceBuffer q_bf16;       // q rounded to bf16 for the Hopper kernel, when the caller passes none
};

std::string_view prefill_kernel_name(PrefillKernel k) {
  switch (k) {
    case PrefillKernel::kAuto: return "auto";
    case PrefillKernel::kPortable: return "portable";
    case PrefillKernel::kHopper: return "hopper";
  }
  return "?";
}

PrefillKernel parse_prefill_kernel(std::string_view s) {
  if (s == "auto") return PrefillKernel::kAuto;
  if (s == "portable") return PrefillKernel::kPortable;
  if (s == "hopper") return PrefillKernel::kHopper;
  RETROINFER_FAIL("unknown prefill kernel '", s, "' (auto, portable or hopper)");
}

PrefillAttention::PrefillAttention(const AttentionShape& shape, PrefillKernel kernel) : impl_(new Impl) {
  detail::validate_layer_shape(shape, 1, "PrefillAttention");
  impl_->shape = shape;
  const bool hopper_ok = shape.head_dim == 128 && detail::prefill_hopper_supported();
  if (kernel == PrefillKernel::kHopper)
    RETROINFER_CHECK(hopper_ok, "PrefillAttention: the Hopper prefill kernel needs head_dim 128 (got ", shape.head_dim,
                     ") on a compute capability 9.0 GPU (", device_description(), ")");
  impl_->kernel = kernel == PrefillKernel::kAuto ? (hopper_ok ? PrefillKernel::kHopper : PrefillKernel::kPortable)
                                                 : kernel;
  if (impl_->kernel == PrefillKernel::kHopper) impl_->work = DeviceBuffer(sizeof(unsigned));
}

PrefillKernel PrefillAttention::kernel() const {
  RETROINFER_CHECK(impl_ != nullptr, "PrefillAttention::kernel on a moved-from object");
  return impl_->kernel;
}
PrefillAttention::~PrefillAttention() = default;
PrefillAttention::PrefillAttention(PrefillAttention&&) noexcept = default;
PrefillAttention& PrefillAttention::operator=(PrefillAttention&&) noexcept = default;

namespace {
bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
}  // namespace

void PrefillAttention::run(const float* q, const uint16_t* k, const uint16_t* v, int64_t kv_stride, int64_t pos0,
                           int64_t n, float scale, float* out, Stream s, const uint16_t* q_bf16) {
  launch(q, q_bf16, k, v, kv_stride, pos0, n, scale, out, nullptr, s);
}

void PrefillAttention::run_bf16(const float* q, const uint16_t* k, const uint16_t* v, int64_t kv_stride, int64_t pos0,
                                int64_t n, float scale, uint16_t* out, Stream s, const uint16_t* q_bf16) {
  launch(q, q_bf16, k, v, kv_stride, pos0, n, scale, nullptr, out, s);
}

void PrefillAttention::launch(const float* q, const uint16_t* q_bf16, const uint16_t* k, const uint16_t* v,
                              int64_t kv_stride, int64_t pos0, int64_t n, float scale, float* out, uint16_t* out_bf16,
                              Stream s) {
  RETROINFER_CHECK(impl_ != nullptr, "PrefillAttention::run on a moved-from object");
  const void* dst = out != nullptr ? static_cast<const void*>(out) : out_bf16;
  const AttentionShape& sh = impl_->shape;
  const int group = sh.num_heads_q / sh.num_heads_kv;
  RETROINFER_CHECK(pos0 >= 0 && n >= 0, "PrefillAttention::run: pos0 (", pos0, ") and n (", n,
                   ") must be >= 0");
  if (n == 0) return;
  RETROINFER_CHECK(q != nullptr && k != nullptr && v != nullptr && dst != nullptr,
                   "PrefillAttention::run: null q, k, v or out pointer");
  RETROINFER_CHECK(aligned16(q) && aligned16(k) && aligned16(v) && aligned16(dst) && aligned16(q_bf16),
                   "PrefillAttention::run: q, q_bf16, k, v and out must be 16-byte aligned (device allocations are)");
  RETROINFER_CHECK(kv_stride >= pos0 + n, "PrefillAttention::run: kv_stride (", kv_stride,
                   ") must hold the positions [0, pos0 + n) = [0, ", pos0 + n, ")");
  RETROINFER_CHECK(pos0 + n < (int64_t{1} << 31) - detail::kHopperKeys, "PrefillAttention::run: pos0 + n = ",
                   pos0 + n, " exceeds the 2^31 token positions the kernel indexes");
  RETROINFER_CHECK(n * group < (int64_t{1} << 31) - detail::kPrefillRows, "PrefillAttention::run: n * group = ",
                   n * group, " query rows exceed 2^31; split the prefill into smaller chunks");
  RETROINFER_CHECK(scale >= 0.0f && std::isfinite(scale), "PrefillAttention::run: scale must be finite and >= 0 "
                   "(0 means 1/sqrt(head_dim)), got ", scale);
  detail::PrefillParams p;
  p.q = q;
  p.k = k;
  p.v = v;
  p.out = out;
  p.out_bf16 = out_bf16;
  p.kv_stride = kv_stride;
  p.pos0 = static_cast<int>(pos0);
  p.n = static_cast<int>(n);
  p.num_heads_q = sh.num_heads_q;
  p.num_heads_kv = sh.num_heads_kv;
  p.group = group;
  p.head_dim = sh.head_dim;
  p.scale_log2 = detail::effective_scale(scale, sh.head_dim) * 1.4426950408889634f;  // log2(e)
  // Few query rows over a long cache: split the keys so that the launch fills the GPU (prefill_kernels.h).
  const int64_t row_floats = n * sh.num_heads_q * (sh.head_dim + 2);
  const int splits = static_cast<int>(std::min<int64_t>(detail::prefill_splits(p, detail::sm_count()),
                                                        detail::kPrefillSplitWorkspaceBytes / (4 * row_floats)));
  if (splits > 1) {
    if (impl_->split_parts.bytes() == 0) impl_->split_parts = DeviceBuffer(detail::kPrefillSplitWorkspaceBytes);
    p.splits = splits;
    p.part_o = impl_->split_parts.as<float>();
    p.part_ml = p.part_o + int64_t{splits} * n * sh.num_heads_q * sh.head_dim;
  }
  RETROINFER_CHECK(detail::prefill_ctas(p) < (int64_t{1} << 31), "PrefillAttention::run: ",
                   detail::prefill_ctas(p), " CTAs exceed the grid limit; split the prefill into smaller chunks");
  auto st = static_cast<cudaStream_t>(s);
  if (impl_->kernel == PrefillKernel::kHopper) {
    p.work = impl_->work.as<unsigned>();
    p.q_bf16 = q_bf16;
    if (q_bf16 == nullptr) {  // rounded here: one more pass over q (callers that have bf16 q pass it)
      const size_t elems = static_cast<size_t>(n) * sh.num_heads_q * sh.head_dim;
      if (impl_->q_bf16.bytes() < elems * 2) impl_->q_bf16 = DeviceBuffer(elems * 2);
      detail::launch_check(model::f32_to_bf16_array(q, impl_->q_bf16.as<uint16_t>(), elems, st), "f32_to_bf16_array",
                           st);
      p.q_bf16 = impl_->q_bf16.as<uint16_t>();
    }
  }
  detail::launch_check(detail::prefill_attention(p, st, impl_->kernel == PrefillKernel::kHopper), "prefill_attention", st);
}

}  // namespace retroinfer::cuda
