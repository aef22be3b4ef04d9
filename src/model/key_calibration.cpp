// Model::key_calibration: the keys' mean and channel factors that the 8-bit KV caches store keys relative to
// (KeyCalibration, kv_cache.h; docs/model-runner.md "KV cache storage").
//
// Measured with bench/key_quant_probe on Qwen2.5-Coder-0.5B (2048-token contexts, every row rounded): int8 rows
// of the raw keys cost an attention KL of 6.9e-2 on C source; rows relative to this calibration 4.5e-4 whether
// it comes from the same text, from the Bible or from the pseudo-random tokens used here (bf16 rows: 2.8e-3, as
// bf16 keeps 8 significant bits of the large constant channels too). 512 calibration tokens give 1.5e-3, 1024
// 7.4e-4: the keys of later positions turn in their RoPE planes, so the span matters more than the text.
#include <algorithm>

#include "retroinfer/error.h"
#include "retroinfer/kv_cache.h"
#include "retroinfer/model.h"

namespace retroinfer {

namespace {

std::vector<KeyCalibration> calibrate_keys(const Model& model) {
  const ModelConfig& c = model.config();
  const int64_t max_ctx = model_max_context(c);
  const int64_t n = max_ctx > 0 ? std::min(Model::kKeyCalibrationTokens, max_ctx) : Model::kKeyCalibrationTokens;
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  uint64_t x = 0x9E3779B97F4A7C15ULL;  // xorshift64: the same tokens on every run and machine
  for (auto& t : tokens) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    t = static_cast<int32_t>(x % static_cast<uint64_t>(c.vocab_size));
  }
  SessionOptions so;
  so.attention.kind = AttentionKind::kFull;
  so.kv_dtype = DType::kF32;
  so.max_context = n;
  Session s(model, so);
  s.prefill(tokens);
  const int d = c.head_dim;
  std::vector<KeyCalibration> out(static_cast<size_t>(c.num_layers));
  std::vector<float> rows(static_cast<size_t>(n) * d);
  for (int l = 0; l < c.num_layers; ++l) {
    const KvCache& kv = s.kv(l);
    KeyCalibration& cal = out[static_cast<size_t>(l)];
    cal.mean.assign(static_cast<size_t>(c.num_heads_kv) * d, 0.0f);
    cal.factor.assign(static_cast<size_t>(c.num_heads_kv) * d, 0.0f);
    for (int h = 0; h < c.num_heads_kv; ++h) {
      for (int64_t t = 0; t < n; ++t) kv.load_key(h, t, rows.data() + static_cast<size_t>(t) * d);
      key_channel_statistics(rows.data(), n, d, cal.mean.data() + static_cast<size_t>(h) * d,
                             cal.factor.data() + static_cast<size_t>(h) * d);
    }
  }
  return out;
}

}  // namespace

bool Model::adopt_key_calibration(std::vector<KeyCalibration> calibration) const {
  const ModelConfig& c = config();
  RETROINFER_CHECK(calibration.size() == static_cast<size_t>(c.num_layers), "key calibration: ", calibration.size(),
                   " layers for a model of ", c.num_layers);
  for (const KeyCalibration& k : calibration) check_key_calibration(k, c.num_heads_kv, c.head_dim);
  bool adopted = false;
  std::call_once(key_calibration_once_, [&] {
    key_calibration_ = std::move(calibration);
    adopted = true;
  });
  return adopted;
}

const std::vector<KeyCalibration>& Model::key_calibration() const {
  std::call_once(key_calibration_once_, [this] { key_calibration_ = calibrate_keys(*this); });
  return key_calibration_;
}

}  // namespace retroinfer
