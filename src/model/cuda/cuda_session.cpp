// CudaSession: allocation, prefill, decode steps, fork and accessors (the layers are in forward.cpp, the
// layer-major prefill of sessions with host-tier layers in prefill_layers.cpp, the memory plan and the
// synthetic fill in session_plan.cpp).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <exception>
#include <thread>

#include "kernels/cuda_check.h"
#include "kernels/stream_priority.h"
#include "kernels/kernels.h"
#include "kernels/model_kernels.h"
#include "model/cuda/model_weights.h"
#include "model/cuda/pinned_relay.h"
#include "model/cuda/prefix_gpu_tier.h"
#include "kernels/prefill_attention_ref.h"
#include "model/cuda/session_state.h"
#include "retroinfer/error.h"
#include "retroinfer/fault_injection.h"

namespace retroinfer::cuda {
namespace {

void check_tokens(std::span<const int32_t> tokens, int64_t vocab, const char* where, int seq) {
  for (size_t i = 0; i < tokens.size(); ++i)
    RETROINFER_CHECK(tokens[i] >= 0 && tokens[i] < vocab, "CudaSession::", where, ": token id ", tokens[i],
                     " (sequence ", seq, ", index ", i, ") is outside the vocabulary [0, ", vocab, ")");
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Prefill progress one chunk behind the GPU. A report after each chunk that synchronises the stream would
// leave the GPU idle while the host prepares the next chunk (its RoPE table alone is ~1.2 us per token, ~40 ms
// at 32K): instead the chunk just issued is marked with an event and the report waits for the chunk before
// it, so one chunk is always queued while the host works.
class LaggedProgress {
 public:
  LaggedProgress(const PrefillProgress& progress, int64_t total) : progress_(progress), total_(total) {
    if (progress_) RETROINFER_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  }
  ~LaggedProgress() {
    if (done_ != nullptr) cudaEventDestroy(done_);  // no throw from a destructor
  }
  LaggedProgress(const LaggedProgress&) = delete;
  LaggedProgress& operator=(const LaggedProgress&) = delete;

  // `done` tokens are issued on st: reports the count issued before this chunk once the GPU has run it.
  void issued(int64_t done, cudaStream_t st) {
    if (!progress_) return;
    report_pending();
    RETROINFER_CUDA_CHECK(cudaEventRecord(done_, st));
    pending_ = done;
  }
  // After the last chunk: reports the last count once the GPU has run it.
  void finish() {
    if (progress_) report_pending();
  }

 private:
  void report_pending() {
    if (pending_ < 0) return;
    RETROINFER_CUDA_CHECK(cudaEventSynchronize(done_));
    progress_(pending_, total_);
    pending_ = -1;
  }
  const PrefillProgress& progress_;
  int64_t total_;
  cudaEvent_t done_ = nullptr;
  int64_t pending_ = -1;  // issued, not yet reported
};

}  // namespace

void CudaSession::Impl::decode_step(std::span<const int32_t> tokens) {
  Impl& im = *this;
  const ModelConfig& c = im.model.config();
  RETROINFER_CHECK(im.prefilled, "CudaSession::decode before prefill: run prefill (or fill_synthetic) first");
  RETROINFER_CHECK(static_cast<int>(tokens.size()) == im.num_seqs, "CudaSession::decode: ", tokens.size(),
                   " tokens for ", im.num_seqs, " sequences; pass one token per sequence");
  for (int s = 0; s < im.num_seqs; ++s) {
    check_tokens(tokens.subspan(s, 1), c.vocab_size, "decode", s);
    RETROINFER_CHECK(im.pos[s] + 1 <= im.max_context, "CudaSession::decode: sequence ", s, " is full (",
                     im.max_context, " tokens, the session's max_context); create the session with a longer context");
  }
  const int64_t half = c.head_dim / 2;
  im.staging->wait();
  for (int s = 0; s < im.num_seqs; ++s) {
    im.staging->tokens[s] = tokens[s];
    im.staging->seq[s] = s;
    im.staging->pos[s] = static_cast<int32_t>(im.pos[s]);
    // As the CPU runner: a decode step at position p uses the frequencies for sequence length p + 1.
    ::retroinfer::model::rope_table(im.frequencies(im.pos[s] + 1), im.pos[s], 1, im.staging->cos + s * half,
                      im.staging->sin + s * half);
  }
  im.upload_rows(im.num_seqs);
  im.last_stats = AttentionStats{};
  im.exact_stats_pending = true;
  im.exact_stats_valid = false;
  im.recording = im.timing;
  im.record_event(0);
  try {
    // Graphs from the second step after a (re)fill on: the first settles whatever the products tune lazily.
    const bool graphs = im.graphs_wanted && !im.graphs_failed && !im.recording && im.eager_decode_steps >= 1 &&
                        (!im.graph_exec.empty() || im.capture_decode_graphs());
    if (graphs) {
      im.decode_forward_graphs();
    } else {
      im.forward(im.num_seqs, true, 0, 0);
      im.lm_head(0, im.num_seqs);
      ++im.eager_decode_steps;
    }
  } catch (...) {
    im.recording = false;
    throw;
  }
  im.record_event(1);
  im.recording = false;
  for (auto& p : im.pos) ++p;
}

void CudaSession::Impl::collect_timing() {
  Impl& im = *this;
  im.last_ms.clear();
  if (!im.timing) return;
  auto ms = [&](int a, int b) {
    float t = 0.0f;
    RETROINFER_CUDA_CHECK(cudaEventElapsedTime(&t, static_cast<cudaEvent_t>(im.events[a]),
                                               static_cast<cudaEvent_t>(im.events[b])));
    return t;
  };
  float attention = 0.0f;
  for (int l = 0; l < im.model.config().num_layers; ++l) attention += ms(2 + 2 * l, 3 + 2 * l);
  const float total = ms(0, 1);
  im.last_ms = {{"attention", attention}, {"other", total - attention}};
}

OwnedStream::OwnedStream() {
  cudaStream_t st = nullptr;
  RETROINFER_CUDA_CHECK(cudaStreamCreateWithPriority(&st, cudaStreamDefault, detail::stream_priorities().compute));
  stream = st;
}

OwnedStream::~OwnedStream() {
  if (stream != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream));  // no throw from a destructor
    cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }
}

