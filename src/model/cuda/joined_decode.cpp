// CudaJoinedDecoder (cuda_model.h): one decode step of several one-sequence CudaSessions in one call, the
// continuous-batching path of the batch scheduler on CUDA. The decoder keeps a CudaSession::Impl of its own
// with `joint` set: activation buffers, row staging, a Gemm and a stream for up to `cap` rows, but no KV and
// no attention objects. Row i is session i's token: the embedding, norms, products and LM head run over all
// rows through the same Impl methods as a session's decode (forward.cpp); qkv_post writes each row's K/V to
// k_new / v_new only, kv_append_rows copies them into each session's cache at its position (GPU-tier layers),
// and each session's own LayerAttention attends from the decoder's q rows into the decoder's attention rows
// (a host-tier layer's WaveLayerAttention appends the row's k_new / v_new to its own steady zone first, as in
// the session's own decode).
//
// Streams within one layer: the decoder's stream runs the segment (norms, products, RoPE, KV append), then
// records `layer_ready`. Each session whose layer is host-tier waits for it on its own stream, launches its
// attention there (the wave buffer's gather reads the misses over PCIe) and records its `attn_done` event;
// the GPU-tier sessions' attention then launches on the decoder's stream, so the gathers overlap it. The
// decoder's stream waits for every `attn_done` before the next segment reads the attention rows and
// overwrites q / k_new / v_new. No host synchronisation inside a layer (a wave buffer's index update, due
// every update_tokens steps, synchronises as in the session's own decode); the segments stay graphs.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/kernels.h"
#include "kernels/model_kernels.h"
#include "model/cuda/session_state.h"
#include "model/rope.h"
#include "retroinfer/error.h"
#include "retroinfer/fault_injection.h"

namespace retroinfer::cuda {

struct CudaJoinedDecoder::Impl {
  const CudaModel& model;
  std::unique_ptr<CudaSession::Impl> j;  // the joint rows: j->rows_cap of them (0 before the first decode)
  void* order = nullptr;                 // cudaEvent_t: each session's stream before the decoder's
  void* layer_ready = nullptr;           // cudaEvent_t: the decoder's stream after a layer's segment
  std::vector<void*> attn_done;          // cudaEvent_t [cap]: row i's host-tier attention on its session's stream
  model::KvAppendRow* host_dst = nullptr;  // pinned [layers, cap]: every row's cache and position per layer
  DeviceBuffer dev_dst;                    // the same on the device
  int cap = 0;
  // CUDA graphs of a step's non-attention work per row count n (as a session's decode graphs: graph i = the
  // work between layer i - 1's attention and layer i's; i = 0 starts with the embedding, i = L ends with the
  // LM head), captured at the second step of an n (the first, eager, settles the products' lazy tuning);
  // every session's attention launches eagerly between them. Dropped when the rows are reallocated.
  std::map<int, std::vector<void*>> graphs;
  std::set<int> eager_once;  // row counts that ran one eager step since the rows were (re)allocated
  bool graphs_wanted = false;  // the decoder's decode_graphs, unless RETROINFER_CUDA_SYNC forbids capture
  bool graphs_failed = false;

  Impl(const CudaModel& m, bool decode_graphs)
      : model(m), graphs_wanted(decode_graphs && !detail::sync_after_launch()) {}

  // After a step's results were downloaded (synchronised): every session holds one token more.
  static void advance(std::span<CudaSession* const> sessions) {
    for (CudaSession* x : sessions) {
      ++x->impl_->pos[0];
      x->impl_->count_wave_traffic();  // the step's work finished: the decoder synchronised its stream
    }
  }

  // Why session s cannot join a decoder of `m` (empty: it can).
  static std::string refusal(const CudaSession::Impl& s, const CudaModel& m) {
    if (&s.model != &m) return "it belongs to another model";
    if (s.num_seqs != 1) return "it holds " + std::to_string(s.num_seqs) + " sequences (one per session joins)";
    if (!s.prefilled) return "it is not prefilled";
    return {};
  }

