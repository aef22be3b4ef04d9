// Helpers of the GPU parity tests: random bf16 K/V with cluster structure, device upload with sentinels,
// CPU reference attention in f64, and the comparison metrics (nmse, max-abs, Jaccard).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "retroinfer/cuda_backend.h"
#include "retroinfer/dtype.h"
#include "retroinfer/softmax_state.h"

#define RETROINFER_REQUIRE_GPU()                                                               \
  do {                                                                                         \
    if (!::retroinfer::cuda::device_available())                                               \
      GTEST_SKIP() << "no usable CUDA device: " << ::retroinfer::cuda::device_description();  \
  } while (0)

namespace retroinfer::gputest {

// Sets an environment variable for the scope (switches read at each decode or construction), restoring it
// after. value nullptr unsets it.
class EnvGuard {
 public:
  EnvGuard(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    set(value);
  }
  ~EnvGuard() { set(had_ ? old_.c_str() : nullptr); }
  void set(const char* value) {
    if (value == nullptr) unsetenv(name_);
    else setenv(name_, value, 1);
  }
  EnvGuard(const EnvGuard&) = delete;
  EnvGuard& operator=(const EnvGuard&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// K/V of `heads` flat heads, `n` tokens, stride `stride` >= n, head_dim d, bf16 bits, [heads, stride, d].
// Keys are drawn around `centres` random directions (so that k-means has structure to find) plus noise;
// rows past n are filled with NaN bits (a read past the valid tokens poisons the result).
struct KvData {
  int heads = 0, d = 0;
  int64_t n = 0, stride = 0;
  std::vector<uint16_t> k, v;
  float key(int h, int64_t t, int i) const { return bf16_to_f32(k[(h * stride + t) * d + i]); }
  float value(int h, int64_t t, int i) const { return bf16_to_f32(v[(h * stride + t) * d + i]); }
};

inline KvData make_kv(int heads, int64_t n, int64_t stride, int d, uint64_t seed, int centres = 8,
                      float spread = 0.5f) {
  KvData kv;
  kv.heads = heads;
  kv.d = d;
  kv.n = n;
  kv.stride = stride;
  kv.k.assign(size_t(heads) * stride * d, 0x7fc0);  // bf16 quiet NaN
  kv.v.assign(size_t(heads) * stride * d, 0x7fc0);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int h = 0; h < heads; ++h) {
    std::vector<float> c(size_t(centres) * d);
    for (auto& x : c) x = 2.0f * nd(rng);
    std::uniform_int_distribution<int> pick(0, centres - 1);
    for (int64_t t = 0; t < n; ++t) {
      const int j = pick(rng);
      for (int i = 0; i < d; ++i) {
        kv.k[(h * stride + t) * d + i] = f32_to_bf16(c[size_t(j) * d + i] + spread * nd(rng));
        kv.v[(h * stride + t) * d + i] = f32_to_bf16(nd(rng));
      }
    }
  }
  return kv;
}

// Queries [heads * group, d] f32, drawn near a key of each head so attention is peaked.
inline std::vector<float> make_q(const KvData& kv, int group, uint64_t seed, float gain = 0.6f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::uniform_int_distribution<int64_t> pick(0, kv.n - 1);
  std::vector<float> q(size_t(kv.heads) * group * kv.d);
  for (int h = 0; h < kv.heads; ++h)
    for (int g = 0; g < group; ++g) {
      const int64_t t = pick(rng);
      for (int i = 0; i < kv.d; ++i)
        q[(size_t(h) * group + g) * kv.d + i] = gain * kv.key(h, t, i) + 0.3f * nd(rng);
    }
  return q;
}

template <typename T>
cuda::DeviceBuffer upload(const std::vector<T>& host) {
  cuda::DeviceBuffer b(host.size() * sizeof(T));
  b.upload(host.data(), host.size() * sizeof(T));
  return b;
}

// A device output of `count` floats poisoned with NaN (0xff bytes).
inline cuda::DeviceBuffer poisoned(size_t count) {
  cuda::DeviceBuffer b(count * 4);
  b.fill_bytes(0xff);
  return b;
}

inline std::vector<float> download_f32(const cuda::DeviceBuffer& b, size_t count) {
  std::vector<float> out(count);
  b.download(out.data(), count * 4);
  return out;
}

// f64 softmax state of one query head over exact tokens and estimated clusters (weight, value sum).
struct RefState {
  double m = -std::numeric_limits<double>::infinity(), l = 0.0;
  std::vector<double> o;
  explicit RefState(int d) : o(d, 0.0) {}
  void push(double logit, double weight, const float* v, int d) {
    if (logit == -std::numeric_limits<double>::infinity()) return;
    if (logit > m) {
      const double a = m == -std::numeric_limits<double>::infinity() ? 0.0 : std::exp(m - logit);
      for (auto& x : o) x *= a;
      l *= a;
      m = logit;
    }
    const double p = std::exp(logit - m);
    l += weight * p;
    for (int i = 0; i < d; ++i) o[i] += p * v[i];
  }
  void finish(float* out, int d) const {
    for (int i = 0; i < d; ++i) out[i] = l > 0 ? static_cast<float>(o[i] / l) : 0.0f;
  }
};

// Exact attention of query head (h, g) over `tokens` of flat head h: out[d].
inline void ref_exact(const KvData& kv, const float* q, float scale, int h, const std::vector<int32_t>& tokens,
                      RefState& st) {
  std::vector<float> v(kv.d);
  for (int32_t t : tokens) {
    double s = 0;
    for (int i = 0; i < kv.d; ++i) s += double(q[i]) * kv.key(h, t, i);
    for (int i = 0; i < kv.d; ++i) v[i] = kv.value(h, t, i);
    st.push(s * scale, 1.0, v.data(), kv.d);
  }
}

struct Compare {
  double nmse = 0, max_abs = 0;
  int64_t unwritten = 0;         // NaN / Inf outputs
  int64_t first_unwritten = -1;  // the first of them
  int64_t worst = -1;            // where max_abs is
};
inline Compare compare(const std::vector<float>& got, const std::vector<float>& ref) {
  Compare c;
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i])) {
      if (c.unwritten++ == 0) c.first_unwritten = int64_t(i);
      continue;
    }
    const double e = double(got[i]) - ref[i];
    num += e * e;
    den += double(ref[i]) * ref[i];
    if (std::abs(e) > c.max_abs) {
      c.max_abs = std::abs(e);
      c.worst = int64_t(i);
    }
  }
  c.nmse = den > 0 ? num / den : num;
  return c;
}

