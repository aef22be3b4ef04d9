// Vectorisable float kernels shared by the CPU attention paths (src/attention/exact.cpp, the wave index's
// scoring): written so that the compiler vectorises them without -ffast-math, and always inlined so that they
// take the instruction set of the function they are inlined into (the callers are compiled several times,
// target_clones, and pick AVX-512, AVX2 + FMA or the baseline at run time).
#pragma once

#include <bit>
#include <cstdint>

// The callers' per-instruction-set clones (ifunc resolvers). ThreadSanitizer's runtime is not up when the
// resolvers run at load time (the binary crashes before main), so a TSan build compiles the baseline only.
#if defined(__SANITIZE_THREAD__)
#define RETROINFER_TARGET_CLONES
#else
#define RETROINFER_TARGET_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#endif

namespace retroinfer::core {

// e^x for x <= 0 (a logit minus a running or a block maximum): e^x = 2^n * e^r with
// n = round(x / ln 2), r = x - n ln 2 in [-ln 2 / 2, ln 2 / 2], e^r by its Taylor polynomial of degree 7
// (remainder below 2e-9 relative) in Horner form. Relative error about 2e-7 (a few float roundings), below
// the bf16 KV's own rounding by far. Arguments below -87 give 0 (e^-87 is at the bottom of the normal floats),
// NaN gives NaN. Arithmetic and bit operations only, so that a loop of it vectorises without -ffast-math (libm's
// expf does not): n's integer comes from the rounding sum's bits (not a float-to-int conversion) and the
// underflow is a mask, not a select of x: without AVX-512's mask registers GCC leaves a loop scalar when a
// conversion follows a select under its default -ftrapping-math (a select-and-convert form vectorised only in
// the x86-64-v4 clone; on an AVX2 host it ran at ~4 ns an element, this one at ~0.6).
[[gnu::always_inline]] inline float exp_nonpositive(float x) {
  constexpr float kLog2e = 1.44269504088896341f;
  constexpr float kLn2Hi = 0.693145751953125f;  // ln 2 split in two so that n * kLn2Hi is exact
  constexpr float kLn2Lo = 1.42860682030941723e-6f;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding and subtracting it rounds to an integer
  const uint32_t keep = x < -87.0f ? 0u : ~0u;
  const float t = x * kLog2e + kRound;  // kRound + n, exactly, for |n| < 2^22
  const float n = t - kRound;
  const float r = (x - n * kLn2Hi) - n * kLn2Lo;
  float p = 1.0f / 5040.0f;
  p = p * r + 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const uint32_t n_bits = std::bit_cast<uint32_t>(t) - std::bit_cast<uint32_t>(kRound);  // n modulo 2^32
  const float two_n = std::bit_cast<float>((n_bits + 127u) << 23);
  return std::bit_cast<float>(std::bit_cast<uint32_t>(p * two_n) & keep);
}

// q . k in kLanes partial sums (lane l adds the elements i with i % kLanes == l, in order), summed pairwise at
// the end, the elements past the last whole kLanes after: the same sum with any vector width, and loops the
// compiler vectorises without reassociating (constant indices keep the lanes in registers).
inline constexpr int kLanes = 16;
[[gnu::always_inline]] inline float dot_lanes(const float* q, const float* k, int d) {
  float part[kLanes] = {};
  const int whole = d - d % kLanes;
  for (int i = 0; i < whole; i += kLanes)
    for (int l = 0; l < kLanes; ++l) part[l] += q[i + l] * k[i + l];
  for (int l = 0; l < 8; ++l) part[l] += part[l + 8];
  for (int l = 0; l < 4; ++l) part[l] += part[l + 4];
  for (int l = 0; l < 2; ++l) part[l] += part[l + 2];
  float acc = part[0] + part[1];
  for (int i = whole; i < d; ++i) acc += q[i] * k[i];
  return acc;
}

// The maximum of init and x[0, n) (exact in any order), and the sum of x[0, n) in kLanes partial sums (lane l adds
// the elements i < n - n % kLanes with i % kLanes == l, in order; the lanes in order, then the tail): loops the
// compiler vectorises without -ffast-math, and the same result with any vector width.
[[gnu::always_inline]] inline float max_lanes(const float* x, int64_t n, float init) {
  const int64_t whole = n - n % kLanes;
  float part[kLanes];
  for (int l = 0; l < kLanes; ++l) part[l] = init;
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int l = 0; l < kLanes; ++l) part[l] = part[l] < x[i + l] ? x[i + l] : part[l];
  float m = part[0];
  for (int l = 1; l < kLanes; ++l) m = m < part[l] ? part[l] : m;
  for (int64_t i = whole; i < n; ++i) m = m < x[i] ? x[i] : m;
  return m;
}
[[gnu::always_inline]] inline float sum_lanes(const float* x, int64_t n) {
  const int64_t whole = n - n % kLanes;
  float part[kLanes] = {};
  for (int64_t i = 0; i < whole; i += kLanes)
    for (int l = 0; l < kLanes; ++l) part[l] += x[i + l];
  float acc = 0.0f;
  for (int l = 0; l < kLanes; ++l) acc += part[l];
  for (int64_t i = whole; i < n; ++i) acc += x[i];
  return acc;
}

// Widens a row of n bf16 elements to f32.
[[gnu::always_inline]] inline void widen_bf16(const void* src, int n, float* dst) {
  const auto* r = static_cast<const uint16_t*>(src);
  for (int i = 0; i < n; ++i) dst[i] = std::bit_cast<float>(static_cast<uint32_t>(r[i]) << 16);
}

}  // namespace retroinfer::core
