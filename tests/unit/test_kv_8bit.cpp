// The 8-bit KV caches (`--kv-dtype int8 | fp8`: src/core/row_quant.h, src/core/fp8_row.h): the e4m3 codec
// against a brute-force nearest-code search, both row formats' scales and error bounds, KvCache's 8-bit rows,
// exact attention over them equal to exact attention over the widened rows in f32, a session's logits near the
// f32 cache's, snapshots of 8-bit sessions, the memory estimate, and the eval methods' ":kv_dtype=" override.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <limits>
#include <random>
#include <unistd.h>
#include <vector>

#include "core/fp8_row.h"
#include "core/row_quant.h"
#include "core/simd.h"
#include "eval/eval_runner.h"
#include "retroinfer/attention.h"
#include "retroinfer/engine_model.h"
#include "retroinfer/error.h"
#include "retroinfer/generate.h"
#include "retroinfer/key_calibration_store.h"
#include "retroinfer/kv_cache.h"
#include "retroinfer/model.h"
#include "retroinfer/snapshot.h"

#include "error_of.h"
#include "tiny_model_util.h"

namespace retroinfer {
namespace {

bool nan_code(int c) { return (c & 0x7f) == 0x7f; }

TEST(Fp8Codec, EveryFiniteCodeRoundTripsAndValuesAscend) {
  float prev = -1.0f;
  for (int c = 0; c < 0x7f; ++c) {  // the positive codes in order: strictly increasing values
    const float v = fp8_e4m3_to_f32(static_cast<uint8_t>(c));
    EXPECT_GT(v, prev) << c;
    prev = v;
    EXPECT_EQ(f32_to_fp8_e4m3(v), c) << c;
    EXPECT_EQ(f32_to_fp8_e4m3(-v), c | 0x80) << c;  // -0 keeps its sign code
    EXPECT_EQ(fp8_e4m3_to_f32(static_cast<uint8_t>(c | 0x80)), -v) << c;
  }
  EXPECT_EQ(fp8_e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_to_f32(0x08), 0x1p-6f);  // smallest normal
  EXPECT_EQ(fp8_e4m3_to_f32(0x01), 0x1p-9f);  // smallest subnormal
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0x7f)));
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_f32(0xff)));
}

TEST(Fp8Codec, RoundsToTheNearestCodeTiesToEvenAndSaturates) {
  // Brute force: the nearest finite code by value, ties to the even code.
  std::vector<float> vals;
  for (int c = 0; c < 0x7f; ++c) vals.push_back(fp8_e4m3_to_f32(static_cast<uint8_t>(c)));
  auto nearest = [&](float x) {
    const float a = std::fabs(x);
    int best = 0;
    for (int c = 1; c < 0x7f; ++c) {
      const float d = std::fabs(vals[c] - a), db = std::fabs(vals[best] - a);
      if (d < db || (d == db && (c & 1) == 0)) best = c;
    }
    if (a > 448.0f) best = 0x7e;  // saturation
    return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
  };
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> exp_u(-12.0f, 10.0f);
  for (int i = 0; i < 20000; ++i) {
    const float x = std::ldexp(1.0f, 0) * std::exp2(exp_u(rng)) * (i % 2 ? -1.0f : 1.0f);
    ASSERT_EQ(f32_to_fp8_e4m3(x), nearest(x)) << x;
  }
  // Every midpoint between neighbours: ties go to the even code.
  for (int c = 0; c + 1 < 0x7f; ++c) {
    const float mid = 0.5f * (vals[c] + vals[c + 1]);
    EXPECT_EQ(f32_to_fp8_e4m3(mid), (c & 1) == 0 ? c : c + 1) << "between codes " << c << " and " << c + 1;
  }
  EXPECT_EQ(f32_to_fp8_e4m3(464.0f), 0x7e);  // the midpoint to the (NaN) code above rounds to even: 448
  EXPECT_EQ(f32_to_fp8_e4m3(465.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_fp8_e4m3(-INFINITY), 0xfe);
  EXPECT_TRUE(nan_code(f32_to_fp8_e4m3(NAN)));
  EXPECT_EQ(f32_to_fp8_e4m3(0x1p-11f), 0x00);  // under half the smallest subnormal
}

TEST(Fp8Row, ScaleIsTheSmallestPowerOfTwoThatFitsTheRow) {
  EXPECT_EQ(fp8_row_scale(0.0f), 0.0f);
  EXPECT_EQ(fp8_row_scale(448.0f), 1.0f);
  EXPECT_EQ(fp8_row_scale(449.0f), 2.0f);
  EXPECT_EQ(fp8_row_scale(224.0f), 0.5f);
  EXPECT_EQ(fp8_row_scale(224.5f), 1.0f);
  EXPECT_EQ(fp8_row_scale(3.5f), 0x1p-7f);  // 448 * 2^-7 = 3.5
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-30.0f, 30.0f);
  for (int i = 0; i < 10000; ++i) {
    const float a = std::exp2(u(rng));
    const float s = fp8_row_scale(a);
    ASSERT_LE(a, 448.0f * s) << a;
    ASSERT_GT(a, 224.0f * s) << a;  // half the scale would not do
    int e;
    ASSERT_EQ(std::frexp(s, &e), 0.5f) << "a power of two";
  }
}