// Raw f32 bits of a device buffer (bitwise comparisons), and back.
inline std::vector<uint32_t> download_bits(const cuda::DeviceBuffer& b, size_t count) {
  std::vector<uint32_t> out(count);
  b.download(out.data(), count * 4);
  return out;
}
inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Formed cluster scores [H, C] (raw bits): each query head's softmax over the non-empty clusters sums to 1, so
// a head's scores sum to G (all -inf when every cluster is empty). f32 terms: relative error ~C 2^-24 <= 5e-4
// at C 8188; bound 1e-3.
inline void expect_scores_sum_to_group(const std::vector<uint32_t>& scores, int H, int C, int G) {
  for (int h = 0; h < H; ++h) {
    double sum = 0;
    bool any = false;
    for (int c = 0; c < C; ++c) {
      const float x = bits_to_f32(scores[size_t(h) * C + c]);
      if (x == -INFINITY) continue;
      any = true;
      sum += x;
    }
    if (any) {
      EXPECT_NEAR(sum, G, 1e-3 * G) << "head " << h;
    }
  }
}

// Dimension i of centroid c as the decode scored it: the int8 copy (u - 128) * scale when the layer scores
// int8 (AttentionConfig::int8_centroid_scoring, the default), else the bf16 centroid.
inline double scored_centroid(const cuda::RetroDebugState& st, int d, int c, int i) {
  if (!st.centroids_q8.empty())
    return (double(st.centroids_q8[size_t(c) * d + i]) - 128.0) * double(st.centroid_scale[size_t(c)]);
  return bf16_to_f32(st.centroids_bf16[size_t(c) * d + i]);
}

inline double jaccard_distance(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  std::set<int32_t> sa(a.begin(), a.end()), sb(b.begin(), b.end());
  size_t inter = 0;
  for (int32_t x : sa) inter += sb.count(x);
  const size_t uni = sa.size() + sb.size() - inter;
  return uni == 0 ? 0.0 : 1.0 - double(inter) / double(uni);
}

}  // namespace retroinfer::gputest
