// The forward pass of one sequence: chunked prefill (cblas_sgemm) and single-token decode (cblas_sgemv).
#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "model/prefill_attention.h"
#include "model/rope.h"
#include "model/weights.h"
#include "retroinfer/error.h"

namespace retroinfer {
namespace {

// Element-wise loops go parallel only above this many elements: a parallel region costs a few
// microseconds (much more on an oversubscribed host), which a loop over fewer than ~64K floats does not repay.
constexpr int64_t kParallelMin = 1 << 16;

// y[out] = W[out, in] @ x[in] + beta * y: the decode matvec, memory-bound on W. One OpenMP loop over
// output rows (rather than OpenBLAS's own thread pool, so that decode uses a single threading runtime).
void matvec(const float* x, const float* w, float* y, int64_t in, int64_t out, float beta) {
#pragma omp parallel for schedule(static) if (out * in >= kParallelMin)
  for (int64_t o = 0; o < out; ++o) {
    const float* row = w + o * in;
    float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
    for (int64_t i = 0; i < in; ++i) acc += row[i] * x[i];
    y[o] = beta == 0.0f ? acc : acc + beta * y[o];
  }
}

// y[n, out] = x[n, in] @ W[out, in]^T + beta * y (cblas_sgemm for n > 1, matvec for n == 1).
void matmul(const float* x, const float* w, float* y, int64_t n, int64_t in, int64_t out, float beta) {
  if (n == 1) {
    matvec(x, w, y, in, out, beta);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(out),
                static_cast<int>(in), 1.0f, x, static_cast<int>(in), w, static_cast<int>(in), beta, y,
                static_cast<int>(out));
  }
}

// y[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w, for n rows of dim h (the Hugging Face LlamaRMSNorm in f32;
// the mean is accumulated in double).
void rms_norm(const float* x, const float* w, float* y, int64_t n, int64_t h, float eps) {
#pragma omp parallel for schedule(static) if (n * h >= kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    const float* xr = x + t * h;
    double ss = 0.0;
    for (int64_t i = 0; i < h; ++i) ss += static_cast<double>(xr[i]) * xr[i];
    const float r = 1.0f / std::sqrt(static_cast<float>(ss / static_cast<double>(h)) + eps);
    float* yr = y + t * h;
    for (int64_t i = 0; i < h; ++i) yr[i] = w[i] * (xr[i] * r);
  }
}

}  // namespace

struct Session::Scratch {
  int64_t rows = 0;          // capacity in tokens
  std::vector<float> x;      // [rows, hidden] residual stream
  std::vector<float> xn;     // [rows, hidden] normalised
  std::vector<float> qkv;    // [rows, (hq + 2 hkv) d]
  std::vector<float> q;      // [rows, hq, d] post-RoPE
  std::vector<float> k;      // [rows, hkv, d] post-RoPE
  std::vector<float> v;      // [rows, hkv, d]
  std::vector<float> att;    // [rows, hq * d]
  std::vector<float> gu;     // [rows, 2 * intermediate]
  std::vector<float> act;    // [rows, intermediate]
  std::vector<float> cos, sin;  // [rows, d / 2]
  model::PrefillAttentionScratch attn;
  model::RopeFrequencies freqs;
  int64_t freqs_seq_len = -1;  // seq_len freqs were computed for (-1: none)
  void ensure(int64_t n, const ModelConfig& c) {
    if (n <= rows) return;
    rows = n;
    const int64_t h = c.hidden_size, d = c.head_dim, qkvw = (c.num_heads_q + 2 * c.num_heads_kv) * d;
    x.resize(n * h);
    xn.resize(n * h);
    qkv.resize(n * qkvw);
    q.resize(n * c.num_heads_q * d);
    k.resize(n * c.num_heads_kv * d);
    v.resize(n * c.num_heads_kv * d);
    att.resize(n * c.num_heads_q * d);
    gu.resize(n * 2 * c.intermediate_size);
    act.resize(n * c.intermediate_size);
    cos.resize(n * d / 2);
    sin.resize(n * d / 2);
  }
};