// Row `trial` of d values for the error tests: Gaussian at magnitude 2^(trial % 40 - 20), one outlier channel
// 300 times that, and in every seventh row one zero.
std::vector<float> test_row(std::mt19937& rng, int d, int trial) {
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(d);
  const float mag = std::exp2(static_cast<float>(trial % 40) - 20.0f);
  for (float& v : x) v = nd(rng) * mag;
  x[trial % d] *= 300.0f;
  if (trial % 7 == 0) x[(trial + 1) % d] = 0.0f;
  return x;
}

TEST(Fp8Row, ErrorWithinTheBoundAndWideningMatchesTheCodec) {
  std::mt19937 rng(5);
  for (int d : {8, 64, 128}) {
    for (int trial = 0; trial < 200; ++trial) {
      const std::vector<float> x = test_row(rng, d, trial);
      std::vector<uint8_t> row(stored_row_bytes(DType::kF8E4M3, d));
      fp8_quantize_row(x.data(), d, row.data());
      const float s = stored_row_scale(row.data(), d);
      std::vector<float> w(d);
      fp8_widen_row(row.data(), d, w.data());
      for (int i = 0; i < d; ++i) {
        ASSERT_EQ(w[i], fp8_e4m3_to_f32(row[i]) * s) << i;
        ASSERT_FALSE(nan_code(row[i]));
        const float bound = std::fabs(x[i]) / s >= 0x1p-6f ? std::ldexp(std::fabs(x[i]), -4) : std::ldexp(s, -10);
        ASSERT_LE(std::fabs(x[i] - w[i]), bound) << "d " << d << " trial " << trial << " element " << i;
      }
    }
  }
  std::vector<float> zeros(64, 0.0f), w(64, 1.0f);
  std::vector<uint8_t> row(stored_row_bytes(DType::kF8E4M3, 64));
  fp8_quantize_row(zeros.data(), 64, row.data());
  fp8_widen_row(row.data(), 64, w.data());
  for (float v : w) EXPECT_EQ(v, 0.0f);
}

TEST(Int8KvRow, ErrorWithinTheBoundAndScaleBehindTheValues) {
  std::mt19937 rng(6);
  for (int d : {8, 64, 128}) {
    for (int trial = 0; trial < 200; ++trial) {
      const std::vector<float> x = test_row(rng, d, trial);
      std::vector<uint8_t> row(stored_row_bytes(DType::kI8, d));
      int8_quantize_kv_row(x.data(), d, row.data());
      float absmax = 0.0f;
      for (float v : x) absmax = std::max(absmax, std::fabs(v));
      const float s = stored_row_scale(row.data(), d);
      ASSERT_EQ(s, absmax / 127.0f);
      std::vector<float> w(d);
      int8_widen_kv_row(row.data(), d, w.data());
      for (int i = 0; i < d; ++i) {
        const int q = static_cast<int8_t>(row[i]);
        ASSERT_GE(q, -127);
        ASSERT_EQ(w[i], static_cast<float>(q) * s);
        ASSERT_LE(std::fabs(x[i] - w[i]), s * (0.5f + 0x1p-15f) + std::fabs(w[i]) * 0x1p-24f) << i;
      }
    }
  }
}

