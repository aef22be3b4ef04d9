// The 8-bit KV cache on the GPU (--kv-dtype int8; src/attention/cuda/kv_int8_cache.h): its key calibration
// against an f64 reference, its row kernels against core/row_quant.h's arithmetic bit for bit, full and retro
// decode over int8 rows against an f64 CPU reference over the widened rows (q * s, keys calibrated back), and
// CUDA sessions with the 8-bit KV against the bf16 ones on a small random model. The keys of the row and layer
// tests carry two loud constant channels, which the calibration must take out.
//
// Tolerances:
//   rows: the kernels call row_quant.h's functions per value and round each step of the calibration once, so
//     quantised values, scales and widened bf16 rows equal the CPU's bit for bit given the device's
//     calibration (whose mean is the f64 mean to f32 rounding: 32 partial sums rounded to f32).
//   calibration: the quiet channels' error must be under a quarter of the raw rows' (the loud channels'
//     offsets of 40 and 25 set a raw row's scale to ~0.3; calibrated, ~0.03).
//   layer decode: the kernel multiplies int8 values (exact in bf16) by the query's bf16 hi / lo parts (of
//     q * factor), scales each logit by its row's K scale plus q . mean and each probability by its row's V
//     scale in f32, so it computes
//     attention over q * s to the bf16 path's ~2^-18: the bf16 dense decode's bounds (test_cuda_dense.cpp,
//     nmse 1e-9, max |diff| 1e-4) hold.
//   sessions: int8 rows move each K/V element by up to s / 2 (~0.4% of a row's largest value), which the
//     model carries through its layers; the bounds are the placement tests' (row max |diff| <= 0.5 of the logit
//     scale): a wrong row, head or scale is off by O(1). full: greedy tokens equal wherever bf16's top-2 margin
//     exceeds 10%. retro: the moved queries can swap a retrieval cluster at a near tie of cluster scores, which
//     on this random model moves a step's logits by up to ~0.4 of their scale (H200: one clear-margin token of
//     10 differed); at least 80% of those tokens must agree. The prefill runs on bf16 staging in both, so its
//     logits agree to 1e-6.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include <cuda_runtime.h>

#include "attention/cuda/kv_int8_cache.h"
#include "core/row_quant.h"
#include "cuda_model_test_util.h"
#include "gpu_test_util.h"
#include "kernels/cuda_check.h"
#include "retroinfer/cuda_model.h"
#include "retroinfer/error.h"
#include "retroinfer/model.h"
#include "retroinfer/sampler.h"