Session::Session(const Model& model, const SessionOptions& opt) : model_(model), opt_(opt), s_(new Scratch) {
  const ModelConfig& c = model.config();
  RETROINFER_CHECK(opt.prefill_chunk >= 1, "session: prefill_chunk must be >= 1, got ", opt.prefill_chunk);
  RETROINFER_CHECK(opt.kv_dtype == DType::kF32 || opt.kv_dtype == DType::kBF16,
                   "session: KV cache dtype must be f32 or bf16, got ", dtype_name(opt.kv_dtype));
  const int64_t model_max = model_max_context(c);
  max_context_ = opt.max_context > 0 ? opt.max_context : model_max;
  RETROINFER_CHECK(max_context_ <= model_max, "session: ", max_context_,
                   " tokens (prompt + new tokens) exceed the model's maximum context of ", model_max,
                   " tokens (max_position_embeddings of ", model.path(), "); shorten the prompt or generate fewer tokens");
  if (opt.max_context > 0) {
    const MemoryEstimate e = estimate_memory(c, max_context_, opt.kv_dtype, opt.prefill_chunk);
    const int64_t left = model.memory_limit_bytes() - e.weight_bytes;
    RETROINFER_CHECK(e.kv_bytes + e.activation_bytes <= left, "session: ", max_context_, " tokens need ",
                     (e.kv_bytes + e.activation_bytes) >> 20, " MiB of KV cache and scratch but only ",
                     std::max<int64_t>(left, 0) >> 20, " MiB are left after the ", e.weight_bytes >> 20,
                     " MiB of weights; use a shorter context or --kv-dtype bf16");
  }
  const AttentionShape shape{c.num_heads_q, c.num_heads_kv, c.head_dim};
  kv_.reserve(c.num_layers);
  attn_.reserve(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    kv_.emplace_back(c.num_heads_kv, c.head_dim, opt.kv_dtype);
    attn_.push_back(make_attention(opt.attention, shape));
  }
}

Session::~Session() = default;

std::unique_ptr<Session> Session::fork(const AttentionConfig& attention) const {
  RETROINFER_CHECK(prefilled_, "session: fork needs a prefilled session");
  SessionOptions o = opt_;
  o.attention = attention;
  o.max_context = max_context_;
  auto s = std::make_unique<Session>(model_, o);
  s->kv_ = kv_;
  s->pos_ = pos_;
  for (size_t l = 0; l < s->kv_.size(); ++l) s->attn_[l]->on_prefill(s->kv_[l]);
  s->prefilled_ = true;
  return s;
}

const KvCache& Session::kv(int layer) const {
  RETROINFER_CHECK(layer >= 0 && layer < static_cast<int>(kv_.size()), "session: layer ", layer, " out of range");
  return kv_[layer];
}

std::vector<float> Session::prefill(std::span<const int32_t> tokens, bool all_logits,
                                    const PrefillProgress& progress) {
  RETROINFER_CHECK(!prefilled_, "session: prefill may run only once per session");
  RETROINFER_CHECK(!tokens.empty(), "session: empty prompt; prefill needs at least one token");
  const int64_t n = static_cast<int64_t>(tokens.size());
  RETROINFER_CHECK(n <= max_context_, "session: the prompt has ", n, " tokens but the session holds at most ",
                   max_context_);
  const int64_t vocab = model_.config().vocab_size;
  for (auto& kv : kv_) kv.reserve(opt_.max_context > 0 ? max_context_ : n);
  std::vector<float> logits((all_logits ? n : 1) * vocab);
  const int64_t chunk = opt_.prefill_chunk;
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t m = std::min(chunk, n - start);
    const bool last = start + m == n;
    if (all_logits) {
      forward(tokens.data() + start, m, n, false, 0, logits.data() + start * vocab);
    } else {
      forward(tokens.data() + start, m, n, false, last ? m - 1 : m, logits.data());
    }
    if (progress) progress(start + m, n);
  }
  for (size_t l = 0; l < kv_.size(); ++l) attn_[l]->on_prefill(kv_[l]);
  prefilled_ = true;
  return logits;
}

void Session::decode(int32_t token, std::span<float> logits) {
  RETROINFER_CHECK(static_cast<int64_t>(logits.size()) == model_.config().vocab_size,
                   "session: decode needs a logits buffer of vocab_size = ", model_.config().vocab_size);
  RETROINFER_CHECK(pos_ + 1 <= max_context_, "session: the context is full (", max_context_, " tokens)");
  prefilled_ = true;  // decode without prefill: every token is steady zone for the methods
  last_stats_ = AttentionStats{};
  forward(&token, 1, pos_ + 1, true, 0, logits.data());
}