// Fills an 8-bit cache and an f32 cache holding the 8-bit cache's widened rows.
void fill_pair(KvCache& q8, KvCache& widened, int64_t n, uint32_t seed) {
  const int h = q8.num_heads_kv(), d = q8.head_dim();
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(static_cast<size_t>(n) * h * d), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = nd(rng) * (i % d == 3 ? 40.0f : 2.0f);  // a key outlier channel
    v[i] = nd(rng) * 0.05f;
  }
  q8.append(k.data(), v.data(), n);
  std::vector<float> kw(k.size()), vw(v.size());
  for (int64_t t = 0; t < n; ++t)
    for (int hh = 0; hh < h; ++hh) {
      q8.load_key(hh, t, &kw[(t * h + hh) * d]);
      q8.load_value(hh, t, &vw[(t * h + hh) * d]);
    }
  widened.append(kw.data(), vw.data(), n);
}

// A key calibration of h heads x d: means and factors of the rows fill_pair writes (channel 3 of every head at
// 40 N(0, 1) + 25, the others 2 N(0, 1)), as Model::key_calibration computes them from a prefill's keys.
KeyCalibration pair_calibration(int h, int d) {
  KeyCalibration c;
  for (int hh = 0; hh < h; ++hh)
    for (int i = 0; i < d; ++i) {
      c.mean.push_back(i == 3 ? 25.0f : 0.0f);
      c.factor.push_back(std::sqrt(i == 3 ? 160.0f : 8.0f));
    }
  return c;
}

// key_channel_statistics: the channel means, sqrt(max |k - mean|) factors, and 1 for a channel that never varies
// or whose spread is not finite; no rows is an error.
TEST(KeyChannelStatistics, MeansFactorsAndFlatChannels) {
  const float inf = std::numeric_limits<float>::infinity();
  // 3 rows x 4 channels: a spread channel, a shifted one, a constant one, one holding an infinity.
  const std::vector<float> rows = {1.0f, 10.0f, 7.0f, 0.0f,  //
                                   3.0f, 12.0f, 7.0f, inf,   //
                                   8.0f, 14.0f, 7.0f, 0.0f};
  std::vector<float> mean(4), factor(4);
  key_channel_statistics(rows.data(), 3, 4, mean.data(), factor.data());
  EXPECT_FLOAT_EQ(mean[0], 4.0f);
  EXPECT_FLOAT_EQ(factor[0], std::sqrt(4.0f));  // max |k - 4| = 4 (row 3)
  EXPECT_FLOAT_EQ(mean[1], 12.0f);
  EXPECT_FLOAT_EQ(factor[1], std::sqrt(2.0f));
  EXPECT_FLOAT_EQ(mean[2], 7.0f);
  EXPECT_EQ(factor[2], 1.0f);
  EXPECT_EQ(factor[3], 1.0f);
  EXPECT_THROW(key_channel_statistics(rows.data(), 0, 4, mean.data(), factor.data()), Error);
}

class Kv8Bit : public testing::TestWithParam<DType> {};

// A calibration shape other than the cache's, a factor <= 0 and a calibration of 16-bit storage are refused.
TEST_P(Kv8Bit, KeyCalibrationIsCheckedAgainstTheCache) {
  const KeyCalibration good = pair_calibration(2, 64);
  EXPECT_NO_THROW(KvCache(2, 64, GetParam(), &good));
  const KeyCalibration small = pair_calibration(1, 64);
  EXPECT_NE(test::error_of([&] { KvCache(2, 64, GetParam(), &small); }).find("not 128"), std::string::npos);
  KeyCalibration zero = good;
  zero.factor[5] = 0.0f;
  EXPECT_THROW(KvCache(2, 64, GetParam(), &zero), Error);
  EXPECT_THROW(KvCache(2, 64, DType::kBF16, &good), Error);
}