namespace retroinfer {
namespace {

using gputest::Compare;
using gputest::KvData;

constexpr double kNmse = 1e-9;
constexpr double kMaxAbs = 1e-4;

// A key calibration ([heads, d] each), as KvInt8Cache::fill computes it or downloaded from one.
struct KeyCal {
  std::vector<float> mean, factor;
};

// The calibration kv_int8_key_calibration should compute from rows [0, n) of kv's keys, in f64 sums.
KeyCal reference_calibration(const KvData& kv, int64_t n) {
  KeyCal c;
  c.mean.assign(size_t(kv.heads) * kv.d, 0.0f);
  c.factor.assign(size_t(kv.heads) * kv.d, 1.0f);
  for (int h = 0; h < kv.heads; ++h) {
    std::vector<float> dev(kv.d, 0.0f);
    for (int i = 0; i < kv.d; ++i) {
      double sum = 0.0;
      for (int64_t t = 0; t < n; ++t) sum += kv.key(h, t, i);
      const float mean = float(sum / double(n));
      c.mean[size_t(h) * kv.d + i] = mean;
      for (int64_t t = 0; t < n; ++t) dev[i] = std::max(dev[i], std::fabs(kv.key(h, t, i) - mean));
    }
    const float top = *std::max_element(dev.begin(), dev.end());
    for (int i = 0; i < kv.d; ++i)
      if (top > 0.0f) c.factor[size_t(h) * kv.d + i] = std::sqrt(std::max(dev[i], cuda::detail::kKeyFactorFloor * top));
  }
  return c;
}

KeyCal download_calibration(const cuda::KvInt8Cache& cache, int heads, int d) {
  KeyCal c;
  c.mean.resize(size_t(heads) * d);
  c.factor.resize(c.mean.size());
  const cuda::detail::KvInt8Rows r = cache.rows();
  RETROINFER_CUDA_CHECK(cudaMemcpy(c.mean.data(), r.k_mean, c.mean.size() * 4, cudaMemcpyDeviceToHost));
  RETROINFER_CUDA_CHECK(cudaMemcpy(c.factor.data(), r.k_factor, c.factor.size() * 4, cudaMemcpyDeviceToHost));
  return c;
}

// Keys with two loud, nearly constant channels (as Qwen2.5's k_proj bias makes), which set every raw row's scale.
void add_loud_key_channels(KvData& kv) {
  for (int h = 0; h < kv.heads; ++h)
    for (int64_t t = 0; t < kv.stride; ++t) {
      uint16_t* row = kv.k.data() + (size_t(h) * kv.stride + t) * kv.d;
      row[3] = f32_to_bf16(bf16_to_f32(row[3]) + 40.0f);
      row[kv.d - 7] = f32_to_bf16(bf16_to_f32(row[kv.d - 7]) - 25.0f);
    }
}

// The CPU reference of a KvData's rows [0, n) of every head quantised: int8 values and scales; `cal` (keys
// only): rows of (k - mean) / factor, in f32 as the kernel computes them.
struct QuantRows {
  std::vector<int8_t> q;    // [heads, stride, d]
  std::vector<float> scale;  // [heads, stride]
  const KeyCal* cal = nullptr;
  // Element i of row r (of head h) widened: q * s, then * factor + mean with a calibration.
  float widened(int h, size_t r, int d, int i) const {
    float x = float(q[r * d + i]) * scale[r];
    if (cal == nullptr) return x;
    x = x * cal->factor[size_t(h) * d + i];
    return x + cal->mean[size_t(h) * d + i];
  }
};
QuantRows quantise(const KvData& kv, const std::vector<uint16_t>& rows, int64_t n, const KeyCal* cal = nullptr) {
  QuantRows out;
  out.cal = cal;
  out.q.assign(size_t(kv.heads) * kv.stride * kv.d, 0);
  out.scale.assign(size_t(kv.heads) * kv.stride, 0.0f);
  std::vector<float> x(kv.d);
  for (int h = 0; h < kv.heads; ++h)
    for (int64_t t = 0; t < n; ++t) {
      const size_t r = size_t(h) * kv.stride + t;
      float absmax = 0.0f;
      for (int i = 0; i < kv.d; ++i) {
        x[i] = bf16_to_f32(rows[r * kv.d + i]);
        if (cal != nullptr) x[i] = (x[i] - cal->mean[size_t(h) * kv.d + i]) / cal->factor[size_t(h) * kv.d + i];
        absmax = std::max(absmax, std::fabs(x[i]));
      }
      const float inv = int8_row_inverse(absmax);
      for (int i = 0; i < kv.d; ++i) out.q[r * kv.d + i] = int8_quantize(x[i], inv);
      out.scale[r] = int8_row_scale(absmax);
    }
  return out;
}

// Exact attention in f64 of query head (h, g) over tokens [0, n) of the widened rows.
void ref_int8(const KvData& kv, const QuantRows& k, const QuantRows& v, const float* q, float scale, int h, int64_t n,
              float* out) {
  gputest::RefState st(kv.d);
  std::vector<float> vrow(kv.d);
  for (int64_t t = 0; t < n; ++t) {
    const size_t r = size_t(h) * kv.stride + t;
    double s = 0.0;
    for (int i = 0; i < kv.d; ++i) s += double(q[i]) * k.widened(h, r, kv.d, i);
    for (int i = 0; i < kv.d; ++i) vrow[i] = v.widened(h, r, kv.d, i);
    st.push(s * scale, 1.0, vrow.data(), kv.d);
  }
  st.finish(out, kv.d);
}

// fill + append + widen against int8_quantize_row / int8_widen_row, bit for bit.
TEST(CudaKvInt8, RowsMatchTheCpuQuantisation) {
  RETROINFER_REQUIRE_GPU();
  for (int d : {64, 128}) {
    SCOPED_TRACE(testing::Message() << "d=" << d);
    const int H = 3;
    const int64_t n = 301, cap = 320;
    KvData kv = gputest::make_kv(H, cap, cap, d, 11 + d);  // rows up to cap are real (append reads row n)
    add_loud_key_channels(kv);
    auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v);
    cuda::KvInt8Cache cache(H, cap, d);
    EXPECT_EQ(cache.device_bytes(), int64_t{H} * cap * (2 * d + 8) + int64_t{H} * d * 4 * 66);
    cache.fill(dk.as<uint16_t>(), dv.as<uint16_t>(), n, cap, nullptr);
    cuda::synchronize();
    // The key calibration of the n prompt rows: the f64 reference's to f32 rounding (the device sums 32 f64
    // partials rounded to f32).
    const KeyCal cal = download_calibration(cache, H, d), want_cal = reference_calibration(kv, n);
    for (size_t i = 0; i < cal.mean.size(); ++i) {
      EXPECT_NEAR(cal.mean[i], want_cal.mean[i], 1e-6 * std::max(1.0f, std::fabs(want_cal.mean[i]))) << i;
      EXPECT_NEAR(cal.factor[i], want_cal.factor[i], 1e-5 * want_cal.factor[i]) << i;
    }
    EXPECT_GT(cal.mean[3], 30.0f);  // the loud channels' offsets (+40, -25 on make_kv's centres), found
    EXPECT_LT(cal.mean[d - 7], -15.0f);
    // Row n: the appended token, from a [H, d] buffer as decode passes it.
    std::vector<uint16_t> k_new(size_t(H) * d), v_new(size_t(H) * d);
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < d; ++i) {
        k_new[size_t(h) * d + i] = kv.k[(size_t(h) * cap + n) * d + i];
        v_new[size_t(h) * d + i] = kv.v[(size_t(h) * cap + n) * d + i];
      }
    auto dkn = gputest::upload(k_new), dvn = gputest::upload(v_new);
    cache.append(dkn.as<uint16_t>(), dvn.as<uint16_t>(), n, nullptr);
    const int64_t rows = n + 1;
    cuda::DeviceBuffer wk(size_t(H) * rows * d * 2), wv(size_t(H) * rows * d * 2);
    cache.widen(0, rows, wk.as<uint16_t>(), wv.as<uint16_t>(), nullptr);
    cuda::synchronize();
    std::vector<uint16_t> got_k(size_t(H) * rows * d), got_v(got_k.size());
    wk.download(got_k.data(), got_k.size() * 2);
    wv.download(got_v.data(), got_v.size() * 2);
    const QuantRows qk = quantise(kv, kv.k, rows, &cal), qv = quantise(kv, kv.v, rows);
    int64_t diff = 0;
    double quiet_err = 0.0;  // the calibrated rows' largest error on the channels other than the loud two
    for (int h = 0; h < H; ++h)
      for (int64_t t = 0; t < rows; ++t) {
        const size_t r = size_t(h) * cap + t;
        std::vector<uint16_t> want_v(d);
        int8_widen_row(qv.q.data() + r * d, qv.scale[r], d, want_v.data());
        for (int i = 0; i < d; ++i) {
          diff += got_k[(size_t(h) * rows + t) * d + i] != f32_to_bf16(qk.widened(h, r, d, i));
          diff += got_v[(size_t(h) * rows + t) * d + i] != want_v[i];
          if (i != 3 && i != d - 7)
            quiet_err = std::max(quiet_err, double(std::fabs(qk.widened(h, r, d, i) - kv.key(h, t, i))));
        }
      }
    EXPECT_EQ(diff, 0);
    // The same rows quantised raw (row_quant.h, no calibration): the loud channels set each row's scale.
    double raw_quiet_err = 0.0;
    std::vector<int8_t> raw(d);
    for (int h = 0; h < H; ++h)
      for (int64_t t = 0; t < rows; ++t) {
        const float sc = int8_quantize_row(kv.k.data() + (size_t(h) * cap + t) * d, d, raw.data());
        for (int i = 0; i < d; ++i)
          if (i != 3 && i != d - 7)
            raw_quiet_err = std::max(raw_quiet_err, double(std::fabs(float(raw[i]) * sc - kv.key(h, t, i))));
      }
    EXPECT_LT(quiet_err * 4, raw_quiet_err) << quiet_err << " vs raw " << raw_quiet_err;
    std::printf("[cuda_kv_int8 rows] d=%d: largest error of the quiet key channels %.4f calibrated, %.4f raw\n", d,
                quiet_err, raw_quiet_err);
    // The raw int8 values and scales too.
    const cuda::detail::KvInt8Rows r = cache.rows();
    std::vector<int8_t> q8(size_t(H) * cap * d);
    std::vector<float> sc(size_t(H) * cap);
    RETROINFER_CUDA_CHECK(cudaMemcpy(q8.data(), r.k, q8.size(), cudaMemcpyDeviceToHost));
    RETROINFER_CUDA_CHECK(cudaMemcpy(sc.data(), r.k_scale, sc.size() * 4, cudaMemcpyDeviceToHost));
    int64_t qdiff = 0;
    for (int h = 0; h < H; ++h)
      for (int64_t t = 0; t < rows; ++t) {
        const size_t at = size_t(h) * cap + t;
        qdiff += sc[at] != qk.scale[at];
        for (int i = 0; i < d; ++i) qdiff += q8[at * d + i] != qk.q[at * d + i];
      }
    EXPECT_EQ(qdiff, 0);
    EXPECT_THROW(cache.append(dkn.as<uint16_t>(), dvn.as<uint16_t>(), cap, nullptr), Error);  // past the capacity
    EXPECT_THROW(cuda::KvInt8Cache(H, cap, 96), Error);                                      // head_dim 96
  }
}

