// key_quant_probe: how the wave buffer's store arithmetics (core/row_quant.h) distort a real model's attention,
// measured on the CPU with full attention over every cached key and value.
//
//   key_quant_probe --model FILE --text FILE [--tokens 2048] [--steps 8] [--all-rows]
//                   [--calib-text FILE [--calib-tokens N]] [--out FILE]
//
// Prefills the first --tokens tokens of the text, then decodes --steps more of it (teacher-forced). At every
// step, layer and query head it rounds the cached K and V rows that a host-tier store would hold (all but the
// steady zone's: the first sink_tokens and the last window_tokens of AttentionConfig's defaults stay exact)
// through each scheme and compares with the exact rows: the KL of the attention weights (exact || rounded
// keys), the RMS error of the logits q·k / sqrt(d) over the rounded rows, and the nmse of the attention output
// with both K and V rounded. --all-rows rounds the steady zone too (an 8-bit KV cache stores every row).
// Schemes:
//   int8            per-row int8 (StoreDtype::kInt8)
//   int4            int4 with a bf16 scale per 32 values (StoreDtype::kInt4)
//   int4_head_mean  int4 of the row minus its (layer, KV head)'s mean over the cached tokens, mean added back
//   int4_block_mean int4 of the row minus the mean of its 16-token block (a stand-in for a cluster centroid)
//   int8_head_mean  int8 of the row minus its (layer, KV head)'s mean over the cached tokens, mean added back
//   int8_lead_mean  the same with the mean of the first 512 rounded rows only (what a cache that quantises as
//                   the prompt's chunks arrive knows when it writes them)
//   int8_channel_scale int8 of the row divided by per-channel factors sqrt(max |k_c|) over the cached tokens,
//                   multiplied back (q·k unchanged in exact arithmetic: the factors move into q)
//   int8_v_only     bf16 keys, int8 values
//   int8_key_mean, int8_key_lead_mean, int8_key_mean_scale
//                   int8 values; keys as int8_head_mean, int8_lead_mean, or centred and then channel-scaled
//   int8_key_lead_mean_scale  int8_key_mean_scale with the mean and factors of the first 512 rounded rows
//   int8_key_calibrated       int8 values, keys relative to the model's key calibration (Model::key_calibration:
//                   what the CPU runner's 8-bit caches store; with --calib-text, the same statistics of the
//                   keys of that text's first --calib-tokens (default --tokens) tokens instead; --calib-text
//                   random: of the model calibration's token generator at another --calib-tokens)
//   fp8_key_calibrated        the same with fp8 rows (the CPU runner's --kv-dtype fp8)
//   bf16            bf16 rows (the CUDA runner's KV cache and the bf16 store)
//   fp8             e4m3 with a power-of-two scale per row (the CPU runner's --kv-dtype fp8, core/fp8_row.h)
// Full attention reads every rounded row where retro reads only the retrieved clusters' (~2% of the context)
// beside the exact steady zone, so these figures bound what a store type can do to a layer rather than predict
// the model's perplexity. One JSON line per scheme (--out, else stdout).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/fp8_row.h"
#include "core/row_quant.h"
#include "engine/model_tokenizer.h"
#include "retroinfer/error.h"
#include "retroinfer/kv_cache.h"
#include "retroinfer/model.h"
#include "retroinfer/model_file.h"