// Keys with a loud near-constant channel (a key bias): rows relative to the calibration lose a fraction of the
// raw rows' error (int8: on the quiet channels, whose steps the loud one sets in a raw row; fp8: on the loud
// channel, of which the mean leaves only the variation); values are stored as they are.
TEST_P(Kv8Bit, CalibratedKeysKeepTheQuietChannels) {
  const int h = 2, d = 64, n = 200;
  const KeyCalibration cal = pair_calibration(h, d);
  KvCache raw(h, d, GetParam()), calibrated(h, d, GetParam(), &cal);
  EXPECT_EQ(calibrated.key_calibration(), &cal);
  EXPECT_EQ(calibrated.key_mean(1), cal.mean.data() + d);
  EXPECT_EQ(raw.key_mean(0), nullptr);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> k(size_t(n) * h * d), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    k[i] = i % d == 3 ? 25.0f + 40.0f * nd(rng) * 0.1f : 2.0f * nd(rng);
    v[i] = nd(rng);
  }
  raw.append(k.data(), v.data(), n);
  calibrated.append(k.data(), v.data(), n);
  std::vector<float> a(d), b(d), q(d);
  for (int i = 0; i < d; ++i) q[i] = std::cos(0.7f * i);
  double err_raw = 0.0, err_cal = 0.0, loud_raw = 0.0, loud_cal = 0.0;  // quiet channels, channel 3
  for (int hh = 0; hh < h; ++hh)
    for (int t = 0; t < n; ++t) {
      const float* x = &k[(size_t(t) * h + hh) * d];
      raw.load_key(hh, t, a.data());
      calibrated.load_key(hh, t, b.data());
      for (int i = 0; i < d; ++i) {
        (i == 3 ? loud_raw : err_raw) += (a[i] - x[i]) * (a[i] - x[i]);
        (i == 3 ? loud_cal : err_cal) += (b[i] - x[i]) * (b[i] - x[i]);
      }
      double dot = 0.0;
      for (int i = 0; i < d; ++i) dot += double(q[i]) * b[i];
      EXPECT_NEAR(calibrated.dot_key(hh, t, q.data()), dot, 1e-4 * (1.0 + std::fabs(dot)));
      raw.load_value(hh, t, a.data());
      calibrated.load_value(hh, t, b.data());
      for (int i = 0; i < d; ++i) ASSERT_EQ(a[i], b[i]);
    }
  // Measured: int8 error energy 0.15 of raw's (fp8, whose steps are relative, 0.3); raw rows spend their 255 steps
  // on +-27 where the quiet channels span +-6.
  // Measured (squared error summed over the rows; quiet / loud): int8 3.5 / 1.2 against raw rows' 84 / 0 (raw rows
  // spend their 255 steps on the loud channel's +-37 where the quiet ones span +-6); fp8, whose steps are relative
  // to each value, 71 / 4.0 against 70 / 145 (the mean leaves the loud channel only its variation).
  EXPECT_LT(err_cal, 0.1 * err_raw + (GetParam() == DType::kF8E4M3 ? 1.1 * err_raw : 0.0)) << err_cal << " vs " << err_raw;
  EXPECT_LT(err_cal + loud_cal, 0.5 * (err_raw + loud_raw)) << "every channel";
}

TEST_P(Kv8Bit, RowsAccessorsAndBytes) {
  KvCache kv(2, 64, GetParam()), wide(2, 64, DType::kF32);
  EXPECT_EQ(kv.row_bytes(), 68);
  EXPECT_EQ(stored_row_bytes(GetParam(), 128), 132);
  fill_pair(kv, wide, 50, 9);
  ASSERT_EQ(kv.size(), 50);
  std::vector<float> q(64), acc(64, 0.0f), ref(64, 0.0f), row(64);
  for (int i = 0; i < 64; ++i) q[i] = std::sin(0.3f * i);
  for (int h = 0; h < 2; ++h)
    for (int64_t t = 0; t < 50; ++t) {
      EXPECT_FLOAT_EQ(kv.dot_key(h, t, q.data()), wide.dot_key(h, t, q.data()));
      kv.axpy_value(h, t, 0.7f, acc.data());
      wide.axpy_value(h, t, 0.7f, ref.data());
      kv.load_value(h, t, row.data());
      for (int i = 0; i < 64; ++i) ASSERT_EQ(row[i], static_cast<const float*>(wide.value_row(h, t))[i]);
    }
  for (int i = 0; i < 64; ++i) EXPECT_EQ(acc[i], ref[i]) << i;
  EXPECT_THROW(KvCache(2, 64, DType::kF16), Error);
}