CudaSession::Impl::~Impl() {
  if (stream != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(stream));  // before freeing anything
  for (void* e : events) cudaEventDestroy(static_cast<cudaEvent_t>(e));
  drop_prefill_marks();  // a prefill that threw leaves its marks
  drop_decode_graphs();
}

CudaSession::CudaSession(const CudaModel& model, const CudaSessionOptions& opt, int num_seqs)
    : impl_(new Impl(model, opt, num_seqs)) {
  Impl& im = *impl_;
  const ModelConfig& c = model.config();
  validate(opt.attention);
  RETROINFER_CHECK(opt.kv_dtype != DType::kI8 || opt.attention.layer_budget_queries == 0, "CudaSession: retrieval ",
                   "budgets by layer (layer_budget_queries ", opt.attention.layer_budget_queries, ") are not calibrated ",
                   "over the 8-bit KV cache; use kv_dtype bf16 or layer_budget_queries 0");
  CudaSessionOptions planned = opt;
  if (const GpuPrefixTier* tier = model.prefix_gpu_tier()) planned.gpu_held_back_bytes += tier->held_back_bytes();
  im.plan = plan(c, planned, num_seqs, model.weight_bytes());  // throws when it does not fit
  im.max_context = im.plan.max_context;
  im.shape = AttentionShape{c.num_heads_q, c.num_heads_kv, c.head_dim};
  RETROINFER_CHECK(c.head_dim % 2 == 0 && c.head_dim <= model::kRefMaxHeadDim, "CudaSession: head_dim ",
                   c.head_dim, " is not supported (even, <= ", model::kRefMaxHeadDim, ")");
  RETROINFER_CHECK(im.max_context < (int64_t{1} << 31), "CudaSession: max_context ", im.max_context,
                   " exceeds the 2^31 positions the kernels index");

  im.rows_cap = session_rows(opt, im.max_context, num_seqs);
  im.logit_rows = session_logit_rows(im.rows_cap, num_seqs);
  const int64_t d = c.head_dim;
  const int group = c.num_heads_q / c.num_heads_kv;
  if ((d == 64 || d == 128) && group <= detail::kMaxGroup) im.prefill_attention.emplace(im.shape);

  // K/V for the GPU-tier layers the runner holds; one staging layer for those whose attention object owns its
  // KV (host tier, 8-bit KV cache; the plan counts both).
  RETROINFER_CHECK(im.plan.gpu_layers >= 0 && im.plan.gpu_layers <= c.num_layers, "CudaSession: the plan placed ",
                   im.plan.gpu_layers, " of ", c.num_layers, " layers on the GPU");
  const size_t kv_bytes = static_cast<size_t>(num_seqs) * im.seq_elems() * 2;
  for (int l = 0; l < im.plan.gpu_layers && !im.owns_kv(l); ++l) {
    im.k.emplace_back(kv_bytes);
    im.v.emplace_back(kv_bytes);
  }
  if (im.any_owned_kv()) {
    im.stage_k = DeviceBuffer(kv_bytes);
    im.stage_v = DeviceBuffer(kv_bytes);
  }
  im.allocate_activations();
  im.pos.assign(num_seqs, 0);
  im.tune_decode_gemms();
  im.tune_prefill_gemms();
  // RETROINFER_CUDA_SYNC=1 synchronises after every launch, which a stream capture forbids.
  im.graphs_wanted = opt.decode_graphs && !detail::sync_after_launch();
}