  ~Impl() {
    drop_graphs();
    if (order != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(order));
    if (layer_ready != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(layer_ready));
    for (void* e : attn_done) cudaEventDestroy(static_cast<cudaEvent_t>(e));
    if (host_dst != nullptr) cudaFreeHost(host_dst);
  }

  void drop_graphs() {
    for (auto& [n, g] : graphs)
      for (void* e : g)
        if (e != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(e));  // no throw: also from ~Impl
    graphs.clear();
    eager_once.clear();
  }

  // Segment i of a step over n rows (see graphs): what runs between two layers' attention.
  void segment(int i, int n) {
    CudaSession::Impl& J = *j;
    const ModelConfig& c = model.config();
    const int L = c.num_layers;
    const RowView rv = J.staged_rows();
    float* x = J.a.x.as<float>();
    auto js = static_cast<cudaStream_t>(J.stream);
    if (i == 0) J.embed(n, rv, x);
    else J.layer_post_attention(i - 1, n, x);
    if (i == L) {
      J.lm_head(0, n);
      return;
    }
    J.layer_pre_attention(i, n, rv, x, true);
    model::KvAppendParams kp;
    kp.k_new = J.a.k_new.as<uint16_t>();
    kp.v_new = J.a.v_new.as<uint16_t>();
    kp.dst = dev_dst.as<model::KvAppendRow>() + size_t(i) * n;
    kp.rows = n;
    kp.num_heads_kv = c.num_heads_kv;
    kp.head_dim = c.head_dim;
    detail::launch_check(model::kv_append_rows(kp, js), "kv_append_rows", js);
  }

  // The graphs of n rows, captured now if they are due and missing; null when the step runs eagerly.
  const std::vector<void*>* graphs_for(int n) {
    if (!graphs_wanted || graphs_failed) return nullptr;
    if (auto it = graphs.find(n); it != graphs.end()) return &it->second;
    if (eager_once.count(n) == 0) return nullptr;
    std::vector<void*> g;
    const std::string why =
        capture_graphs(j->stream, model.config().num_layers + 1, [&](int i) { segment(i, n); }, g);
    if (why.empty()) return &(graphs[n] = std::move(g));
    for (void* e : g) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(e));
    graphs_failed = true;
    std::fprintf(stderr, "[retroinfer] joined decode CUDA graphs off (capture failed: %s); launching eagerly\n",
                 why.c_str());
    return nullptr;
  }

  // Buffers for at least n rows (grown to twice the old size or n, whichever is larger).
  void ensure(int n) {
    if (n <= cap) return;
    const ModelConfig& c = model.config();
    const int new_cap = std::max(n, 2 * cap);
    drop_graphs();  // they hold the old rows' pointers
    j.reset();      // nothing pending: every decode synchronises before it returns
    CudaSessionOptions o;
    o.decode_graphs = false;
    auto ji = std::make_unique<CudaSession::Impl>(model, o, new_cap);
    ji->joint = true;
    ji->max_context = 1;  // no KV of its own
    ji->shape = AttentionShape{c.num_heads_q, c.num_heads_kv, c.head_dim};
    ji->plan.num_seqs = new_cap;
    ji->plan.gpu_layers = c.num_layers;  // every layer "GPU tier": qkv_post's cache pointers come from `joint`
    ji->rows_cap = new_cap;
    ji->logit_rows = new_cap;
    ji->allocate_activations();
    ji->pos.assign(new_cap, 0);
    ji->prefilled = true;
    if (host_dst != nullptr) {
      RETROINFER_CUDA_CHECK(cudaFreeHost(host_dst));
      host_dst = nullptr;
    }
    const size_t dst_bytes = size_t(c.num_layers) * new_cap * sizeof(model::KvAppendRow);
    RETROINFER_CUDA_CHECK(cudaMallocHost(reinterpret_cast<void**>(&host_dst), dst_bytes));
    dev_dst = DeviceBuffer(dst_bytes);
    auto make_event = [] {
      cudaEvent_t e = nullptr;
      RETROINFER_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      return static_cast<void*>(e);
    };
    if (order == nullptr) order = make_event();
    if (layer_ready == nullptr) layer_ready = make_event();
    while (static_cast<int>(attn_done.size()) < new_cap) attn_done.push_back(make_event());
    j = std::move(ji);
    cap = new_cap;
  }
};

