// Host side of the dense decode (decode_dense.h): the split counts and the one launch function of every
// dense-decode caller.
#include <algorithm>
#include <cstdint>

#include "kernels/cuda_check.h"
#include "kernels/decode_dense.h"
#include "kernels/kernels.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda::detail {

int dense_stream_splits(int64_t num_tokens, int num_heads, int sms, int ctas_per_sm) {
  const int64_t total = int64_t{ctas_per_sm > 0 ? ctas_per_sm : 1} * sms;
  const int64_t want = total / (num_heads > 0 ? num_heads : 1);
  const int64_t most = ceil_div(num_tokens > 0 ? num_tokens : 1, kDenseTile);
  const int64_t s = want < most ? want : most;
  return static_cast<int>(s > 0 ? s : 1);
}

int dense_splits(DenseKernel k, int64_t num_tokens, int num_heads, int head_dim) {
  int ctas = 0;
  RETROINFER_CUDA_CHECK(dense_ctas_per_sm(k, head_dim, &ctas));
  // The kernel's occupancy (fewer than kDenseCtasPerSm would mean the carveout did not apply): fewer, longer
  // splits keep one wave.
  return dense_stream_splits(num_tokens, num_heads, sm_count(), ctas < kDenseCtasPerSm ? ctas : kDenseCtasPerSm);
}

namespace {
// combine_states over `splits` partial states per head of the workspace into a.out.
void combine(const DenseDecodeArgs& a, int splits, cudaStream_t st, const char* who) {
  CombineParams c;
  c.part_ml = a.part_ml;
  c.part_o = a.part_o;
  c.num_heads = a.num_heads;
  c.group = a.group;
  c.head_dim = a.head_dim;
  c.total_splits = splits;
  c.out = a.out;
  launch_check(combine_states(c, st), who, st);
}

// int8 rows (a.kv8): decode.cu's split-K kernel over the dense range (the streaming kernels copy bf16 tiles
// straight into the MMA layout), then combine_states.
int dense_decode_int8(const DenseDecodeArgs& a, cudaStream_t st, const char* who) {
  RETROINFER_CHECK(a.kv8.v != nullptr && a.kv8.k_scale != nullptr && a.kv8.v_scale != nullptr &&
                       (reinterpret_cast<uintptr_t>(a.kv8.k) & 15) == 0 && (reinterpret_cast<uintptr_t>(a.kv8.v) & 15) == 0,
                   who, ": int8 dense decode needs 16-byte aligned K and V rows and both scale arrays");
  int splits = decode_splits(a.num_tokens, a.num_heads, 1);
  if (splits > a.max_splits) splits = a.max_splits;
  const int64_t per = split_tokens(a.num_tokens, splits);
  splits = static_cast<int>(ceil_div(a.num_tokens, per));
  DecodeParams p;
  p.q = a.q;
  p.kv8 = a.kv8;
  p.kv_stride = a.kv_stride;
  p.num_tokens = a.num_tokens;
  p.num_heads = a.num_heads;
  p.group = a.group;
  p.head_dim = a.head_dim;
  p.scale = a.scale;
  p.num_splits = splits;
  p.split_tokens = per;
  p.part_ml = a.part_ml;
  p.part_o = a.part_o;
  p.total_splits = splits;
  launch_check(decode_attention(p, st), who, st);
  combine(a, splits, st, who);
  return splits;
}
}  // namespace

int dense_decode(const DenseDecodeArgs& a, cudaStream_t st, const char* who) {
  const bool int8 = a.kv8.on();
  RETROINFER_CHECK(a.q != nullptr && (int8 || (a.k != nullptr && a.v != nullptr)) && a.out != nullptr &&
                       a.part_ml != nullptr && a.part_o != nullptr,
                   who, ": dense decode with a null q, K, V, out or split workspace");
  RETROINFER_CHECK(a.num_tokens >= 1 && a.kv_stride >= a.num_tokens, who, ": dense decode of ", a.num_tokens,
                   " tokens in rows of stride ", a.kv_stride, " (need 1 <= tokens <= stride)");
  RETROINFER_CHECK(a.num_heads >= 1 && a.group >= 1 && a.group <= kMaxGroup && (a.head_dim == 64 || a.head_dim == 128),
                   who, ": dense decode shape H=", a.num_heads, " G=", a.group, " D=", a.head_dim,
                   " (need G in [1, ", kMaxGroup, "], D 64 or 128)");
  RETROINFER_CHECK(a.max_splits >= 1, who, ": dense decode with a split workspace of ", a.max_splits, " slots");
  if (int8) return dense_decode_int8(a, st, who);
  // 16-byte copies (cp.async, bulk copies) of whole rows: the K/V bases must be 16-byte aligned (rows are
  // 128 / 256 bytes, so every row then is).
  RETROINFER_CHECK((reinterpret_cast<uintptr_t>(a.k) & 15) == 0 && (reinterpret_cast<uintptr_t>(a.v) & 15) == 0, who,
                   ": dense decode needs 16-byte aligned K and V");
  int splits = dense_splits(a.kernel, a.num_tokens, a.num_heads, a.head_dim);
  if (splits > a.max_splits) splits = a.max_splits;
  const int H = a.num_heads, G = a.group, D = a.head_dim;
  DenseParams p;
  p.q = a.q;
  p.k = a.k;
  p.v = a.v;
  p.kv_stride = a.kv_stride;
  p.num_tokens = a.num_tokens;
  p.num_heads = H;
  p.group = G;
  p.head_dim = D;
  p.scale = a.scale;
  p.num_splits = splits;
  p.part_ml = a.part_ml;
  p.part_o = a.part_o;
  const bool merged = a.merge_counter != nullptr && int64_t{splits} * G <= kMergeMaxStates &&
                      (reinterpret_cast<uintptr_t>(a.out) & 15) == 0;
  if (merged) {
    p.merge.counter = a.merge_counter;
    p.merge.out = a.out;
  }
  launch_check(dense_decode_stream(a.kernel, p, st), who, st);
  if (!merged) combine(a, splits, st, who);
  return splits;
}

}  // namespace retroinfer::cuda::detail