bool CudaSession::decode_graphs_active() const { return !impl_->graph_exec.empty(); }

CudaSession::~CudaSession() = default;

std::vector<float> CudaSession::prefill(const std::vector<std::vector<int32_t>>& prompts, bool all_logits,
                                        const PrefillProgress& progress) {
  Impl& im = *impl_;
  const ModelConfig& c = im.model.config();
  RETROINFER_CHECK(!im.prefilled, "CudaSession::prefill may run only once per session");
  RETROINFER_CHECK(static_cast<int>(prompts.size()) == im.num_seqs, "CudaSession::prefill: ", prompts.size(),
                   " prompts for a session of ", im.num_seqs, " sequences");
  RETROINFER_CHECK(!all_logits || im.num_seqs == 1, "CudaSession::prefill: all_logits needs num_seqs == 1, got ",
                   im.num_seqs);
  const int64_t prefix = static_cast<int64_t>(im.prefix_tokens.size());  // loaded by load_prefix (num_seqs 1)
  if (prefix > 0) {
    RETROINFER_CHECK(!all_logits, "CudaSession::prefill: all_logits after load_prefix (the prefix's positions "
                     "have no logits); prefill without all_logits, or without a prefix");
    const std::vector<int32_t>& p = prompts[0];
    RETROINFER_CHECK(static_cast<int64_t>(p.size()) > prefix && std::equal(im.prefix_tokens.begin(),
                                                                            im.prefix_tokens.end(), p.begin()),
                     "CudaSession::prefill: the prompt (", p.size(), " tokens) does not continue the loaded prefix (",
                     prefix, " tokens): it must start with the prefix's tokens and add at least one");
  }
  int64_t total = 0;
  for (int s = 0; s < im.num_seqs; ++s) {
    const int64_t n = static_cast<int64_t>(prompts[s].size());
    RETROINFER_CHECK(n >= 1, "CudaSession::prefill: prompt ", s, " is empty; prefill needs at least one token");
    RETROINFER_CHECK(n <= im.max_context, "CudaSession::prefill: prompt ", s, " has ", n,
                     " tokens but the session holds at most ", im.max_context,
                     " per sequence; shorten the prompt or raise max_context");
    check_tokens(prompts[s], c.vocab_size, "prefill", s);
    im.check_host_tier_length(n, "prefill");
    total += n;
  }
  im.index_build_s = 0.0;
  if (im.any_owned_kv()) {  // layers that own their KV take their whole bf16 K/V at once: layer-major
    std::vector<float> out = im.prefill_layer_major(prompts, all_logits, progress);
    im.prefilled = true;
  im.drop_decode_graphs();  // a (re)fill may have reallocated buffers the graphs captured
    return out;
  }
  const int64_t vocab = c.vocab_size;
  auto st = static_cast<cudaStream_t>(im.stream);
  std::vector<float> out(static_cast<size_t>((all_logits ? total : im.num_seqs) * vocab));
  int64_t done = 0;
  LaggedProgress lagged(progress, total);
  im.prefill_ms.clear();
  im.prefill_marking = im.prefill_timing;
  for (int s = 0; s < im.num_seqs; ++s) {
    const std::vector<int32_t>& p = prompts[s];
    const int64_t n = static_cast<int64_t>(p.size());
    // After a loaded prefix the first chunk ends where a cold prefill's chunk ends (a multiple of the chunk),
    // so every later chunk covers the rows a cold prefill's does.
    const int64_t chunk = im.opt.prefill_chunk;
    for (int64_t start = prefix; start < n;) {
      const int64_t m = std::min<int64_t>(chunk - start % chunk, n - start);
      im.staging->wait();
      for (int64_t i = 0; i < m; ++i) {
        im.staging->tokens[i] = p[start + i];
        im.staging->seq[i] = s;
        im.staging->pos[i] = static_cast<int32_t>(start + i);
      }
      // As the CPU runner: prefill uses the frequencies for the whole prompt's length (dynamic RoPE).
      ::retroinfer::model::rope_table(im.frequencies(n), start, m, im.staging->cos, im.staging->sin);
      im.upload_rows(m);
      im.mark_prefill();
      im.forward(m, false, s, start);
      im.mark_prefill();
      if (all_logits) {
        for (int64_t b0 = 0; b0 < m; b0 += im.logit_rows) {
          const int64_t cnt = std::min(im.logit_rows, m - b0);
          im.lm_head(b0, cnt);
          RETROINFER_CUDA_CHECK(cudaMemcpyAsync(out.data() + (start + b0) * vocab, im.a.logits.data(),
                                                cnt * vocab * 4, cudaMemcpyDeviceToHost, st));
          synchronize(im.stream);
        }
      } else if (start + m == n) {
        im.lm_head(m - 1, 1);
        RETROINFER_CUDA_CHECK(cudaMemcpyAsync(out.data() + s * vocab, im.a.logits.data(), vocab * 4,
                                              cudaMemcpyDeviceToHost, st));
      }
      done += m;
      start += m;
      lagged.issued(done, st);
    }
    im.pos[s] = n;
  }
  lagged.finish();
  im.prefix_tokens.clear();
  im.prefill_marking = false;
  im.build_attention();
  synchronize(im.stream);
  if (!im.prefill_marks.empty()) im.collect_prefill_timing();
  im.prefilled = true;
  im.drop_decode_graphs();  // a (re)fill may have reallocated buffers the graphs captured
  return out;
}