TEST_P(Kv8Bit, ExactAttentionEqualsTheWidenedRowsInF32) {
  for (int d : {64, 128, 40})
   for (bool calibrated : {false, true}) {
    SCOPED_TRACE(testing::Message() << "head_dim " << d << (calibrated ? ", calibrated keys" : ""));
    const AttentionShape shape{8, 2, d};
    const KeyCalibration cal = pair_calibration(2, d);
    KvCache kv(2, d, GetParam(), calibrated ? &cal : nullptr), wide(2, d, DType::kF32);
    fill_pair(kv, wide, 300, 21 + d);
    std::vector<float> q(8 * d), a(8 * d), b(8 * d);
    std::mt19937 rng(d);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    for (float& x : q) x = nd(rng);
    AttentionConfig cfg;
    cfg.kind = AttentionKind::kFull;
    make_attention(cfg, shape)->decode(kv, q.data(), a.data());
    make_attention(cfg, shape)->decode(wide, q.data(), b.data());
    // The same arithmetic once widened; calibrated keys are scored as (q * factor) . y + q . mean instead of
    // q . (y * factor + mean), the same to f32 rounding. On a processor with AVX-512, f32 rows of head_dim 64 / 128
    // take the AVX-512 block (exact_avx512.cpp), whose sums are added in another tree than the portable block's
    // that 8-bit rows take: the same to f32 rounding there too.
    const bool same_block = (d != 64 && d != 128) || !core::cpu_has_avx512();
    for (int i = 0; i < 8 * d; ++i) {
      if (calibrated || !same_block) ASSERT_NEAR(a[i], b[i], 1e-5f * (1.0f + std::fabs(b[i]))) << i;
      else ASSERT_EQ(a[i], b[i]) << i;
    }
    // Retro over both: the index is built from the same widened keys, so the outputs agree too.
    cfg.kind = AttentionKind::kRetro;
    cfg.window_tokens = 16;
    cfg.tokens_per_cluster = 8;
    auto ra = make_attention(cfg, shape), rb = make_attention(cfg, shape);
    ra->on_prefill(kv);
    rb->on_prefill(wide);
    ra->decode(kv, q.data(), a.data());
    rb->decode(wide, q.data(), b.data());
    for (int i = 0; i < 8 * d; ++i) ASSERT_NEAR(a[i], b[i], 1e-5f * (1.0f + std::fabs(b[i]))) << i;
  }
}

TEST_P(Kv8Bit, SessionLogitsStayNearTheF32CacheAndSnapshotsRoundTrip) {
  const DType dt = GetParam();
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const std::vector<int32_t> prompt = test::token_stream(200, 8);
  // Relative L2 distance of two logit rows.
  const auto rel = [](const std::vector<float>& x, const std::vector<float>& y) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < x.size(); ++i) {
      num += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
      den += static_cast<double>(y[i]) * y[i];
    }
    return std::sqrt(num / den);
  };
  for (AttentionKind kind : {AttentionKind::kFull, AttentionKind::kRetro}) {
    SCOPED_TRACE(testing::Message() << "method " << attention_kind_name(kind));
    Session f32(*m, test::tiny_session_options(kind, DType::kF32)), bf16(*m, test::tiny_session_options(kind, DType::kBF16)),
        q8(*m, test::tiny_session_options(kind, dt));
    std::vector<float> a = f32.prefill(prompt), b = q8.prefill(prompt);
    // The prefill's logits against bf16's rounding (this random model amplifies K/V rounding; measured: bf16
    // 2.7e-3, int8's absmax / 254 steps on unit-Gaussian rows 6.5e-3, fp8's 4 significant bits 3.4e-2); a broken
    // widening or scale gives O(1), a cache that does not round at all 0.
    const double bf16_err = rel(bf16.prefill(prompt), a), err = rel(b, a);
    EXPECT_GT(err, 1.2 * bf16_err);
    EXPECT_LT(err, 40.0 * bf16_err);
    for (int step = 0; step < 8; ++step) {
      const int32_t next = argmax(a);
      f32.decode(next, a);
      q8.decode(next, b);
      for (float x : b) ASSERT_TRUE(std::isfinite(x));
      // Full decode stays as near; retro's selection may pick other clusters over the rounded keys (its
      // own path over fp8 rows is checked exactly in Kv8Bit.ExactAttentionEqualsTheWidenedRowsInF32).
      if (kind == AttentionKind::kFull) {
        EXPECT_LT(rel(b, a), 0.2) << "step " << step;
      }
    }
  }
  // A snapshot of an 8-bit session loads into sessions of its dtype (same greedy tokens as a cold prefill) and is refused
  // by an f32 one, saying so.
  const EngineModel engine(*m);
  const ModelIdentity id = model_identity(*m, nullptr);
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("retroinfer_kv8_" + std::string(dtype_name(dt)) + "_" + std::to_string(::getpid()) + ".snapshot")).string();
  const SessionOptions so = test::tiny_session_options(AttentionKind::kRetro, dt);
  {
    Session s(*m, so);
    s.prefill(prompt);
    save_snapshot(path, make_snapshot(s, prompt, id));
  }
  const Snapshot snap = load_snapshot(path);
  std::filesystem::remove(path);
  EXPECT_EQ(snap.context.blocks.at(0)->dtype, dt);
  check_snapshot(snap, id, so.kv_dtype, so.attention, "kv8.snapshot");
  std::vector<int32_t> longer = prompt;
  for (int32_t t : test::token_stream(12, 3)) longer.push_back(t);
  GenerateOptions g;
  g.max_new_tokens = 8;
  g.ignore_eos = true;
  const GenerateSummary cold = generate(engine, so, longer, g);
  const GenerateSummary warm = generate(engine, so, longer, g, {}, nullptr, &snap.context);
  EXPECT_EQ(warm.tokens, cold.tokens);
  EXPECT_EQ(warm.reused_tokens, 200);
  const std::string why = test::error_of([&] {
    check_snapshot(snap, id, DType::kF32, so.attention, "kv8.snapshot");
  });
  EXPECT_NE(why.find(std::string(dtype_name(dt))), std::string::npos) << why;
}