// One decode of q over n int8 tokens: DenseDecoder::run_int8 against ref_int8.
void run_dense_int8(int num_seqs, int hkv, int group, int d, int64_t n, int64_t stride, uint64_t seed) {
  SCOPED_TRACE(testing::Message() << "seqs=" << num_seqs << " hkv=" << hkv << " group=" << group << " d=" << d
                                  << " n=" << n);
  const int H = num_seqs * hkv;
  KvData kv = gputest::make_kv(H, n, stride, d, seed);
  add_loud_key_channels(kv);
  auto q = gputest::make_q(kv, group, seed + 1);
  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v), dq = gputest::upload(q);
  cuda::KvInt8Cache cache(H, stride, d);
  cache.fill(dk.as<uint16_t>(), dv.as<uint16_t>(), n, stride, nullptr);
  const KeyCal cal = download_calibration(cache, H, d);
  auto dout = gputest::poisoned(q.size());
  cuda::DenseDecoder dec(AttentionShape{hkv * group, hkv, d}, num_seqs, stride);
  dec.run_int8(dq.as<float>(), cache.rows(), n, stride, 0.0f, dout.as<float>());
  cuda::synchronize();
  const auto got = gputest::download_f32(dout, q.size());
  const QuantRows qk = quantise(kv, kv.k, n, &cal), qv = quantise(kv, kv.v, n);
  std::vector<float> ref(q.size());
  const float scale = 1.0f / std::sqrt(float(d));
  for (int h = 0; h < H; ++h)
    for (int g = 0; g < group; ++g)
      ref_int8(kv, qk, qv, &q[(size_t(h) * group + g) * d], scale, h, n, &ref[(size_t(h) * group + g) * d]);
  const Compare c = gputest::compare(got, ref);
  EXPECT_EQ(c.unwritten, 0);
  EXPECT_LT(c.nmse, kNmse);
  EXPECT_LT(c.max_abs, kMaxAbs);
}