CudaJoinedDecoder::CudaJoinedDecoder(const CudaModel& model, bool decode_graphs)
    : impl_(std::make_unique<Impl>(model, decode_graphs)) {}
CudaJoinedDecoder::~CudaJoinedDecoder() = default;

const CudaModel& CudaJoinedDecoder::model() const { return impl_->model; }

bool CudaJoinedDecoder::takes(const CudaSession& s) const { return Impl::refusal(*s.impl_, impl_->model).empty(); }

void CudaJoinedDecoder::decode(std::span<CudaSession* const> sessions, std::span<const int32_t> tokens,
                               std::span<float> logits) {
  const int64_t n = static_cast<int64_t>(sessions.size()), vocab = impl_->model.config().vocab_size;
  RETROINFER_CHECK(n >= 1, "CudaJoinedDecoder::decode: no sessions");
  RETROINFER_CHECK(static_cast<int64_t>(logits.size()) == n * vocab, "CudaJoinedDecoder::decode: logits span of ",
                   logits.size(), " floats, expected sessions * vocab = ", n * vocab);
  if (fault::should_fail(fault::Point::kDecodeStep))
    RETROINFER_FAIL("CudaJoinedDecoder::decode: the joined decode step of ", n, " sequences failed (injected fault decode_step)");
  step(sessions, tokens);
  CudaSession::Impl& J = *impl_->j;
  RETROINFER_CUDA_CHECK(cudaMemcpyAsync(logits.data(), J.a.logits.data(), logits.size() * 4, cudaMemcpyDeviceToHost,
                                        static_cast<cudaStream_t>(J.stream)));
  synchronize(J.stream);
  impl_->advance(sessions);
}

void CudaJoinedDecoder::decode_greedy(std::span<CudaSession* const> sessions, std::span<const int32_t> tokens,
                                      std::span<int32_t> next) {
  RETROINFER_CHECK(next.size() == sessions.size(), "CudaJoinedDecoder::decode_greedy: next span of ", next.size(),
                   " tokens, expected one per session = ", sessions.size());
  step(sessions, tokens);
  CudaSession::Impl& J = *impl_->j;
  auto js = static_cast<cudaStream_t>(J.stream);
  model::ArgmaxParams p;
  p.logits = J.a.logits.as<float>();
  p.next = J.a.next.as<int32_t>();
  p.rows = static_cast<int64_t>(next.size());
  p.vocab = impl_->model.config().vocab_size;
  detail::launch_check(model::argmax_rows(p, js), "argmax_rows", js);
  RETROINFER_CUDA_CHECK(cudaMemcpyAsync(next.data(), J.a.next.data(), next.size() * 4, cudaMemcpyDeviceToHost, js));
  synchronize(J.stream);
  impl_->advance(sessions);
  for (size_t i = 0; i < next.size(); ++i)
    RETROINFER_CHECK(next[i] >= 0, "CudaJoinedDecoder::decode_greedy: every logit of session ", i,
                     " is NaN; the forward pass diverged");
}

