// The forward pass of one sequence (chunked prefill and single-token decode; the products in linear.h) and
// batched decode of one token of each of several sequences (Session::decode_batch).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <exception>
#include <limits>

#include "model/linear.h"
#include "index/layer_budgets.h"
#include "model/prefill_attention.h"
#include "model/rope.h"
#include "model/weights.h"
#include "retroinfer/error.h"
#include "retroinfer/fault_injection.h"

namespace retroinfer {
namespace {

// Element-wise loops go parallel only above this many elements: a parallel region costs a few
// microseconds (much more on an oversubscribed host), which a loop over fewer than ~64K floats does not repay.
constexpr int64_t kParallelMin = 1 << 16;

using model::Gemm;
using model::linear;

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

// The activations of n rows (tokens of one sequence in prefill, or one token of each of n sequences in
// batched decode) through one forward pass.
struct ForwardBuffers {
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
  std::vector<float> cos, sin;  // [rows, d / 2] of each row's position
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

// The per-layer pieces shared by Session::forward (n tokens of one sequence) and Session::decode_batch
// (one token of n sequences): everything but the RoPE table, the KV append and the attention itself.

// b.x[t] = embedding of tokens[t] for n rows (tokens already checked against the vocabulary).
void embed_rows(const ModelConfig& c, const Model::Weights& w, const int32_t* tokens, int64_t n, ForwardBuffers& b) {
  const int64_t h = c.hidden_size;
  for (int64_t t = 0; t < n; ++t) w.embed.widen_rows(tokens[t], 1, b.x.data() + t * h);
}

// Attention input of n rows: b.q [n, hq, d] and b.k [n, hkv, d] post-RoPE (b.cos/b.sin hold each row's
// position), b.v [n, hkv, d]; the QKV weights are read once for all n rows.
void qkv_rows(const ModelConfig& c, const Model::Weights::Layer& L, ForwardBuffers& b, int64_t n, Gemm g) {
  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_heads_q, hkv = c.num_heads_kv;
  const int64_t qkvw = (hq + 2 * hkv) * d;
  rms_norm(b.x.data(), L.attn_norm.data(), b.xn.data(), n, h, c.rms_norm_eps);
  linear(b.xn.data(), L.wqkv, b.qkv.data(), n, 0.0f, g);
#pragma omp parallel for schedule(static) if (n * h >= kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    float* row = b.qkv.data() + t * qkvw;
    if (!L.bqkv.empty())
      for (int64_t i = 0; i < qkvw; ++i) row[i] += L.bqkv[i];
    std::copy_n(row, hq * d, b.q.data() + t * hq * d);
    std::copy_n(row + hq * d, hkv * d, b.k.data() + t * hkv * d);
    std::copy_n(row + (hq + hkv) * d, hkv * d, b.v.data() + t * hkv * d);
  }
  model::apply_rope(b.q.data(), n, static_cast<int>(hq), static_cast<int>(d), b.cos.data(), b.sin.data());
  model::apply_rope(b.k.data(), n, static_cast<int>(hkv), static_cast<int>(d), b.cos.data(), b.sin.data());
}

// After attention (b.att [n, hq * d]): x += att @ Wo^T, then x += MLP(RMSNorm(x)) (SwiGLU), for n rows.
void output_and_mlp_rows(const ModelConfig& c, const Model::Weights::Layer& L, ForwardBuffers& b, int64_t n, Gemm g) {
  const int64_t h = c.hidden_size, inter = c.intermediate_size;
  linear(b.att.data(), L.wo, b.x.data(), n, 1.0f, g);  // residual
  rms_norm(b.x.data(), L.mlp_norm.data(), b.xn.data(), n, h, c.rms_norm_eps);
  linear(b.xn.data(), L.wgate_up, b.gu.data(), n, 0.0f, g);
#pragma omp parallel for schedule(static) if (n * h >= kParallelMin)
  for (int64_t t = 0; t < n; ++t) {
    const float* gt = b.gu.data() + t * 2 * inter;
    const float* u = gt + inter;
    float* a = b.act.data() + t * inter;
    for (int64_t i = 0; i < inter; ++i) a[i] = gt[i] / (1.0f + std::exp(-gt[i])) * u[i];  // SiLU(g) * u
  }
  linear(b.act.data(), L.wdown, b.x.data(), n, 1.0f, g);  // residual: x += act @ Wd^T
}

// logits [n - from, vocab] of rows [from, n): final norm + LM head.
void lm_head_rows(const ModelConfig& c, const Model::Weights& w, ForwardBuffers& b, int64_t from, int64_t n,
                  float* logits, Gemm g) {
  const int64_t keep = n - from, h = c.hidden_size;
  if (keep <= 0) return;
  rms_norm(b.x.data() + from * h, w.final_norm.data(), b.xn.data(), keep, h, c.rms_norm_eps);
  linear(b.xn.data(), w.lm_head_matrix(), logits, keep, 0.0f, g);
}

}  // namespace

struct Session::Scratch : ForwardBuffers {
  model::PrefillAttentionScratch attn;
  model::RopeFrequencies freqs;
  int64_t freqs_seq_len = -1;  // seq_len freqs were computed for (-1: none)
};

Session::Session(const Model& model, const SessionOptions& opt) : model_(model), opt_(opt), s_(new Scratch) {
  const ModelConfig& c = model.config();
  RETROINFER_CHECK(opt.prefill_chunk >= 1, "session: prefill_chunk must be >= 1, got ", opt.prefill_chunk);
  RETROINFER_CHECK(opt.kv_dtype == DType::kF32 || opt.kv_dtype == DType::kBF16 || is_scaled_8bit(opt.kv_dtype),
                   "session: KV cache dtype must be f32, bf16, int8 or fp8, got ", dtype_name(opt.kv_dtype));
  const int64_t model_max = model_max_context(c);
  max_context_ = opt.max_context > 0 ? opt.max_context : model_max;
  RETROINFER_CHECK(max_context_ <= model_max, "session: ", max_context_,
                   " tokens (prompt + new tokens) exceed the model's maximum context of ", model_max,
                   " tokens (max_position_embeddings of ", model.path(), "); shorten the prompt or generate fewer tokens");
  if (opt.max_context > 0) {
    const MemoryEstimate e = estimate_memory(c, max_context_, opt.kv_dtype, opt.prefill_chunk);
    const int64_t left = model.memory_limit_bytes() - model.weight_bytes();
    RETROINFER_CHECK(e.kv_bytes + e.activation_bytes <= left, "session: ", max_context_, " tokens need ",
                     (e.kv_bytes + e.activation_bytes) >> 20, " MiB of KV cache and scratch but only ",
                     std::max<int64_t>(left, 0) >> 20, " MiB are left after the ", model.weight_bytes() >> 20,
                     " MiB of weights; use a shorter context",
                     opt.kv_dtype == DType::kF32    ? " or --kv-dtype bf16 (half the KV bytes) or int8 (about a quarter)"
                     : opt.kv_dtype == DType::kBF16 ? " or --kv-dtype int8 (about half the KV bytes)"
                                                    : "");
  }
  const AttentionShape shape{c.num_heads_q, c.num_heads_kv, c.head_dim};
  kv_.reserve(c.num_layers);
  attn_.reserve(c.num_layers);
  const std::vector<KeyCalibration>* key_cal = is_scaled_8bit(opt.kv_dtype) ? &model.key_calibration() : nullptr;
  for (int l = 0; l < c.num_layers; ++l) {
    kv_.emplace_back(c.num_heads_kv, c.head_dim, opt.kv_dtype, key_cal ? &(*key_cal)[static_cast<size_t>(l)] : nullptr);
    attn_.push_back(make_attention(opt.attention, shape));
    if (opt.cluster_trace) attn_.back()->set_cluster_trace(opt.cluster_trace.get(), l);
  }
}

Session::~Session() = default;

std::unique_ptr<Session> Session::fork(const AttentionConfig& attention) const {
  RETROINFER_CHECK(prefilled_, "session: fork needs a prefilled session");
  SessionOptions o = opt_;
  o.attention = attention;
  o.cluster_trace = nullptr;  // the fork's steps would repeat the parent's step numbers
  o.max_context = max_context_;
  auto s = std::make_unique<Session>(model_, o);
  s->kv_ = kv_;
  s->pos_ = pos_;
  s->prompt_queries_ = prompt_queries_;
  s->prompt_queries_end_ = prompt_queries_end_;
  s->index_prompt();
  s->prefilled_ = true;
  return s;
}

const KvCache& Session::kv(int layer) const {
  RETROINFER_CHECK(layer >= 0 && layer < static_cast<int>(kv_.size()), "session: layer ", layer, " out of range");
  return kv_[layer];
}

std::vector<float> Session::prefill(std::span<const int32_t> tokens, bool all_logits,
                                    const PrefillProgress& progress) {
  if (!all_logits) {  // the stepped prefill in one step: the same chunks
    begin_prefill(tokens, progress);
    prefill_step(std::numeric_limits<int64_t>::max());
    return take_prefill_logits();
  }
  RETROINFER_CHECK(prefix_tokens_.empty(), "session: prefill with all_logits after load_prefix (the prefix's "
                   "positions have no logits); prefill without all_logits, or without a prefix");
  ready_for_prompt(tokens);
  const int64_t n = static_cast<int64_t>(tokens.size()), vocab = model_.config().vocab_size;
  std::vector<float> logits(n * vocab);
  const int64_t chunk = opt_.prefill_chunk;
  for (int64_t start = 0; start < n; start += chunk) {
    const int64_t m = std::min(chunk, n - start);
    forward(tokens.data() + start, m, n, false, 0, logits.data() + start * vocab);
    if (progress) progress(start + m, n);
  }
  index_prompt();
  prefilled_ = true;
  return logits;
}

void Session::ready_for_prompt(std::span<const int32_t> tokens) {
  RETROINFER_CHECK(!steps_.active, "session: a stepped prefill is in progress");
  RETROINFER_CHECK(!prefilled_, "session: prefill may run only once per session");
  RETROINFER_CHECK(!tokens.empty(), "session: empty prompt; prefill needs at least one token");
  const int64_t n = static_cast<int64_t>(tokens.size());
  RETROINFER_CHECK(n <= max_context_, "session: the prompt has ", n, " tokens but the session holds at most ",
                   max_context_);
  if (!prefix_tokens_.empty()) {
    const auto p = static_cast<int64_t>(prefix_tokens_.size());
    RETROINFER_CHECK(n > p && std::equal(prefix_tokens_.begin(), prefix_tokens_.end(), tokens.begin()),
                     "session: the prompt (", n, " tokens) does not continue the loaded prefix (", p,
                     " tokens): it must start with the prefix's tokens and add at least one");
  }
  for (auto& kv : kv_) kv.reserve(opt_.max_context > 0 ? max_context_ : n);
}

void Session::begin_prefill(std::span<const int32_t> tokens, const PrefillProgress& progress) {
  ready_for_prompt(tokens);
  SequenceSession::begin_prefill(tokens, progress);  // keeps the copy
  steps_.done = static_cast<int64_t>(prefix_tokens_.size());  // the loaded prefix is already in the caches
  steps_.logits.assign(model_.config().vocab_size, 0.0f);
}

bool Session::prefill_step(int64_t max_tokens) {
  check_prefill_step(max_tokens);
  const int64_t n = static_cast<int64_t>(steps_.tokens.size()), chunk = opt_.prefill_chunk;
  int64_t ran = 0;
  try {
    while (steps_.done < n) {
      // Chunks end where a cold prefill's end (multiples of chunk), also after a loaded prefix.
      const int64_t m = std::min(chunk - steps_.done % chunk, n - steps_.done);
      if (ran > 0 && ran + m > max_tokens) break;  // at least one chunk per step
      const bool last = steps_.done + m == n;
      forward(steps_.tokens.data() + steps_.done, m, n, false, last ? m - 1 : m, steps_.logits.data());
      steps_.done += m;
      ran += m;
      if (steps_.progress) steps_.progress(steps_.done, n);
    }
  } catch (...) {
    steps_ = PrefillSteps{};  // the stepping ends with the error (as a failed prefill(): it may be retried)
    throw;
  }
  if (steps_.done < n) return false;
  index_prompt();
  prefilled_ = true;
  prefix_tokens_.clear();
  steps_.finished = true;
  return true;
}

void Session::load_prefix(const KvPrefix& prefix) {
  RETROINFER_CHECK(!steps_.active && !prefilled_ && pos_ == 0,
                   "session: load_prefix needs a fresh session (nothing prefilled, no stepped prefill)");
  RETROINFER_CHECK(!prefix.tokens.empty(), "session: load_prefix got an empty prefix");
  const ModelConfig& c = model_.config();
  const int64_t n = prefix.size();
  RETROINFER_CHECK(n < max_context_, "session: the prefix has ", n, " tokens but the session holds at most ",
                   max_context_, " (prefix + prompt + new tokens)");
  int64_t sum = 0;
  for (const auto& b : prefix.blocks) {
    RETROINFER_CHECK(b != nullptr, "session: load_prefix got a null block");
    RETROINFER_CHECK(b->num_layers == c.num_layers && b->num_heads_kv == c.num_heads_kv && b->head_dim == c.head_dim,
                     "session: the prefix's K/V is of ", b->num_layers, " layers x ", b->num_heads_kv,
                     " KV heads x head_dim ", b->head_dim, " but the model has ", c.num_layers, " x ",
                     c.num_heads_kv, " x ", c.head_dim, "; it was made with another model");
    RETROINFER_CHECK(b->dtype == opt_.kv_dtype, "session: the prefix's K/V is ", dtype_name(b->dtype),
                     " but the session's KV cache is ", dtype_name(opt_.kv_dtype), "; use --kv-dtype ",
                     dtype_name(b->dtype));
    RETROINFER_CHECK(static_cast<int64_t>(b->bytes.size()) == 2LL * c.num_layers * c.num_heads_kv * b->run_bytes(),
                     "session: a prefix block of ", b->tokens, " tokens holds ", b->bytes.size(), " bytes, not ",
                     2LL * c.num_layers * c.num_heads_kv * b->run_bytes());
    sum += b->tokens;
  }
  RETROINFER_CHECK(sum == n, "session: the prefix's blocks hold ", sum, " tokens but it names ", n);
  for (int l = 0; l < c.num_layers; ++l) {
    KvCache& kv = kv_[l];
    kv.reserve(opt_.max_context > 0 ? max_context_ : n);
    for (const auto& b : prefix.blocks) {
      for (int h = 0; h < c.num_heads_kv; ++h) kv.append_stored(h, b->run(l, 0, h), b->run(l, 1, h), b->tokens);
      kv.commit_rows(b->tokens);
    }
  }
  pos_ = n;
  prefix_tokens_ = prefix.tokens;
}

KvBlock Session::export_kv(int64_t from, int64_t to) const {
  RETROINFER_CHECK(0 <= from && from < to && to <= pos_, "session: export_kv of positions [", from, ", ", to,
                   ") outside the ", pos_, " tokens in the cache");
  const ModelConfig& c = model_.config();
  KvBlock b;
  b.num_layers = c.num_layers;
  b.num_heads_kv = c.num_heads_kv;
  b.head_dim = c.head_dim;
  b.dtype = opt_.kv_dtype;
  b.tokens = to - from;
  b.bytes.resize(2 * static_cast<size_t>(c.num_layers) * c.num_heads_kv * b.run_bytes());
  for (int l = 0; l < c.num_layers; ++l)
    for (int h = 0; h < c.num_heads_kv; ++h) {
      std::memcpy(b.run(l, 0, h), kv_[l].key_row(h, from), b.run_bytes());
      std::memcpy(b.run(l, 1, h), kv_[l].value_row(h, from), b.run_bytes());
    }
  return b;
}

void Session::decode(int32_t token, std::span<float> logits) {
  RETROINFER_CHECK(static_cast<int64_t>(logits.size()) == model_.config().vocab_size,
                   "session: decode needs a logits buffer of vocab_size = ", model_.config().vocab_size);
  RETROINFER_CHECK(pos_ + 1 <= max_context_, "session: the context is full (", max_context_, " tokens)");
  RETROINFER_CHECK(!steps_.active, "session: decode while a stepped prefill is in progress (take_prefill_logits ends it)");
  if (fault::should_fail(fault::Point::kDecodeStep))
    RETROINFER_FAIL("session: the decode step at position ", pos_, " failed (injected fault decode_step)");
  prefilled_ = true;  // decode without prefill: every token is steady zone for the methods
  last_stats_ = AttentionStats{};
  forward(&token, 1, pos_ + 1, true, 0, logits.data());
}

void Session::decode_batch(std::span<Session* const> sessions, std::span<const int32_t> tokens,
                           std::span<float> logits) {
  RETROINFER_CHECK(!sessions.empty(), "session: decode_batch needs at least one session");
  const auto n = static_cast<int64_t>(sessions.size());
  RETROINFER_CHECK(static_cast<int64_t>(tokens.size()) == n, "session: decode_batch got ", sessions.size(),
                   " sessions but ", tokens.size(), " tokens; give one token per session");
  for (int64_t i = 0; i < n; ++i)
    RETROINFER_CHECK(sessions[i] != nullptr, "session: decode_batch: session ", i, " is null");
  const Model& model = sessions[0]->model_;
  const ModelConfig& c = model.config();
  const int64_t vocab = c.vocab_size, d = c.head_dim;
  RETROINFER_CHECK(static_cast<int64_t>(logits.size()) == n * vocab, "session: decode_batch needs a logits buffer of ",
                   n, " x vocab_size ", vocab, " = ", n * vocab, " floats, got ", logits.size());
  for (int64_t i = 0; i < n; ++i) {
    const Session& s = *sessions[i];
    RETROINFER_CHECK(&s.model_ == &model, "session: decode_batch: session ", i, " runs another model (",
                     s.model_.path(), ") than session 0 (", model.path(), "); batch only sessions of one Model");
    for (int64_t j = 0; j < i; ++j)
      RETROINFER_CHECK(sessions[j] != sessions[i], "session: decode_batch: sessions ", j, " and ", i,
                       " are the same object; each sequence may appear once per step");
    RETROINFER_CHECK(s.pos_ + 1 <= s.max_context_, "session: decode_batch: the context of session ", i,
                     " is full (", s.max_context_, " tokens)");
    RETROINFER_CHECK(!s.steps_.active, "session: decode_batch: session ", i, " is in a stepped prefill");
    RETROINFER_CHECK(tokens[i] >= 0 && tokens[i] < vocab, "session: decode_batch: token id ", tokens[i],
                     " of session ", i, " is outside the vocabulary [0, ", vocab, ")");
  }
  if (fault::should_fail(fault::Point::kDecodeStep))
    RETROINFER_FAIL("session: the batched decode step of ", n, " sequences failed (injected fault decode_step)");
  // All checks passed: from here every session advances by one token.
  const Model::Weights& w = model.weights();
  ForwardBuffers& b = *sessions[0]->s_;  // the batch's rows live in session 0's scratch (one caller owns all)
  b.ensure(n, c);
  embed_rows(c, w, tokens.data(), n, b);
  for (int64_t i = 0; i < n; ++i) {
    Session& s = *sessions[i];
    s.prefilled_ = true;
    s.last_stats_ = AttentionStats{};
    s.ensure_rope(s.pos_ + 1);
    model::rope_table(s.s_->freqs, s.pos_, 1, b.cos.data() + i * (d / 2), b.sin.data() + i * (d / 2));
  }
  const int64_t qd = c.num_heads_q * d, kvd = c.num_heads_kv * d;
  for (int l = 0; l < c.num_layers; ++l) {
    const Model::Weights::Layer& L = w.layers[l];
    qkv_rows(c, L, b, n, Gemm::kRows);
    for (int64_t i = 0; i < n; ++i) {
      Session& s = *sessions[i];
      s.kv_[l].append(b.k.data() + i * kvd, b.v.data() + i * kvd, 1);
      s.decode_attention(l, b.q.data() + i * qd, b.att.data() + i * qd);
    }
    output_and_mlp_rows(c, L, b, n, Gemm::kRows);
  }
  for (int64_t i = 0; i < n; ++i) ++sessions[i]->pos_;
  lm_head_rows(c, w, b, 0, n, logits.data(), Gemm::kRows);
}

void Session::ensure_rope(int64_t rope_seq_len) {
  // Only `dynamic` RoPE depends on the sequence length; recompute when it changes what the table holds.
  Scratch& s = *s_;
  const ModelConfig& c = model_.config();
  const bool dynamic = c.rope_scaling.type == "dynamic";
  if (s.freqs_seq_len < 0 || (dynamic && rope_seq_len != s.freqs_seq_len)) {
    s.freqs = model::rope_frequencies(c, rope_seq_len);
    s.freqs_seq_len = rope_seq_len;
  }
}

void Session::keep_prompt_queries(int layer, const float* q, int64_t n) {
  const int64_t keep = index::prompt_queries_to_keep(opt_.attention);
  if (keep == 0) return;
  const ModelConfig& c = model_.config();
  const int64_t row = static_cast<int64_t>(c.num_heads_q) * c.head_dim;
  if (prompt_queries_.size() != kv_.size()) prompt_queries_.assign(kv_.size(), {});
  std::vector<float>& kept = prompt_queries_[layer];
  const int64_t take = std::min(n, keep);
  kept.insert(kept.end(), q + (n - take) * row, q + n * row);
  const auto rows = static_cast<int64_t>(kept.size()) / row;
  if (rows > keep) kept.erase(kept.begin(), kept.begin() + (rows - keep) * row);
}

void Session::index_prompt() {
  // Layers in parallel, one per thread at a time: a layer's index build (retro's k-means) then calls BLAS
  // single-threaded and its inner loops run serially, so no thread waits on another inside a layer. (With the
  // layers one after another, each k-means step alternated threaded sgemm calls with short parallel loops over
  // a few MiB of scores.) Only where BLAS then stays on each layer's thread (linear.h).
  const int layers = static_cast<int>(kv_.size());
  const bool parallel = layers > 1 && num_threads() > 1 && model::blas_serial_in_parallel_regions();
  std::exception_ptr error;
#pragma omp parallel for schedule(dynamic, 1) if (parallel)
  for (int l = 0; l < layers; ++l) {
    try {
      attn_[l]->on_prefill(kv_[l]);
    } catch (...) {  // an exception must not leave the parallel region
#pragma omp critical(retroinfer_index_prompt_error)
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
  layer_multipliers_.clear();
  const int64_t want = opt_.attention.layer_budget_queries;
  // The kept queries must be those of the cache's last tokens (not so after a loaded prefix or decode steps).
  if (want <= 0 || kv_.empty() || prompt_queries_end_ != kv_[0].size() || prompt_queries_.size() != kv_.size())
    return;
  const ModelConfig& c = model_.config();
  const int64_t row = static_cast<int64_t>(c.num_heads_q) * c.head_dim;
  const int64_t rows = std::min<int64_t>(want, static_cast<int64_t>(prompt_queries_[0].size()) / row);
  if (rows == 0) return;
  std::vector<std::vector<double>> missed(kv_.size());
  for (size_t l = 0; l < kv_.size(); ++l) {
    const std::vector<float>& kept = prompt_queries_[l];
    const float* q = kept.data() + (static_cast<int64_t>(kept.size()) / row - rows) * row;
    missed[l] = attn_[l]->calibration_missed_mass(kv_[l], q, rows);  // empty: no index, the layer keeps 1
  }
  layer_multipliers_ = index::allocate_calibrated_layers(missed);
  for (size_t l = 0; l < layer_multipliers_.size(); ++l) attn_[l]->set_retrieval_multiplier(layer_multipliers_[l]);
}

void Session::decode_attention(int layer, const float* q, float* out) {
  last_stats_ += attn_[layer]->decode(kv_[layer], q, out);
  if (observer_) observer_(layer, kv_[layer], q, out);
}

void Session::forward(const int32_t* tokens, int64_t n, int64_t rope_seq_len, bool decode, int64_t keep_from,
                      float* logits) {
  const ModelConfig& c = model_.config();
  const Model::Weights& w = model_.weights();
  const int64_t vocab = c.vocab_size;
  Scratch& s = *s_;
  s.ensure(n, c);
  for (int64_t t = 0; t < n; ++t)
    RETROINFER_CHECK(tokens[t] >= 0 && tokens[t] < vocab, "session: token id ", tokens[t], " at position ",
                     pos_ + t, " is outside the vocabulary [0, ", vocab, ")");
  embed_rows(c, w, tokens, n, s);
  ensure_rope(rope_seq_len);
  model::rope_table(s.freqs, pos_, n, s.cos.data(), s.sin.data());
  const AttentionShape shape{c.num_heads_q, c.num_heads_kv, c.head_dim};

  for (int l = 0; l < c.num_layers; ++l) {
    const Model::Weights::Layer& L = w.layers[l];
    qkv_rows(c, L, s, n, Gemm::kBlas);
    kv_[l].append(s.k.data(), s.v.data(), n);
    if (!decode) keep_prompt_queries(l, s.q.data(), n);
    if (decode) {
      decode_attention(l, s.q.data(), s.att.data());
    } else {
      model::cpu_prefill_attention(kv_[l], shape, opt_.attention.scale, pos_, n, s.q.data(), s.att.data(), s.attn);
    }
    output_and_mlp_rows(c, L, s, n, Gemm::kBlas);
  }
  pos_ += n;
  if (!decode) prompt_queries_end_ = pos_;
  lm_head_rows(c, w, s, keep_from, n, logits, Gemm::kBlas);
}

}  // namespace retroinfer

namespace retroinfer {

const ModelConfig& Session::model_config() const { return model_.config(); }

std::string_view device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }

void SequenceSession::begin_prefill(std::span<const int32_t> tokens, const PrefillProgress& progress) {
  RETROINFER_CHECK(!steps_.active, "session: a stepped prefill is in progress");
  RETROINFER_CHECK(!tokens.empty(), "session: empty prompt; prefill needs at least one token");
  steps_ = PrefillSteps{};
  steps_.tokens.assign(tokens.begin(), tokens.end());
  steps_.progress = progress;
  steps_.active = true;
}

void SequenceSession::check_prefill_step(int64_t max_tokens) const {
  RETROINFER_CHECK(steps_.active && !steps_.finished, "session: prefill_step without a prefill in progress");
  RETROINFER_CHECK(max_tokens >= 1, "session: prefill_step needs max_tokens >= 1, got ", max_tokens);
}

bool SequenceSession::prefill_step(int64_t max_tokens) {
  check_prefill_step(max_tokens);
  try {
    steps_.logits = prefill(steps_.tokens, false, steps_.progress);
  } catch (...) {
    steps_ = PrefillSteps{};  // the stepping ends with the error
    throw;
  }
  steps_.done = static_cast<int64_t>(steps_.tokens.size());
  steps_.finished = true;
  return true;
}

void SequenceSession::load_prefix(const KvPrefix&) {
  RETROINFER_FAIL("session: the ", device_name(device()), " runner does not reuse a prefilled prefix (prefix cache, "
                  "snapshots); use --device cpu, or run without --prefix-cache / --snapshot");
}

KvBlock SequenceSession::export_kv(int64_t, int64_t) const {
  RETROINFER_FAIL("session: the ", device_name(device()), " runner does not export its K/V (prefix cache, "
                  "snapshots); use --device cpu, or run without --prefix-cache / --snapshot");
}

std::vector<float> SequenceSession::take_prefill_logits() {
  RETROINFER_CHECK(steps_.active && steps_.finished, "session: take_prefill_logits before the prefill is done");
  std::vector<float> out = std::move(steps_.logits);
  steps_ = PrefillSteps{};
  return out;
}

Device parse_device(std::string_view s) {
  if (s == "cpu") return Device::kCpu;
  if (s == "cuda") return Device::kCuda;
  RETROINFER_FAIL("unknown device '", s, "': expected cpu or cuda");
}

}  // namespace retroinfer