// The model's key calibration: one per layer, of its KV heads x head_dim, factors > 0; the same when the model is
// loaded again (a fixed token generator); every 8-bit session's caches use it, f32 ones none.
TEST(Kv8BitSession, ModelKeyCalibrationIsFixedAndUsedBy8BitSessions) {
  const Model* m = test::tiny_llama3();
  if (!m) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const ModelConfig& c = m->config();
  const std::vector<KeyCalibration>& cal = m->key_calibration();
  ASSERT_EQ(static_cast<int>(cal.size()), c.num_layers);
  for (const KeyCalibration& k : cal) {
    ASSERT_EQ(k.mean.size(), size_t(c.num_heads_kv) * c.head_dim);
    ASSERT_EQ(k.factor.size(), k.mean.size());
    for (float f : k.factor) ASSERT_TRUE(f > 0.0f && std::isfinite(f));
    for (float x : k.mean) ASSERT_TRUE(std::isfinite(x));
  }
  EXPECT_EQ(&m->key_calibration(), &cal);  // computed once
  const auto again = Model::load(std::string(RETROINFER_TEST_DATA) + "/models/tiny-llama3");
  const std::vector<KeyCalibration>& cal2 = again->key_calibration();
  for (size_t l = 0; l < cal.size(); ++l) {
    EXPECT_EQ(cal2[l].mean, cal[l].mean) << "layer " << l;
    EXPECT_EQ(cal2[l].factor, cal[l].factor) << "layer " << l;
  }
  Session q8(*m, test::tiny_session_options(AttentionKind::kFull, DType::kI8));
  Session f32(*m, test::tiny_session_options(AttentionKind::kFull, DType::kF32));
  for (int l = 0; l < c.num_layers; ++l) {
    EXPECT_EQ(q8.kv(l).key_calibration(), &cal[size_t(l)]);
    EXPECT_EQ(f32.kv(l).key_calibration(), nullptr);
  }
  // A fork shares them.
  q8.prefill(test::token_stream(40, 2));
  EXPECT_EQ(q8.fork(q8.options().attention)->kv(0).key_calibration(), &cal[0]);
}

INSTANTIATE_TEST_SUITE_P(Int8AndFp8, Kv8Bit, testing::Values(DType::kI8, DType::kF8E4M3),
                         [](const testing::TestParamInfo<DType>& i) { return std::string(dtype_name(i.param)); });