void CudaJoinedDecoder::step(std::span<CudaSession* const> sessions, std::span<const int32_t> tokens) {
  Impl& im = *impl_;
  const ModelConfig& c = im.model.config();
  const int64_t vocab = c.vocab_size;
  const int n = static_cast<int>(sessions.size());
  RETROINFER_CHECK(n >= 1, "CudaJoinedDecoder::decode: no sessions");
  RETROINFER_CHECK(static_cast<int64_t>(tokens.size()) == n, "CudaJoinedDecoder::decode: ", tokens.size(),
                   " tokens for ", n, " sessions; pass one token per session");
  std::vector<CudaSession::Impl*> s(n);
  for (int i = 0; i < n; ++i) {
    RETROINFER_CHECK(sessions[i] != nullptr, "CudaJoinedDecoder::decode: session ", i, " is null");
    s[i] = sessions[i]->impl_.get();
    const std::string why = Impl::refusal(*s[i], im.model);
    RETROINFER_CHECK(why.empty(), "CudaJoinedDecoder::decode: session ", i, " cannot join: ", why);
    for (int k = 0; k < i; ++k)
      RETROINFER_CHECK(s[k] != s[i], "CudaJoinedDecoder::decode: sessions ", k, " and ", i, " are the same session");
    RETROINFER_CHECK(s[i]->pos[0] + 1 <= s[i]->max_context, "CudaJoinedDecoder::decode: session ", i, " is full (",
                     s[i]->max_context, " tokens, its max_context)");
    RETROINFER_CHECK(tokens[i] >= 0 && tokens[i] < vocab, "CudaJoinedDecoder::decode: token id ", tokens[i],
                     " (session ", i, ") is outside the vocabulary [0, ", vocab, ")");
  }
  im.ensure(n);
  CudaSession::Impl& J = *im.j;
  auto js = static_cast<cudaStream_t>(J.stream);
  // Whatever a session's own stream still holds comes first.
  for (int i = 0; i < n; ++i) {
    RETROINFER_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(im.order), static_cast<cudaStream_t>(s[i]->stream)));
    RETROINFER_CUDA_CHECK(cudaStreamWaitEvent(js, static_cast<cudaEvent_t>(im.order), 0));
  }
  // Row i: session i's token at its position, its RoPE row (as its own decode step), its caches per layer.
  const int64_t half = c.head_dim / 2, hq = c.num_heads_q, hkv = c.num_heads_kv, d = c.head_dim;
  const int L = c.num_layers;
  J.staging->wait();
  for (int i = 0; i < n; ++i) {
    CudaSession::Impl& si = *s[i];
    const int64_t p = si.pos[0];
    J.staging->tokens[i] = tokens[i];
    J.staging->seq[i] = i;
    J.staging->pos[i] = static_cast<int32_t>(p);
    ::retroinfer::model::rope_table(si.frequencies(p + 1), p, 1, J.staging->cos + i * half, J.staging->sin + i * half);
    for (int l = 0; l < L; ++l)  // a host-tier layer's row is skipped (null): its attention appends it
      im.host_dst[size_t(l) * n + i] =
          si.owns_kv(l) ? model::KvAppendRow{nullptr, nullptr, 0, p}
                          : model::KvAppendRow{si.k[static_cast<size_t>(l)].as<uint16_t>(),
                                               si.v[static_cast<size_t>(l)].as<uint16_t>(), si.max_context, p};
    si.last_stats = AttentionStats{};
    si.exact_stats_pending = true;
    si.exact_stats_valid = false;
  }
  J.upload_rows(n);
  RETROINFER_CUDA_CHECK(cudaMemcpyAsync(im.dev_dst.data(), im.host_dst, size_t(L) * n * sizeof(model::KvAppendRow),
                                        cudaMemcpyHostToDevice, js));
  const std::vector<void*>* graphs = im.graphs_for(n);
  for (int l = 0; l <= L; ++l) {
    if (graphs != nullptr) RETROINFER_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>((*graphs)[l]), js));
    else im.segment(l, n);
    if (l == L) break;
    // Row i's attention of layer l on `stream`: from q row i (after appending k_new / v_new row i on the host
    // tier) into attention row i.
    auto attend = [&](int i, Stream stream) {
      LayerAttention& la = *s[i]->attn[static_cast<size_t>(l)];
      la.decode(J.a.q.as<float>() + i * hq * d, J.a.k_new.as<uint16_t>() + i * hkv * d,
                J.a.v_new.as<uint16_t>() + i * hkv * d, s[i]->pos[0] + 1, J.a.att.as<float>() + i * hq * d, stream);
      s[i]->last_stats += la.last_stats();
    };
    // Host-tier rows first, each on its session's stream after the segment; then the GPU-tier rows on the
    // decoder's stream, overlapping the host-tier gathers; the decoder's stream then waits for all of them.
    const bool any_host = std::any_of(s.begin(), s.end(), [&](const CudaSession::Impl* si) { return si->host_tier(l); });
    if (any_host) RETROINFER_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(im.layer_ready), js));
    for (int i = 0; i < n; ++i) {
      if (!s[i]->host_tier(l)) continue;
      auto ss = static_cast<cudaStream_t>(s[i]->stream);
      RETROINFER_CUDA_CHECK(cudaStreamWaitEvent(ss, static_cast<cudaEvent_t>(im.layer_ready), 0));
      attend(i, s[i]->stream);
      RETROINFER_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(im.attn_done[static_cast<size_t>(i)]), ss));
    }
    for (int i = 0; i < n; ++i)
      if (!s[i]->host_tier(l)) attend(i, J.stream);
    for (int i = 0; i < n; ++i)
      if (s[i]->host_tier(l))
        RETROINFER_CUDA_CHECK(cudaStreamWaitEvent(js, static_cast<cudaEvent_t>(im.attn_done[static_cast<size_t>(i)]), 0));
    // Layer l + 1's apply of each session whose layer l + 1 is on the host tier, on that layer's side stream
    // after the session's stream (issue_ahead), beside segment l + 1. Issued after every row's attention of
    // layer l: the streams share the device's few hardware queues, and an apply queued between two sessions'
    // attention, waiting for the first, could hold the second behind it.
    if (l + 1 < L)
      for (int i = 0; i < n; ++i)
        if (s[i]->host_tier(l + 1)) s[i]->attn[static_cast<size_t>(l) + 1]->issue_ahead(s[i]->stream);
  }
  if (graphs == nullptr) im.eager_once.insert(n);
}