TEST(CudaKvInt8, DenseDecodeMatchesTheWidenedRows) {
  RETROINFER_REQUIRE_GPU();
  uint64_t seed = 500;
  for (int64_t n : {1, 15, 17, 64, 65, 1000}) run_dense_int8(1, 2, 4, 128, n, n + 3, seed++);
  for (int d : {64, 128})
    for (int group : {1, 4, 8}) run_dense_int8(2, 2, group, d, 3001, 3100, seed++);
  run_dense_int8(2, 8, 4, 128, 40000, 40000, seed++);
}

// Full and retro (every cluster retrieved, so exact) layers over the 8-bit KV, prefill then 150 appended
// steps with index updates every 64 (retro widens each update's block from the int8 rows), against ref_int8.
TEST(CudaKvInt8, FullAndRetroLayersDecodeTheInt8Rows) {
  RETROINFER_REQUIRE_GPU();
  const int seqs = 2, hkv = 2, group = 4, d = 128, H = seqs * hkv;
  const int64_t n0 = 2000, steps = 150, cap = n0 + steps;
  KvData kv = gputest::make_kv(H, cap, cap, d, 77);
  add_loud_key_channels(kv);
  auto dk = gputest::upload(kv.k), dv = gputest::upload(kv.v);
  const AttentionShape shape{hkv * group, hkv, d};
  AttentionConfig full;
  full.kind = AttentionKind::kFull;
  AttentionConfig retro;
  retro.kind = AttentionKind::kRetro;
  retro.sink_tokens = 4;
  retro.window_tokens = 32;
  retro.retrieval_fraction = 1.0;
  retro.estimation_fraction = 0.0;
  retro.estimation = false;
  retro.update_tokens = 64;
  retro.update_clusters = 4;
  retro.outlier_fraction = 0.01;
  auto a_full = cuda::make_layer_attention(shape, full, seqs, cap, KvTier::kGpu, {}, DType::kI8);
  auto a_retro = cuda::make_layer_attention(shape, retro, seqs, cap, KvTier::kGpu, {}, DType::kI8);
  a_full->prefill_done(dk.as<uint16_t>(), dv.as<uint16_t>(), n0, cap, nullptr);
  a_retro->prefill_done(dk.as<uint16_t>(), dv.as<uint16_t>(), n0, cap, nullptr);
  EXPECT_GE(a_full->device_bytes(), cuda::KvInt8Cache::bytes(H, cap, d));
  EXPECT_GE(a_retro->device_bytes(), cuda::KvInt8Cache::bytes(H, cap, d));
  // The layers' caches calibrate by the same n0 prompt rows: the reference rows use that calibration (a cache
  // of this shape filled alike).
  cuda::KvInt8Cache probe(H, cap, d);
  probe.fill(dk.as<uint16_t>(), dv.as<uint16_t>(), n0, cap, nullptr);
  const KeyCal cal = download_calibration(probe, H, d);
  const QuantRows qk = quantise(kv, kv.k, cap, &cal), qv = quantise(kv, kv.v, cap);
  const float scale = 1.0f / std::sqrt(float(d));
  double worst_full = 0.0, worst_retro = 0.0;
  std::vector<uint16_t> k_new(size_t(H) * d), v_new(size_t(H) * d);
  for (int64_t t = 0; t < steps; ++t) {
    const int64_t n = n0 + t + 1;
    for (int h = 0; h < H; ++h)
      for (int i = 0; i < d; ++i) {
        k_new[size_t(h) * d + i] = kv.k[(size_t(h) * cap + n - 1) * d + i];
        v_new[size_t(h) * d + i] = kv.v[(size_t(h) * cap + n - 1) * d + i];
      }
    auto dkn = gputest::upload(k_new), dvn = gputest::upload(v_new);
    const auto q = gputest::make_q(kv, group, 900 + t);
    auto dq = gputest::upload(q);
    auto of = gputest::poisoned(q.size()), orr = gputest::poisoned(q.size());
    a_full->decode(dq.as<float>(), dkn.as<uint16_t>(), dvn.as<uint16_t>(), n, of.as<float>(), nullptr);
    a_retro->decode(dq.as<float>(), dkn.as<uint16_t>(), dvn.as<uint16_t>(), n, orr.as<float>(), nullptr);
    cuda::synchronize();
    std::vector<float> ref(q.size());
    for (int h = 0; h < H; ++h)
      for (int g = 0; g < group; ++g)
        ref_int8(kv, qk, qv, &q[(size_t(h) * group + g) * d], scale, h, n, &ref[(size_t(h) * group + g) * d]);
    const Compare cf = gputest::compare(gputest::download_f32(of, q.size()), ref);
    const Compare cr = gputest::compare(gputest::download_f32(orr, q.size()), ref);
    EXPECT_EQ(cf.unwritten + cr.unwritten, 0) << "step " << t;
    EXPECT_LT(cf.nmse, kNmse) << "full, step " << t;
    EXPECT_LT(cr.nmse, kNmse) << "retro, step " << t;
    EXPECT_LT(cf.max_abs, kMaxAbs) << "full, step " << t;
    EXPECT_LT(cr.max_abs, kMaxAbs) << "retro, step " << t;
    worst_full = std::max(worst_full, cf.nmse);
    worst_retro = std::max(worst_retro, cr.nmse);
  }
  std::printf("[cuda_kv_int8 layers] %d steps after %lld tokens: worst nmse full %.3e, retro (everything "
              "retrieved, 2 updates) %.3e\n",
              int(steps), (long long)n0, worst_full, worst_retro);
  // Methods and tiers without an 8-bit KV are refused.
  AttentionConfig quest;
  quest.kind = AttentionKind::kQuest;
  EXPECT_THROW(cuda::make_layer_attention(shape, quest, seqs, cap, KvTier::kGpu, {}, DType::kI8), Error);
  EXPECT_THROW(cuda::make_layer_attention(shape, retro, seqs, cap, KvTier::kHost, {}, DType::kI8), Error);
  EXPECT_THROW(cuda::make_layer_attention(shape, full, seqs, cap, KvTier::kGpu, {}, DType::kF8E4M3), Error);
}