namespace {

using namespace retroinfer;

enum Scheme {
  kInt8, kInt4, kInt4HeadMean, kInt4BlockMean, kBf16, kFp8, kInt8HeadMean, kInt8LeadMean, kInt8ChannelScale,
  kInt8ValuesOnly, kInt8KeyMean, kInt8KeyLeadMean, kInt8KeyMeanScale, kInt8KeyLeadMeanScale,
  kInt8KeyCalibrated, kFp8KeyCalibrated, kSchemes
};
const char* const kSchemeNames[kSchemes] = {"int8", "int4", "int4_head_mean", "int4_block_mean", "bf16", "fp8",
                                            "int8_head_mean", "int8_lead_mean", "int8_channel_scale",
                                            "int8_v_only", "int8_key_mean", "int8_key_lead_mean",
                                            "int8_key_mean_scale", "int8_key_lead_mean_scale",
                                            "int8_key_calibrated", "fp8_key_calibrated"};
constexpr int64_t kLeadRows = 512;
constexpr int64_t kBlockTokens = 16;

// x rounded through the store's arithmetic (bf16 in, bf16 widened out), `base` subtracted before and added after.
void round_row(Scheme s, const float* x, const float* base, int d, float* out) {
  if (s == kInt8HeadMean || s == kInt8LeadMean) s = kInt8;
  if (s == kFp8) {  // from the f32 row, as the CPU runner's KV cache stores it
    std::vector<uint8_t> row(stored_row_bytes(DType::kF8E4M3, d));
    fp8_quantize_row(x, d, row.data());
    fp8_widen_row(row.data(), d, out);
    return;
  }
  std::vector<uint16_t> b(d), w(d);
  for (int i = 0; i < d; ++i) b[i] = f32_to_bf16(x[i] - (base ? base[i] : 0.0f));
  if (s == kBf16) {
    w = b;
  } else if (s == kInt8) {
    std::vector<int8_t> q(d);
    const float scale = int8_quantize_row(b.data(), d, q.data());
    int8_widen_row(q.data(), scale, d, w.data());
  } else {
    std::vector<uint8_t> q(d / 2);
    std::vector<uint16_t> sc(d / kInt4Group);
    int4_quantize_row(b.data(), d, q.data(), sc.data());
    int4_widen_row(q.data(), sc.data(), d, w.data());
  }
  for (int i = 0; i < d; ++i) out[i] = bf16_to_f32(w[i]) + (base ? base[i] : 0.0f);
}

// The mean of rows [b, e) of x [n, d].
std::vector<float> mean_of_rows(const std::vector<float>& x, int64_t b, int64_t e, int d) {
  std::vector<float> mean(d, 0.0f);
  for (int64_t t = b; t < e; ++t)
    for (int i = 0; i < d; ++i) mean[i] += x[size_t(t) * d + i] / float(e - b);
  return mean;
}

// A KV head's key mean and channel factors ([d] each), as KeyCalibration holds them per head.
struct KeyTransform {
  std::vector<float> mean, factor;
};

// The mean of x's rows [b, e) and the channel factors sqrt(max |x - mean|) (1 where that is 0): the statistics
// Model::key_calibration takes (key_channel_statistics).
KeyTransform key_transform(const std::vector<float>& x, int64_t b, int64_t e, int d);

// Rows [n, d] with rows [b, e) rounded through scheme s, the rest exact. The mean schemes take their mean
// over [b, e) (the head's), its first kLeadRows rows, or each kBlockTokens-row block from b on. `keys`: the rows
// are keys (int8_v_only keeps them in bf16); `calibrated`: the head's transform of int8_key_calibrated.
std::vector<float> round_rows(Scheme s, const std::vector<float>& x, int64_t b, int64_t e, int d, bool keys,
                              const KeyTransform& calibrated) {
  std::vector<float> out(x);
  if (s == kInt8ValuesOnly) s = keys ? kBf16 : kInt8;
  if (s == kInt8KeyMean) s = keys ? kInt8HeadMean : kInt8;
  if (s == kInt8KeyLeadMean) s = keys ? kInt8LeadMean : kInt8;
  if ((s == kInt8KeyMeanScale || s == kInt8KeyLeadMeanScale || s == kInt8KeyCalibrated) && !keys) s = kInt8;
  if (s == kFp8KeyCalibrated && !keys) s = kFp8;
  const Scheme row_scheme = s == kFp8KeyCalibrated ? kFp8 : kInt8;  // the rows of the transformed schemes
  if (s == kInt8ChannelScale || s == kInt8KeyMeanScale || s == kInt8KeyLeadMeanScale || s == kInt8KeyCalibrated ||
      s == kFp8KeyCalibrated) {
    KeyTransform tr;
    if (s == kInt8ChannelScale) {
      tr = KeyTransform{std::vector<float>(size_t(d), 0.0f), std::vector<float>(size_t(d), 0.0f)};
      for (int64_t t = b; t < e; ++t)
        for (int i = 0; i < d; ++i) tr.factor[i] = std::max(tr.factor[i], std::fabs(x[size_t(t) * d + i]));
      for (float& v : tr.factor) v = v > 0.0f ? std::sqrt(v) : 1.0f;
    } else if (s == kInt8KeyCalibrated || s == kFp8KeyCalibrated) {
      tr = calibrated;
    } else {
      tr = key_transform(x, b, s == kInt8KeyLeadMeanScale ? std::min(e, b + kLeadRows) : e, d);
    }
    const std::vector<float>& mu = tr.mean;
    const std::vector<float>& f = tr.factor;
    std::vector<float> y(d);
    for (int64_t t = b; t < e; ++t) {
      for (int i = 0; i < d; ++i) y[i] = (x[size_t(t) * d + i] - mu[i]) / f[i];
      round_row(row_scheme, y.data(), nullptr, d, out.data() + size_t(t) * d);
      for (int i = 0; i < d; ++i) out[size_t(t) * d + i] = out[size_t(t) * d + i] * f[i] + mu[i];
    }
    return out;
  }
  const int64_t span = s == kInt4BlockMean ? kBlockTokens : e - b;  // rows sharing one mean
  for (int64_t b0 = b; b0 < e; b0 += span) {
    const int64_t b1 = std::min(e, b0 + span);
    const bool centred = s == kInt4HeadMean || s == kInt4BlockMean || s == kInt8HeadMean || s == kInt8LeadMean;
    const int64_t mean_end = s == kInt8LeadMean ? std::min(b1, b0 + kLeadRows) : b1;
    const std::vector<float> base = centred ? mean_of_rows(x, b0, mean_end, d) : std::vector<float>();
    for (int64_t t = b0; t < b1; ++t)
      round_row(s, x.data() + size_t(t) * d, centred ? base.data() : nullptr, d, out.data() + size_t(t) * d);
  }
  return out;
}

KeyTransform key_transform(const std::vector<float>& x, int64_t b, int64_t e, int d) {
  KeyTransform tr{std::vector<float>(size_t(d)), std::vector<float>(size_t(d))};
  key_channel_statistics(x.data() + size_t(b) * d, e - b, d, tr.mean.data(), tr.factor.data());
  return tr;
}

struct Sums {
  double kl = 0, logit_rms = 0, out_nmse = 0;
};

int run(int argc, char** argv) {
  std::string model_path, text_path, out_path, calib_path;
  int64_t tokens = 2048;
  int steps = 8;
  bool all_rows = false;
  int64_t calib_tokens = 0;  // 0: --tokens
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--model") model_path = next();
    else if (a == "--text") text_path = next();
    else if (a == "--out") out_path = next();
    else if (a == "--calib-text") calib_path = next();
    else if (a == "--calib-tokens") calib_tokens = std::atoll(next().c_str());
    else if (a == "--tokens") tokens = std::atoll(next().c_str());
    else if (a == "--steps") steps = std::atoi(next().c_str());
    else if (a == "--all-rows") all_rows = true;
    else throw Error("unknown argument " + a + " (usage: key_quant_probe --model FILE --text FILE [--tokens N] "
                     "[--steps S] [--all-rows] [--calib-text FILE [--calib-tokens N]] [--out FILE])");
  }
  const AttentionConfig zone;  // the steady zone's extent: sink_tokens, window_tokens
  const int64_t min_tokens = zone.sink_tokens + zone.window_tokens + kBlockTokens;
  RETROINFER_CHECK(!model_path.empty() && !text_path.empty(), "--model and --text are required");
  RETROINFER_CHECK(tokens >= min_tokens && steps >= 1, "--tokens must be >= ", min_tokens, " and --steps >= 1");
  std::ifstream f(text_path);
  RETROINFER_CHECK(f.good(), "cannot read ", text_path);
  std::stringstream text;
  text << f.rdbuf();
  auto file = ModelFile::open(model_path);
  auto tok = load_model_tokenizer(*file);
  auto model = Model::load(*file);
  const ModelConfig& c = model->config();
  std::vector<int32_t> ids = tok->encode(text.str());
  RETROINFER_CHECK(int64_t(ids.size()) >= tokens + steps, "the text has ", ids.size(),
                   " tokens, fewer than --tokens + --steps = ", tokens + steps);
  RETROINFER_CHECK(c.head_dim % kInt4Group == 0, "head_dim ", c.head_dim, " is not a multiple of 32");
  ids.resize(size_t(tokens + steps));
  SessionOptions so;
  so.attention.kind = AttentionKind::kFull;
  so.max_context = tokens + steps;
  // Per (layer, KV head): the transform of int8_key_calibrated.
  std::vector<std::vector<KeyTransform>> calibration(size_t(c.num_layers),
                                                     std::vector<KeyTransform>(size_t(c.num_heads_kv)));
  const int dh = c.head_dim;
  if (calib_path.empty()) {
    const std::vector<KeyCalibration>& kc = model->key_calibration();
    for (int l = 0; l < c.num_layers; ++l)
      for (int h = 0; h < c.num_heads_kv; ++h) {
        const auto at = [&](const std::vector<float>& v) {
          return std::vector<float>(v.begin() + ptrdiff_t(h) * dh, v.begin() + ptrdiff_t(h + 1) * dh);
        };
        calibration[size_t(l)][size_t(h)] = {at(kc[size_t(l)].mean), at(kc[size_t(l)].factor)};
      }
  } else {
    if (calib_tokens <= 0) calib_tokens = tokens;
    std::vector<int32_t> cids;
    if (calib_path == "random") {  // Model::key_calibration's generator, over --calib-tokens positions
      uint64_t x = 0x9E3779B97F4A7C15ULL;
      for (int64_t i = 0; i <= calib_tokens; ++i) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        cids.push_back(static_cast<int32_t>(x % static_cast<uint64_t>(c.vocab_size)));
      }
    } else {
      std::ifstream cf(calib_path);
      RETROINFER_CHECK(cf.good(), "cannot read ", calib_path);
      std::stringstream ct;
      ct << cf.rdbuf();
      cids = tok->encode(ct.str());
    }
    RETROINFER_CHECK(int64_t(cids.size()) > calib_tokens, "the calibration text has fewer than ", calib_tokens + 1,
                     " tokens");
    Session cal(*model, so);
    cal.set_attention_observer([&](int layer, const KvCache& kv, const float*, const float*) {
      const int64_t n = kv.size();
      std::vector<float> k(size_t(n) * c.head_dim);
      for (int h = 0; h < c.num_heads_kv; ++h) {
        for (int64_t t = 0; t < n; ++t) kv.load_key(h, t, k.data() + size_t(t) * c.head_dim);
        calibration[size_t(layer)][size_t(h)] = key_transform(k, 0, n, c.head_dim);
      }
    });
    cal.prefill(std::span<const int32_t>(cids.data(), size_t(calib_tokens)));
    std::vector<float> cl(size_t(c.vocab_size));
    cal.decode(cids[size_t(calib_tokens)], cl);
  }
  Session session(*model, so);
  const int d = c.head_dim, group = c.num_heads_q / c.num_heads_kv;
  Sums sums[kSchemes];
  int64_t samples = 0;
  session.set_attention_observer([&](int layer, const KvCache& kv, const float* q, const float*) {
    const int64_t n = kv.size();
    // The rows a host-tier store would hold, or every row (--all-rows: an 8-bit KV cache).
    const int64_t b = all_rows ? 0 : zone.sink_tokens, e = all_rows ? n : n - zone.window_tokens;
    std::vector<float> k(size_t(n) * d), v(size_t(n) * d);
    for (int h = 0; h < c.num_heads_kv; ++h) {
      for (int64_t t = 0; t < n; ++t) {
        kv.load_key(h, t, k.data() + size_t(t) * d);
        kv.load_value(h, t, v.data() + size_t(t) * d);
      }
      std::vector<std::vector<float>> kq(kSchemes), vq(kSchemes);
      const KeyTransform& cal = calibration[size_t(layer)][size_t(h)];
      for (int s = 0; s < kSchemes; ++s) {
        kq[s] = round_rows(Scheme(s), k, b, e, d, true, cal);
        vq[s] = round_rows(Scheme(s), v, b, e, d, false, cal);
      }
      for (int g = 0; g < group; ++g) {
        const float* qh = q + size_t(h * group + g) * d;
        auto weights = [&](const std::vector<float>& keys, std::vector<double>& logit, std::vector<double>& p) {
          double mx = -1e300, z = 0;
          for (int64_t t = 0; t < n; ++t) {
            double a = 0;
            for (int i = 0; i < d; ++i) a += double(qh[i]) * keys[size_t(t) * d + i];
            logit[t] = a / std::sqrt(double(d));
            mx = std::max(mx, logit[t]);
          }
          for (int64_t t = 0; t < n; ++t) z += (p[t] = std::exp(logit[t] - mx));
          for (auto& x : p) x /= z;
        };
        auto output = [&](const std::vector<double>& p, const std::vector<float>& values) {
          std::vector<double> o(d, 0.0);
          for (int64_t t = 0; t < n; ++t)
            for (int i = 0; i < d; ++i) o[i] += p[t] * values[size_t(t) * d + i];
          return o;
        };
        std::vector<double> l0(n), p0(n), l1(n), p1(n);
        weights(k, l0, p0);
        const std::vector<double> o0 = output(p0, v);
        double o_energy = 0;
        for (double x : o0) o_energy += x * x;
        for (int s = 0; s < kSchemes; ++s) {
          weights(kq[s], l1, p1);
          double kl = 0, err = 0, oe = 0;
          for (int64_t t = 0; t < n; ++t) {
            if (p0[t] > 0) kl += p0[t] * std::log(p0[t] / std::max(p1[t], 1e-300));
            err += (l1[t] - l0[t]) * (l1[t] - l0[t]);
          }
          const std::vector<double> o1 = output(p1, vq[s]);
          for (int i = 0; i < d; ++i) oe += (o1[i] - o0[i]) * (o1[i] - o0[i]);
          sums[s].kl += kl;
          sums[s].logit_rms += std::sqrt(err / double(e - b));
          sums[s].out_nmse += oe / std::max(o_energy, 1e-30);
        }
        ++samples;
      }
    }
  });
  session.prefill(std::span<const int32_t>(ids.data(), size_t(tokens)));
  std::vector<float> logits(size_t(c.vocab_size));
  for (int i = 0; i < steps; ++i) session.decode(ids[size_t(tokens + i)], logits);
  std::FILE* out = out_path.empty() ? stdout : std::fopen(out_path.c_str(), "w");
  RETROINFER_CHECK(out != nullptr, "cannot write ", out_path);
  for (int s = 0; s < kSchemes; ++s) {
    const nlohmann::json j = {{"bench", "key_quant_probe"}, {"model", model_path}, {"tokens", tokens},
                              {"steps", steps}, {"samples", samples}, {"scheme", kSchemeNames[s]},
                              {"rows", all_rows ? "all" : "store"},
                              {"calibration", calib_path.empty() ? "model" : calib_path},
                              {"attention_kl", sums[s].kl / double(samples)},
                              {"logit_rms_error", sums[s].logit_rms / double(samples)},
                              {"output_nmse", sums[s].out_nmse / double(samples)}};
    std::fprintf(out, "%s\n", j.dump().c_str());
  }
  if (out != stdout) std::fclose(out);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "key_quant_probe: %s\n", e.what());
    return 2;
  }
}