void CudaSession::Impl::make_attention() {
  attn.clear();
  const int L = num_layers();
  attn_per_seq = std::any_of(pos.begin(), pos.end(), [&](int64_t p) { return p != pos[0]; });
  auto tier = [&](int l) { return host_tier(l) ? KvTier::kHost : KvTier::kGpu; };
  auto kv_dtype = [&](int l) { return host_tier(l) ? DType::kBF16 : opt.kv_dtype; };  // the host tier: its store
  ClusterTraceWriter* trace = opt.cluster_trace.get();
  if (!attn_per_seq) {
    for (int l = 0; l < L; ++l) {
      attn.push_back(make_layer_attention(shape, opt.attention, num_seqs, max_context, tier(l), opt.wave, kv_dtype(l)));
      if (trace != nullptr) attn.back()->set_cluster_trace(trace, l, 0);
      if (opt.query_trace) attn.back()->set_query_trace(opt.query_trace.get(), l, 0);
    }
  } else {
    for (int s = 0; s < num_seqs; ++s)
      for (int l = 0; l < L; ++l) {
        attn.push_back(make_layer_attention(shape, opt.attention, 1, max_context, tier(l), opt.wave, kv_dtype(l)));
        if (trace != nullptr) attn.back()->set_cluster_trace(trace, l, s);
        if (opt.query_trace) attn.back()->set_query_trace(opt.query_trace.get(), l, s);
      }
  }
}

void CudaSession::Impl::attention_prefill_done(int l) { attention_prefill_done_on(l, stream); }

void CudaSession::Impl::attention_prefill_done_on(int l, Stream on) {
  const int L = num_layers();
  RETROINFER_CHECK(static_cast<int64_t>(attn.size()) == (attn_per_seq ? int64_t{num_seqs} * L : L),
                   "CudaSession: attention objects missing for layer ", l);
  if (!attn_per_seq) {
    attn[static_cast<size_t>(l)]->prefill_done(prefill_k(l), prefill_v(l), pos[0], max_context, on);
  } else {
    for (int s = 0; s < num_seqs; ++s)
      attn[static_cast<size_t>(s) * L + l]->prefill_done(prefill_k(l) + s * seq_elems(), prefill_v(l) + s * seq_elems(),
                                                         pos[s], max_context, on);
  }
  // A host-tier layer has copied the staging buffer when prefill_done returns (its build is synchronous);
  // the sync also orders a GPU-tier index build before whatever the caller does next.
  synchronize(on);
}

void CudaSession::Impl::timed_build(const std::function<void()>& work) {
  synchronize(stream);
  const auto t0 = std::chrono::steady_clock::now();
  work();
  synchronize(stream);
  index_build_s += seconds_since(t0);
}

void CudaSession::Impl::timed_prefill_done(int l) {
  timed_build([&] { attention_prefill_done(l); });
}

void CudaSession::Impl::build_attention() {
  index_build_s = 0.0;
  timed_build([&] { build_attention_layers(); });
}

double CudaSession::index_build_seconds() const { return impl_->index_build_s; }