// The session tests' model: 3 random layers of synthetic_config(128) (8 q / 2 KV heads, d 128), on the GPU.
struct SessionModel {
  ModelConfig c = [] {
    ModelConfig x = gputest::synthetic_config(128);
    x.num_layers = 3;
    x.max_position_embeddings = 4096;
    return x;
  }();
  gputest::MemoryModelFile file{c, 31};
  std::unique_ptr<Model> model = Model::load(file);
  std::unique_ptr<cuda::CudaModel> gpu = cuda::CudaModel::upload(*model, cuda::WeightType::kBf16);
};

// Sessions of a 3-layer random model (synthetic_config(128): 8 q / 2 KV heads, d 128): int8 against bf16 for
// full and retro, two prompts of 3000 tokens, 16 decode steps fed with bf16's greedy tokens.
TEST(CudaKvInt8, SessionsFollowTheBf16Ones) {
  RETROINFER_REQUIRE_GPU();
  const SessionModel sm;
  const ModelConfig& c = sm.c;
  cuda::CudaModel* const gm = sm.gpu.get();
  const int64_t vocab = c.vocab_size;
  std::vector<std::vector<int32_t>> prompts = {gputest::random_tokens(3000, c.vocab_size, 5),
                                               gputest::random_tokens(3000, c.vocab_size, 6)};
  constexpr int kSteps = 16;
  for (AttentionKind kind : {AttentionKind::kFull, AttentionKind::kRetro}) {
    SCOPED_TRACE(attention_kind_name(kind));
    cuda::CudaSessionOptions o;
    o.attention.kind = kind;
    o.max_context = 4096;
    o.prefill_chunk = 1024;
    cuda::CudaSession ref(*gm, o, 2);
    o.kv_dtype = DType::kI8;
    cuda::CudaSession s8(*gm, o, 2);
    EXPECT_LT(s8.memory_plan().gpu_bytes, ref.memory_plan().gpu_bytes);
    const std::vector<float> p_ref = ref.prefill(prompts);
    const std::vector<float> p8 = s8.prefill(prompts);
    double prefill_rel = 0.0;
    for (int q = 0; q < 2; ++q)
      prefill_rel = std::max(prefill_rel, gputest::row_error(p8.data() + q * vocab, p_ref.data() + q * vocab, vocab).rel);
    EXPECT_LE(prefill_rel, 1e-6);
    std::vector<int32_t> cur(2);
    for (int q = 0; q < 2; ++q) cur[q] = argmax(std::span<const float>(p_ref.data() + q * vocab, vocab));
    std::vector<float> lr(2 * vocab), l8(2 * vocab);
    double worst = 0.0;
    int checked = 0, equal = 0;
    for (int i = 0; i < kSteps; ++i) {
      ref.decode(cur, lr);
      s8.decode(cur, l8);
      for (int q = 0; q < 2; ++q) {
        const auto e = gputest::row_error(l8.data() + q * vocab, lr.data() + q * vocab, vocab);
        worst = std::max(worst, e.rel);
        EXPECT_LE(e.rel, 0.5) << "step " << i << " sequence " << q;
        const std::vector<float> want(lr.begin() + q * vocab, lr.begin() + (q + 1) * vocab);
        const int32_t b = argmax(std::span<const float>(want));
        if (gputest::top2_margin_rel(want) > 0.1) {
          ++checked;
          const int32_t a = argmax(std::span<const float>(l8.data() + q * vocab, vocab));
          equal += a == b;
          if (kind == AttentionKind::kFull) {
            EXPECT_EQ(a, b) << "step " << i << " sequence " << q;
          }
        }
        cur[q] = b;
      }
    }
    EXPECT_GE(checked, 5);
    EXPECT_GE(equal * 5, checked * 4);  // >= 80% (every one for full, checked above)
    EXPECT_EQ(s8.positions(), (std::vector<int64_t>{3000 + kSteps, 3000 + kSteps}));
    std::printf("[cuda_kv_int8 session] %s: GPU plan %.1f MiB int8 vs %.1f MiB bf16; prefill logits max rel "
                "%.2e; %d decode steps max rel %.3e, greedy %d/%d equal\n",
                std::string(attention_kind_name(kind)).c_str(), s8.memory_plan().gpu_bytes / 1048576.0,
                ref.memory_plan().gpu_bytes / 1048576.0, prefill_rel, kSteps, worst, equal, checked);
    EXPECT_THROW(s8.fork(o.attention), Error);  // the layers own their int8 KV
    EXPECT_FALSE(s8.supports_prefix());
  }
  // Continuous batching: two one-sequence int8 sessions (different lengths) in one joined step equal each
  // decoding alone, up to the tuned products' rounding per row count (test_cuda_joined.cpp's bf16 bound, 3e-2).
  {
    cuda::CudaSessionOptions o;
    o.attention.kind = AttentionKind::kRetro;
    o.max_context = 4096;
    o.kv_dtype = DType::kI8;
    cuda::CudaSession a(*gm, o, 1), b(*gm, o, 1), a_alone(*gm, o, 1), b_alone(*gm, o, 1);
    const std::vector<std::vector<int32_t>> pa = {prompts[0]}, pb = {std::vector<int32_t>(prompts[1].begin(),
                                                                                          prompts[1].begin() + 2100)};
    a.prefill(pa);
    a_alone.prefill(pa);
    b.prefill(pb);
    b_alone.prefill(pb);
    cuda::CudaJoinedDecoder dec(*gm);
    ASSERT_TRUE(dec.takes(a) && dec.takes(b));
    std::vector<cuda::CudaSession*> both = {&a, &b};
    std::vector<int32_t> tk = {7, 11};
    std::vector<float> joined(2 * vocab), la(vocab), lb(vocab);
    double worst = 0.0;
    for (int i = 0; i < 4; ++i) {
      dec.decode(both, tk, joined);
      a_alone.decode(std::vector<int32_t>{tk[0]}, la);
      b_alone.decode(std::vector<int32_t>{tk[1]}, lb);
      worst = std::max({worst, gputest::row_error(joined.data(), la.data(), vocab).rel,
                        gputest::row_error(joined.data() + vocab, lb.data(), vocab).rel});
      tk = {argmax(std::span<const float>(la)), argmax(std::span<const float>(lb))};
    }
    EXPECT_LE(worst, 3e-2);
    std::printf("[cuda_kv_int8 joined] 2 int8 retro sessions (3000 / 2100 tokens), 4 joined steps: max rel %.3e "
                "against each alone\n", worst);
  }
  cuda::CudaSessionOptions bad;
  bad.max_context = 4096;
  bad.kv_dtype = DType::kI8;
  bad.attention.kind = AttentionKind::kQuest;
  EXPECT_THROW(cuda::CudaSession(*gm, bad, 1), Error);
  bad.attention.kind = AttentionKind::kRetro;
  bad.placement = KvPlacement::kHost;
  EXPECT_THROW(cuda::CudaSession(*gm, bad, 1), Error);
  bad.placement = KvPlacement::kGpu;
  bad.attention.layer_budget_queries = 16;
  EXPECT_THROW(cuda::CudaSession(*gm, bad, 1), Error);
}

