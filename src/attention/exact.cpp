#include "attention/exact.h"

#include <cmath>
#include <vector>

namespace retroinfer::attention {

float effective_scale(float scale, int head_dim) {
  return scale != 0.0f ? scale : 1.0f / std::sqrt(static_cast<float>(head_dim));
}

namespace {
// One online-softmax step for every query head of the group: the token's key and value are read (and
// converted from storage) once for the whole group.
inline void push_token(const KvCache& kv, int kvh, int64_t t, const float* q, float scale, GroupState& gs,
                       float* vbuf) {
  const int d = gs.head_dim;
  bool loaded = false;
  for (int g = 0; g < gs.group; ++g) {
    const float s = kv.dot_key(kvh, t, q + static_cast<size_t>(g) * d) * scale;
    SoftmaxScalars& st = gs.st[g];
    float* o = &gs.o[static_cast<size_t>(g) * d];
    if (s > st.m) {
      const float a = softmax_rescale(st.m, s);
      for (int i = 0; i < d; ++i) o[i] *= a;
      st.l *= a;
      st.m = s;
    }
    const float p = std::exp(s - st.m);
    st.l += p;
    if (!loaded) {
      kv.load_value(kvh, t, vbuf);
      loaded = true;
    }
    for (int i = 0; i < d; ++i) o[i] += p * vbuf[i];
  }
}
}  // namespace

void accumulate_range(const KvCache& kv, int kvh, const float* q, float scale, int64_t begin, int64_t end,
                      GroupState& gs) {
  std::vector<float> vbuf(gs.head_dim);
  for (int64_t t = begin; t < end; ++t) push_token(kv, kvh, t, q, scale, gs, vbuf.data());
}

void accumulate_tokens(const KvCache& kv, int kvh, const float* q, float scale, const int64_t* tokens,
                       int64_t n, GroupState& gs) {
  std::vector<float> vbuf(gs.head_dim);
  for (int64_t i = 0; i < n; ++i) push_token(kv, kvh, tokens[i], q, scale, gs, vbuf.data());
}

}  // namespace retroinfer::attention