void CudaSession::Impl::build_attention_layers() {
  make_attention();
  // A layer's index build is about half host work (launches, buffer sizing) and half GPU work, one after the
  // other (retro at 128K: ~6 ms each per layer). Two threads on two streams build alternate layers, so one's
  // host work runs while the other's kernels do. Only with room for a second build workspace beside the plan's
  // one (the builds' transient memory, a fraction of a layer's K/V: free memory above one layer's K/V and
  // 1 GiB), else one after the other.
  const int L = num_layers();
  const int64_t layer_kv_bytes = int64_t{num_seqs} * seq_elems() * 2 * 2;
  size_t free_bytes = 0, total_bytes = 0;
  const bool parallel = opt.attention.kind == AttentionKind::kRetro && L >= 2 && !any_owned_kv() &&
                        cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess &&
                        static_cast<int64_t>(free_bytes) > layer_kv_bytes + (int64_t{1} << 30);
  if (!parallel) {
    for (int l = 0; l < L; ++l) attention_prefill_done(l);
    calibrate_layer_budgets();
    return;
  }
  // The builds read the K/V the prefill wrote on `stream`: both streams start after it.
  synchronize(stream);
  StreamHandle second;
  std::exception_ptr failed;
  std::thread odd([&] {
    try {
      for (int l = 1; l < L; l += 2) attention_prefill_done_on(l, second.get());
    } catch (...) {
      failed = std::current_exception();
    }
  });
  std::exception_ptr failed_even;
  try {
    for (int l = 0; l < L; l += 2) attention_prefill_done_on(l, stream);
  } catch (...) {
    failed_even = std::current_exception();
  }
  odd.join();
  if (failed_even) std::rethrow_exception(failed_even);
  if (failed) std::rethrow_exception(failed);
  calibrate_layer_budgets();
}

void CudaSession::decode(std::span<const int32_t> tokens, std::span<float> logits) {
  Impl& im = *impl_;
  const int64_t vocab = im.model.config().vocab_size;
  RETROINFER_CHECK(static_cast<int64_t>(logits.size()) == im.num_seqs * vocab, "CudaSession::decode: logits span of ",
                   logits.size(), " floats, expected num_seqs * vocab = ", im.num_seqs * vocab);
  if (fault::should_fail(fault::Point::kDecodeStep))
    RETROINFER_FAIL("CudaSession::decode: the decode step failed (injected fault decode_step)");
  const auto t0 = std::chrono::steady_clock::now();
  im.decode_step(tokens);
  // (The copy into pageable memory below waits for the step: the issue time ends before it.)
  im.issue_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RETROINFER_CUDA_CHECK(cudaMemcpyAsync(logits.data(), im.a.logits.data(), logits.size() * 4, cudaMemcpyDeviceToHost,
                                        static_cast<cudaStream_t>(im.stream)));
  synchronize(im.stream);
  im.collect_timing();
  im.count_wave_traffic();
}

void CudaSession::decode_greedy(std::span<const int32_t> tokens, std::span<int32_t> next) {
  Impl& im = *impl_;
  RETROINFER_CHECK(static_cast<int>(next.size()) == im.num_seqs, "CudaSession::decode_greedy: next span of ",
                   next.size(), " tokens, expected num_seqs = ", im.num_seqs);
  if (fault::should_fail(fault::Point::kDecodeStep))
    RETROINFER_FAIL("CudaSession::decode_greedy: the decode step failed (injected fault decode_step)");
  const auto t0 = std::chrono::steady_clock::now();
  im.decode_step(tokens);
  auto st = static_cast<cudaStream_t>(im.stream);
  model::ArgmaxParams p;
  p.logits = im.a.logits.as<float>();
  p.next = im.a.next.as<int32_t>();
  p.rows = im.num_seqs;
  p.vocab = im.model.config().vocab_size;
  detail::launch_check(model::argmax_rows(p, st), "argmax_rows", st);
  // (The copy into pageable memory below waits for the step: the issue time ends before it.)
  im.issue_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  RETROINFER_CUDA_CHECK(cudaMemcpyAsync(next.data(), im.a.next.data(), next.size() * 4, cudaMemcpyDeviceToHost, st));
  synchronize(im.stream);
  im.collect_timing();
  im.count_wave_traffic();
  for (size_t s = 0; s < next.size(); ++s)
    RETROINFER_CHECK(next[s] >= 0, "CudaSession::decode_greedy: every logit of sequence ", s,
                     " is NaN; the forward pass diverged");
}

bool CudaSession::supports_prefix() const { return impl_->num_seqs == 1 && !impl_->any_owned_kv(); }

namespace {
// Throws Error unless session s can take or give prefix K/V (what load_prefix / export_kv need).
void check_prefix_session(const CudaSession& s, int host_layers, DType kv_dtype, const char* what) {
  RETROINFER_CHECK(s.num_seqs() == 1, "CudaSession::", what, ": the session holds ", s.num_seqs(),
                   " sequences; prefix reuse takes one-sequence sessions");
  RETROINFER_CHECK(kv_dtype == DType::kBF16, "CudaSession::", what, ": this session keeps an 8-bit (",
                   dtype_name(kv_dtype), ") KV cache, which prefix reuse does not copy; use --kv-dtype bf16, or run ",
                   "without --prefix-cache / --snapshot");
  RETROINFER_CHECK(host_layers == 0, "CudaSession::", what, ": ", host_layers, " layer(s) of this session keep ",
                   "their KV in host memory (wave buffer), which prefix reuse does not copy; use --kv-placement gpu ",
                   "(every layer's KV on the GPU), or run without --prefix-cache / --snapshot");
}
}  // namespace