// Prompts of 1 and 6 tokens: the key calibration comes from a handful of keys (one key: its mean is that key and
// every factor 1; a few: the factors floored at 1/100 of the head's largest deviation), and 48 decode steps past
// the prompt, whose keys were never seen by the calibration, follow bf16 within the long prompts' bounds (full
// attention: greedy tokens equal wherever bf16's top-2 margin exceeds 10%).
TEST(CudaKvInt8, ShortPromptsFollowTheBf16Ones) {
  RETROINFER_REQUIRE_GPU();
  const SessionModel sm;
  const ModelConfig& c = sm.c;
  cuda::CudaModel* const gm = sm.gpu.get();
  const int64_t vocab = c.vocab_size;
  constexpr int kSteps = 48;
  for (int len : {1, 6}) {
    SCOPED_TRACE(testing::Message() << "prompt of " << len);
    cuda::CudaSessionOptions o;
    o.attention.kind = AttentionKind::kFull;
    o.max_context = 256;
    cuda::CudaSession ref(*gm, o, 1);
    o.kv_dtype = DType::kI8;
    cuda::CudaSession s8(*gm, o, 1);
    const std::vector<std::vector<int32_t>> prompt = {gputest::random_tokens(len, c.vocab_size, 40 + len)};
    const std::vector<float> p_ref = ref.prefill(prompt);
    s8.prefill(prompt);
    std::vector<int32_t> cur = {argmax(std::span<const float>(p_ref.data(), vocab))};
    std::vector<float> lr(vocab), l8(vocab);
    double worst = 0.0;
    int checked = 0;
    for (int i = 0; i < kSteps; ++i) {
      ref.decode(cur, lr);
      s8.decode(cur, l8);
      const auto e = gputest::row_error(l8.data(), lr.data(), vocab);
      worst = std::max(worst, e.rel);
      EXPECT_LE(e.rel, 0.5) << "step " << i;
      const int32_t b = argmax(std::span<const float>(lr));
      if (gputest::top2_margin_rel(lr) > 0.1) {
        ++checked;
        EXPECT_EQ(argmax(std::span<const float>(l8)), b) << "step " << i;
      }
      cur = {b};
    }
    EXPECT_GE(checked, 5);
    std::printf("[cuda_kv_int8 short prompt] %d tokens then %d steps: max rel %.3e, %d clear-margin tokens "
                "checked\n", len, kSteps, worst, checked);
  }
}

}  // namespace
}  // namespace retroinfer