// ---- CudaSequenceSession's side (sequence_session.h JoinedDecode) ----

namespace {

class JoinedDecodeCuda final : public JoinedDecode {
 public:
  JoinedDecodeCuda(const CudaModel& model, bool decode_graphs) : dec_(model, decode_graphs) {}
  const void* key() const override { return &dec_.model(); }
  void decode(std::span<SequenceSession* const> sessions, std::span<const int32_t> tokens,
              std::span<float> logits) override {
    std::vector<CudaSession*> cs(sessions.size());
    for (size_t i = 0; i < sessions.size(); ++i) {
      auto* c = dynamic_cast<CudaSequenceSession*>(sessions[i]);
      RETROINFER_CHECK(c != nullptr && c->join_key() == key(), "JoinedDecode (CUDA): session ", i,
                       " is not a CUDA session of this decoder's model that can join");
      cs[i] = &c->session();
    }
    dec_.decode(cs, tokens, logits);
  }

 private:
  CudaJoinedDecoder dec_;
};

}  // namespace

const void* CudaSequenceSession::join_key() const {
  return CudaJoinedDecoder::joinable(*session_) ? static_cast<const void*>(&session_->model()) : nullptr;
}

std::unique_ptr<JoinedDecode> CudaSequenceSession::make_joined_decode() const {
  if (join_key() == nullptr) return nullptr;
  return std::make_unique<JoinedDecodeCuda>(session_->model(), session_->options().decode_graphs);
}

bool CudaJoinedDecoder::joinable(const CudaSession& s) { return Impl::refusal(*s.impl_, s.impl_->model).empty(); }

}  // namespace retroinfer::cuda