void CudaSession::load_prefix(const KvPrefix& prefix) {
  Impl& im = *impl_;
  check_prefix_session(*this, im.num_layers() - im.plan.gpu_layers, im.opt.kv_dtype, "load_prefix");
  RETROINFER_CHECK(!im.prefilled && im.pos[0] == 0 && im.prefix_tokens.empty(),
                   "CudaSession::load_prefix needs a fresh session (nothing prefilled or loaded)");
  RETROINFER_CHECK(!prefix.tokens.empty(), "CudaSession::load_prefix got an empty prefix");
  const ModelConfig& c = im.model.config();
  const int64_t n = prefix.size();
  RETROINFER_CHECK(n < im.max_context, "CudaSession::load_prefix: the prefix has ", n,
                   " tokens but the session holds at most ", im.max_context, " (prefix + prompt + new tokens)");
  check_tokens(prefix.tokens, c.vocab_size, "load_prefix", 0);
  int64_t sum = 0;
  for (const auto& b : prefix.blocks) {
    RETROINFER_CHECK(b != nullptr, "CudaSession::load_prefix got a null block");
    RETROINFER_CHECK(b->num_layers == c.num_layers && b->num_heads_kv == c.num_heads_kv && b->head_dim == c.head_dim,
                     "CudaSession::load_prefix: the prefix's K/V is of ", b->num_layers, " layers x ", b->num_heads_kv,
                     " KV heads x head_dim ", b->head_dim, " but the model has ", c.num_layers, " x ", c.num_heads_kv,
                     " x ", c.head_dim, "; it was made with another model");
    RETROINFER_CHECK(b->dtype == DType::kBF16, "CudaSession::load_prefix: the prefix's K/V is ", dtype_name(b->dtype),
                     " but the CUDA runner's KV cache is bf16; make it on the CUDA runner or on the CPU with ",
                     "--kv-dtype bf16");
    RETROINFER_CHECK(static_cast<int64_t>(b->bytes.size()) == 2LL * c.num_layers * c.num_heads_kv * b->run_bytes(),
                     "CudaSession::load_prefix: a prefix block of ", b->tokens, " tokens holds ", b->bytes.size(),
                     " bytes, not ", 2LL * c.num_layers * c.num_heads_kv * b->run_bytes());
    sum += b->tokens;
  }
  RETROINFER_CHECK(sum == n, "CudaSession::load_prefix: the prefix's blocks hold ", sum, " tokens but it names ", n);
  // k[l] / v[l]: [Hkv, max_context, D] for the one sequence; a block's (layer, K or V) rows are [Hkv, tokens, D]:
  // one 2-D piece per (layer, K or V, block), Hkv rows of the block's run bytes: from the block's device copy
  // in the model's prefix GPU tier when it has one (one kernel for all of them), else through the pinned relay.
  const size_t pitch = static_cast<size_t>(im.max_context) * c.head_dim * 2;
  GpuPrefixTier* tier = im.model.prefix_gpu_tier();
  GpuCopyLeases leases(tier);
  std::vector<RelayPiece> relayed;
  std::vector<DeviceCopyPiece> copied;
  int64_t at = 0;
  for (const auto& b : prefix.blocks) {
    const uint8_t* copy = tier != nullptr ? leases.take(b->device_copy.get()) : nullptr;
    for (int l = 0; l < c.num_layers; ++l)
      for (int kv = 0; kv < 2; ++kv) {
        auto* dst = static_cast<uint8_t*>((kv == 0 ? im.k : im.v)[l].data()) + static_cast<size_t>(at) * c.head_dim * 2;
        const auto width = static_cast<uint64_t>(b->run_bytes());
        if (copy != nullptr)
          copied.push_back({copy + (b->run(l, kv, 0) - b->bytes.data()), dst, width,
                            static_cast<uint64_t>(c.num_heads_kv), width, pitch});
        else
          relayed.push_back({const_cast<uint8_t*>(b->run(l, kv, 0)), dst, width, static_cast<size_t>(c.num_heads_kv), pitch});
      }
    at += b->tokens;
  }
  copy_device_pieces(copied, im.stream);  // returns once done: the leases may end
  relay_to_device(relayed, im.stream);    // synchronous: the blocks may go once this returns
  im.pos[0] = n;
  im.prefix_tokens = prefix.tokens;
}

