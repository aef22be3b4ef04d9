// key_quant_probe: how the wave buffer's store arithmetics (core/row_quant.h) distort a real model's attention,
// measured on the CPU with full attention over every cached key and value.
//
//   key_quant_probe --model FILE --text FILE [--tokens 2048] [--steps 8] [--out FILE]
//
// Prefills the first --tokens tokens of the text, then decodes --steps more of it (teacher-forced). At every
// step, layer and query head it rounds the cached K and V rows that a host-tier store would hold (all but the
// steady zone's: the first sink_tokens and the last window_tokens of AttentionConfig's defaults stay exact)
// through each scheme and compares with the exact rows: the KL of the attention weights (exact || rounded
// keys), the RMS error of the logits q·k / sqrt(d) over the rounded rows, and the nmse of the attention output
// with both K and V rounded. Schemes:
//   int8            per-row int8 (StoreDtype::kInt8)
//   int4            int4 with a bf16 scale per 32 values (StoreDtype::kInt4)
//   int4_head_mean  int4 of the row minus its (layer, KV head)'s mean over the cached tokens, mean added back
//   int4_block_mean int4 of the row minus the mean of its 16-token block (a stand-in for a cluster centroid)
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
#include "retroinfer/model.h"
#include "retroinfer/model_file.h"

namespace {

using namespace retroinfer;

enum Scheme { kInt8, kInt4, kInt4HeadMean, kInt4BlockMean, kBf16, kFp8, kSchemes };
const char* const kSchemeNames[kSchemes] = {"int8", "int4", "int4_head_mean", "int4_block_mean", "bf16", "fp8"};
constexpr int64_t kBlockTokens = 16;

// x rounded through the store's arithmetic (bf16 in, bf16 widened out), `base` subtracted before and added after.
void round_row(Scheme s, const float* x, const float* base, int d, float* out) {
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

// Rows [n, d] with rows [b, e) rounded through scheme s, the rest exact. The mean schemes take their mean
// over [b, e) (the head's) or over each kBlockTokens-row block from b on.
std::vector<float> round_rows(Scheme s, const std::vector<float>& x, int64_t b, int64_t e, int d) {
  std::vector<float> out(x);
  const int64_t span = s == kInt4BlockMean ? kBlockTokens : e - b;  // rows sharing one mean
  for (int64_t b0 = b; b0 < e; b0 += span) {
    const int64_t b1 = std::min(e, b0 + span);
    const bool centred = s == kInt4HeadMean || s == kInt4BlockMean;
    const std::vector<float> base = centred ? mean_of_rows(x, b0, b1, d) : std::vector<float>();
    for (int64_t t = b0; t < b1; ++t)
      round_row(s, x.data() + size_t(t) * d, centred ? base.data() : nullptr, d, out.data() + size_t(t) * d);
  }
  return out;
}

struct Sums {
  double kl = 0, logit_rms = 0, out_nmse = 0;
};

int run(int argc, char** argv) {
  std::string model_path, text_path, out_path;
  int64_t tokens = 2048;
  int steps = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) throw Error(a + " needs a value");
      return argv[++i];
    };
    if (a == "--model") model_path = next();
    else if (a == "--text") text_path = next();
    else if (a == "--out") out_path = next();
    else if (a == "--tokens") tokens = std::atoll(next().c_str());
    else if (a == "--steps") steps = std::atoi(next().c_str());
    else throw Error("unknown argument " + a + " (usage: key_quant_probe --model FILE --text FILE [--tokens N] "
                     "[--steps S] [--out FILE])");
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
  Session session(*model, so);
  const int d = c.head_dim, group = c.num_heads_q / c.num_heads_kv;
  Sums sums[kSchemes];
  int64_t samples = 0;
  session.set_attention_observer([&](int, const KvCache& kv, const float* q, const float*) {
    const int64_t n = kv.size();
    const int64_t b = zone.sink_tokens, e = n - zone.window_tokens;  // the rows a store would hold
    std::vector<float> k(size_t(n) * d), v(size_t(n) * d);
    for (int h = 0; h < c.num_heads_kv; ++h) {
      for (int64_t t = 0; t < n; ++t) {
        kv.load_key(h, t, k.data() + size_t(t) * d);
        kv.load_value(h, t, v.data() + size_t(t) * d);
      }
      std::vector<std::vector<float>> kq(kSchemes), vq(kSchemes);
      for (int s = 0; s < kSchemes; ++s) {
        kq[s] = round_rows(Scheme(s), k, b, e, d);
        vq[s] = round_rows(Scheme(s), v, b, e, d);
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