void Session::forward(const int32_t* tokens, int64_t n, int64_t rope_seq_len, bool decode, int64_t keep_from,
                      float* logits) {
  const ModelConfig& c = model_.config();
  const Model::Weights& w = model_.weights();
  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_heads_q, hkv = c.num_heads_kv;
  const int64_t inter = c.intermediate_size, vocab = c.vocab_size;
  const int64_t qkvw = (hq + 2 * hkv) * d;
  Scratch& s = *s_;
  s.ensure(n, c);

  for (int64_t t = 0; t < n; ++t) {
    RETROINFER_CHECK(tokens[t] >= 0 && tokens[t] < vocab, "session: token id ", tokens[t], " at position ",
                     pos_ + t, " is outside the vocabulary [0, ", vocab, ")");
    std::copy_n(w.embed.data() + static_cast<int64_t>(tokens[t]) * h, h, s.x.data() + t * h);
  }
  // Only `dynamic` RoPE depends on the sequence length; recompute when it changes what the table holds.
  const bool dynamic = c.rope_scaling.type == "dynamic";
  if (s.freqs_seq_len < 0 || (dynamic && rope_seq_len != s.freqs_seq_len)) {
    s.freqs = model::rope_frequencies(c, rope_seq_len);
    s.freqs_seq_len = rope_seq_len;
  }
  model::rope_table(s.freqs, pos_, n, s.cos.data(), s.sin.data());
  const AttentionShape shape{c.num_heads_q, c.num_heads_kv, c.head_dim};

  for (int l = 0; l < c.num_layers; ++l) {
    const Model::Weights::Layer& L = w.layers[l];
    rms_norm(s.x.data(), L.attn_norm.data(), s.xn.data(), n, h, c.rms_norm_eps);
    matmul(s.xn.data(), L.wqkv.data(), s.qkv.data(), n, h, qkvw, 0.0f);
#pragma omp parallel for schedule(static) if (n * h >= kParallelMin)
    for (int64_t t = 0; t < n; ++t) {
      float* row = s.qkv.data() + t * qkvw;
      if (!L.bqkv.empty())
        for (int64_t i = 0; i < qkvw; ++i) row[i] += L.bqkv[i];
      std::copy_n(row, hq * d, s.q.data() + t * hq * d);
      std::copy_n(row + hq * d, hkv * d, s.k.data() + t * hkv * d);
      std::copy_n(row + (hq + hkv) * d, hkv * d, s.v.data() + t * hkv * d);
    }
    model::apply_rope(s.q.data(), n, static_cast<int>(hq), static_cast<int>(d), s.cos.data(), s.sin.data());
    model::apply_rope(s.k.data(), n, static_cast<int>(hkv), static_cast<int>(d), s.cos.data(), s.sin.data());
    kv_[l].append(s.k.data(), s.v.data(), n);
    if (decode) {
      last_stats_ += attn_[l]->decode(kv_[l], s.q.data(), s.att.data());
      if (observer_) observer_(l, kv_[l], s.q.data(), s.att.data());
    } else {
      model::blas_prefill_attention(kv_[l], shape, opt_.attention.scale, pos_, n, s.q.data(), s.att.data(), s.attn);
    }
    matmul(s.att.data(), L.wo.data(), s.x.data(), n, hq * d, h, 1.0f);  // residual: x += att @ Wo^T

    rms_norm(s.x.data(), L.mlp_norm.data(), s.xn.data(), n, h, c.rms_norm_eps);
    matmul(s.xn.data(), L.wgate_up.data(), s.gu.data(), n, h, 2 * inter, 0.0f);
#pragma omp parallel for schedule(static) if (n * h >= kParallelMin)
    for (int64_t t = 0; t < n; ++t) {
      const float* g = s.gu.data() + t * 2 * inter;
      const float* u = g + inter;
      float* a = s.act.data() + t * inter;
      for (int64_t i = 0; i < inter; ++i) a[i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];  // SiLU(g) * u
    }
    matmul(s.act.data(), L.wdown.data(), s.x.data(), n, inter, h, 1.0f);  // residual: x += act @ Wd^T
  }
  pos_ += n;
  const int64_t keep = n - keep_from;
  if (keep <= 0) return;
  rms_norm(s.x.data() + keep_from * h, w.final_norm.data(), s.xn.data(), keep, h, c.rms_norm_eps);
  matmul(s.xn.data(), w.lm_head_data(), logits, keep, h, vocab, 0.0f);
}

}  // namespace retroinfer

namespace retroinfer {

const ModelConfig& Session::model_config() const { return model_.config(); }

std::string_view device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

Device parse_device(std::string_view s) {
  if (s == "cpu") return Device::kCpu;
  if (s == "cuda") return Device::kCuda;
  RETROINFER_FAIL("unknown device '", s, "': expected cpu or cuda");
}

}  // namespace retroinfer