KvBlock CudaSession::export_kv(int64_t from, int64_t to) const {
  const Impl& im = *impl_;
  check_prefix_session(*this, im.num_layers() - im.plan.gpu_layers, im.opt.kv_dtype, "export_kv");
  RETROINFER_CHECK(0 <= from && from < to && to <= im.pos[0], "CudaSession::export_kv of positions [", from, ", ", to,
                   ") outside the ", im.pos[0], " tokens in the cache");
  const ModelConfig& c = im.model.config();
  KvBlock b;
  b.num_layers = c.num_layers;
  b.num_heads_kv = c.num_heads_kv;
  b.head_dim = c.head_dim;
  b.dtype = DType::kBF16;
  b.tokens = to - from;
  b.bytes.resize(2 * static_cast<size_t>(c.num_layers) * c.num_heads_kv * b.run_bytes());
  const size_t pitch = static_cast<size_t>(im.max_context) * c.head_dim * 2;
  std::vector<RelayPiece> pieces;
  for (int l = 0; l < c.num_layers; ++l)
    for (int kv = 0; kv < 2; ++kv) {
      auto* src = static_cast<uint8_t*>(const_cast<void*>((kv == 0 ? im.k : im.v)[l].data())) +
                  static_cast<size_t>(from) * c.head_dim * 2;
      pieces.push_back({b.run(l, kv, 0), src, static_cast<size_t>(b.run_bytes()), static_cast<size_t>(c.num_heads_kv),
                        pitch});
    }
  // The model's prefix GPU tier keeps a device copy of the block (in the block's layout) when it has room.
  if (GpuPrefixTier* tier = im.model.prefix_gpu_tier()) {
    if (std::shared_ptr<GpuBlockCopy> copy = tier->make_copy(static_cast<int64_t>(b.bytes.size()))) {
      GpuCopyLeases leases(tier);
      leases.adopt(copy.get());  // leased by make_copy until filled
      uint8_t* base = tier->data_of(*copy);
      std::vector<DeviceCopyPiece> copies;
      for (const RelayPiece& p : pieces)
        copies.push_back({p.device, base + (p.host - b.bytes.data()), p.width, p.rows, p.device_pitch, p.width});
      copy_device_pieces(copies, im.stream);
      b.device_copy = std::move(copy);
    }
  }
  relay_to_host(pieces, im.stream);
  return b;
}

std::unique_ptr<CudaSession> CudaSession::fork(const AttentionConfig& attention) const {
  const Impl& im = *impl_;
  RETROINFER_CHECK(im.prefilled, "CudaSession::fork needs a prefilled session");
  RETROINFER_CHECK(!im.any_host_tier(), "CudaSession::fork: ", im.num_layers() - im.plan.gpu_layers,
                   " layer(s) of this session keep their KV in host memory (wave buffer), which fork cannot copy; "
                   "fork a session with every layer on the GPU (placement gpu)");
  RETROINFER_CHECK(im.opt.kv_dtype == DType::kBF16, "CudaSession::fork: this session keeps an 8-bit (",
                   dtype_name(im.opt.kv_dtype), ") KV cache in its attention objects, which fork cannot copy; fork ",
                   "a session with --kv-dtype bf16");
  CudaSessionOptions o = im.opt;
  o.attention = attention;
  o.max_context = im.max_context;
  o.placement = KvPlacement::kGpu;  // as this session (kAuto could re-plan a split with less memory free now)
  auto f = std::make_unique<CudaSession>(im.model, o, im.num_seqs);
  Impl& fi = *f->impl_;
  auto st = static_cast<cudaStream_t>(fi.stream);
  for (size_t l = 0; l < im.k.size(); ++l) {
    RETROINFER_CUDA_CHECK(cudaMemcpyAsync(fi.k[l].data(), im.k[l].data(), im.k[l].bytes(), cudaMemcpyDeviceToDevice, st));
    RETROINFER_CUDA_CHECK(cudaMemcpyAsync(fi.v[l].data(), im.v[l].data(), im.v[l].bytes(), cudaMemcpyDeviceToDevice, st));
  }
  fi.pos = im.pos;
  fi.copy_prompt_queries(im);
  fi.build_attention();
  fi.prefilled = true;
  fi.drop_decode_graphs();
  return f;
}