TEST(Kv8BitSession, MemoryEstimateCountsTheRowScales) {
  ModelConfig c;
  c.hidden_size = 896;
  c.num_heads_q = 14;
  c.num_heads_kv = 2;
  c.head_dim = 64;
  c.num_layers = 24;
  c.intermediate_size = 4864;
  c.vocab_size = 1000;
  const int64_t ctx = 32768;
  EXPECT_EQ(estimate_memory(c, ctx, DType::kF8E4M3, 512).kv_bytes, 2LL * 24 * 2 * (64 + 4) * ctx);
  EXPECT_EQ(estimate_memory(c, ctx, DType::kI8, 512).kv_bytes, 2LL * 24 * 2 * (64 + 4) * ctx);
  EXPECT_EQ(estimate_memory(c, ctx, DType::kBF16, 512).kv_bytes, 2LL * 24 * 2 * 128 * ctx);
}

TEST(Kv8BitEval, MethodKvDtypeOverride) {
  EXPECT_EQ(eval::method_kv_dtype("retro", DType::kF32), DType::kF32);
  EXPECT_EQ(eval::method_kv_dtype("retro:kv_dtype=fp8", DType::kF32), DType::kF8E4M3);
  EXPECT_EQ(eval::method_kv_dtype("retro:kv_dtype=int8", DType::kF32), DType::kI8);
  EXPECT_EQ(eval::method_kv_dtype("full:window_tokens=64:kv_dtype=bf16", DType::kF32), DType::kBF16);
  const AttentionConfig base;
  const AttentionConfig c = eval::method_config("retro:kv_dtype=fp8:window_tokens=64", base);
  EXPECT_EQ(c.kind, AttentionKind::kRetro);
  EXPECT_EQ(c.window_tokens, 64);
  EXPECT_NE(test::error_of([] { eval::method_kv_dtype("full:kv_dtype=int3", DType::kF32); }).find("int3"),
            std::string::npos);
  EXPECT_NE(test::error_of([] { eval::method_kv_dtype("full:kv_dtype=f16", DType::kF32); }).find("not f16"),
            std::string::npos);
}

// The on-disk store of the key calibration: the first process computes and writes it, the next loads the same
// values instead of the prefill; a damaged file is ignored and rewritten; no directory, no store.
TEST(Kv8BitSession, KeyCalibrationStoreRoundTripsAndRewritesDamage) {
  namespace fs = std::filesystem;
  const std::string path = std::string(RETROINFER_TEST_DATA) + "/models/tiny-llama3";
  if (!fs::exists(path)) GTEST_SKIP() << "tests/data/models/tiny-llama3 not found";
  const fs::path dir = fs::temp_directory_path() / ("retroinfer_keycal_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  const auto first = Model::load(path);
  const KeyCalibrationLoad a = load_or_compute_key_calibration(*first, nullptr, dir.string());
  EXPECT_FALSE(a.from_disk);
  EXPECT_TRUE(a.warning.empty()) << a.warning;
  ASSERT_TRUE(fs::exists(a.file)) << a.file;
  const auto second = Model::load(path);
  const KeyCalibrationLoad b = load_or_compute_key_calibration(*second, nullptr, dir.string());
  EXPECT_TRUE(b.from_disk);
  EXPECT_EQ(b.file, a.file);
  for (size_t l = 0; l < first->key_calibration().size(); ++l) {
    EXPECT_EQ(second->key_calibration()[l].mean, first->key_calibration()[l].mean);
    EXPECT_EQ(second->key_calibration()[l].factor, first->key_calibration()[l].factor);
  }
  fs::resize_file(a.file, fs::file_size(a.file) - 9);  // truncated
  const auto third = Model::load(path);
  const KeyCalibrationLoad c = load_or_compute_key_calibration(*third, nullptr, dir.string());
  EXPECT_FALSE(c.from_disk);
  EXPECT_NE(c.warning.find("not a key calibration"), std::string::npos) << c.warning;
  EXPECT_EQ(third->key_calibration()[0].mean, first->key_calibration()[0].mean);
  const auto fourth = Model::load(path);
  EXPECT_TRUE(load_or_compute_key_calibration(*fourth, nullptr, dir.string()).from_disk);  // rewritten whole
  // A calibration of another shape is refused; one adopted after the model has one is not taken.
  EXPECT_THROW(fourth->adopt_key_calibration({}), Error);
  EXPECT_FALSE(fourth->adopt_key_calibration(first->key_calibration()));
  EXPECT_TRUE(load_or_compute_key_calibration(*Model::load(path), nullptr, "").file.empty());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace retroinfer