int CudaSession::num_seqs() const { return impl_->num_seqs; }
std::vector<int64_t> CudaSession::positions() const { return impl_->pos; }
int64_t CudaSession::max_context() const { return impl_->max_context; }
const CudaSessionPlan& CudaSession::memory_plan() const { return impl_->plan; }
const CudaSessionOptions& CudaSession::options() const { return impl_->opt; }
const CudaModel& CudaSession::model() const { return impl_->model; }
const AttentionStats& CudaSession::last_stats() const {
  Impl& im = *impl_;
  if (im.opt.exact_stats && im.exact_stats_pending) {
    synchronize(im.stream);
    AttentionStats sum;
    for (auto& la : im.attn) sum += la->exact_stats();
    im.exact_last_stats = sum;
    im.exact_stats_pending = false;
    im.exact_stats_valid = true;
  }
  return im.exact_stats_valid ? im.exact_last_stats : im.last_stats;
}

void CudaSession::set_prefill_timing(bool on) { impl_->prefill_timing = on; }

std::vector<std::pair<std::string, float>> CudaSession::last_prefill_ms() const { return impl_->prefill_ms; }

void CudaSession::Impl::mark_prefill() {
  if (!prefill_marking) return;
  cudaEvent_t e = nullptr;
  RETROINFER_CUDA_CHECK(cudaEventCreate(&e));
  prefill_marks.push_back(e);  // owned before the record can throw
  RETROINFER_CUDA_CHECK(cudaEventRecord(e, static_cast<cudaStream_t>(stream)));
}

void CudaSession::Impl::drop_prefill_marks() {
  for (void* e : prefill_marks) cudaEventDestroy(static_cast<cudaEvent_t>(e));  // no throw: also from ~Impl
  prefill_marks.clear();
  prefill_marking = false;
}

void CudaSession::Impl::collect_prefill_timing() {
  const int L = num_layers();
  const size_t per_chunk = 2 + 2 * static_cast<size_t>(L);  // start, (before, after attention) x L, end
  auto ms = [&](size_t a, size_t b) {
    float t = 0.0f;
    RETROINFER_CUDA_CHECK(cudaEventElapsedTime(&t, static_cast<cudaEvent_t>(prefill_marks[a]),
                                               static_cast<cudaEvent_t>(prefill_marks[b])));
    return t;
  };
  const size_t n = prefill_marks.size();
  if (n == 0 || n % per_chunk != 0) {
    drop_prefill_marks();
    return;
  }
  float attention = 0.0f, layers = 0.0f, start = 0.0f, end = 0.0f, between = 0.0f;
  for (size_t c = 0; c < n; c += per_chunk) {
    start += ms(c, c + 1);
    for (int l = 0; l < L; ++l) {
      attention += ms(c + 1 + 2 * l, c + 2 + 2 * l);
      if (l + 1 < L) layers += ms(c + 2 + 2 * l, c + 3 + 2 * l);
    }
    end += ms(c + per_chunk - 2, c + per_chunk - 1);
    if (c + per_chunk < n) between += ms(c + per_chunk - 1, c + per_chunk);
  }
  prefill_ms = {{"attention", attention}, {"layers", layers},       {"chunk_start", start},
                {"chunk_end", end},        {"between_chunks", between}, {"gpu_total", ms(0, n - 1)}};
  drop_prefill_marks();
}

void CudaSession::set_step_timing(bool on) {
  Impl& im = *impl_;
  if (on && im.events.empty()) {
    const int n = 2 + 2 * im.model.config().num_layers;
    for (int i = 0; i < n; ++i) {
      cudaEvent_t e = nullptr;
      RETROINFER_CUDA_CHECK(cudaEventCreate(&e));
      im.events.push_back(e);
    }
  }
  im.timing = on;
  im.last_ms.clear();
}

std::vector<std::pair<std::string, float>> CudaSession::last_step_ms() const { return impl_->last_ms; }
double CudaSession::host_issue_seconds() const { return impl_->issue_s; }

void CudaSession::Impl::count_wave_traffic() {
  if (!opt.count_wave_traffic || !any_host_tier()) return;
  WaveStepCounts step;
  WaveBufferStats totals;
  for (auto& la : attn) la->add_wave_counts(step, totals);
  traffic.step_bytes = step.miss_rows * store_token_bytes(opt.wave.store_dtype, shape.head_dim);
  traffic.total_bytes += traffic.step_bytes;
  ++traffic.steps;
}

const CudaWaveTraffic& CudaSession::wave_traffic() const { return impl_->traffic; }

CudaWaveCounts CudaSession::last_wave_counts() {
  Impl& im = *impl_;
  CudaWaveCounts r;
  synchronize(im.stream);
  for (auto& la : im.attn)
    if (la->add_wave_counts(r.step, r.totals)) {
      ++r.objects;
      if (im.opt.wave.stage_times) la->add_wave_stage_times(r.stages);
    }
  return r;
}

}  // namespace retroinfer::cuda
