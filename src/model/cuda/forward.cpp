// The transformer forward pass of CudaSession: embedding, per layer RMSNorm -> QKV (cuBLAS) -> bias + RoPE +
// KV append -> attention (prefill: causal; decode: LayerAttention) -> O projection + residual -> RMSNorm ->
// gate/up (cuBLAS) -> SwiGLU -> down projection + residual; final norm + LM head. One layer at a time
// (layer_forward) so that the chunk-major forward() and the layer-major prefill share it.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/stream_priority.h"
#include "kernels/kernels.h"
#include "kernels/model_kernels.h"
#include "model/cuda/model_weights.h"
#include "kernels/prefill_attention_ref.h"
#include "kernels/prefill_kernels.h"
#include "model/cuda/session_state.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda {

int64_t session_rows(const CudaSessionOptions& opt, int64_t max_context, int num_seqs) {
  return std::max<int64_t>(std::min<int64_t>(opt.prefill_chunk, max_context), num_seqs);
}

int64_t session_logit_rows(int64_t rows, int num_seqs) {
  return std::max<int64_t>(num_seqs, std::min<int64_t>(rows, 256));
}

int64_t session_activation_bytes(const ModelConfig& c, int64_t rows, int64_t logit_rows, int num_seqs, bool bf16) {
  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_heads_q, hkv = c.num_heads_kv;
  const int64_t inter = c.intermediate_size;
  // x qkv q att gu rope; f32 weights also xn act
  const int64_t per_row_f32 = h + (hq + 2 * hkv) * d + 2 * hq * d + 2 * inter + d + (bf16 ? 0 : h + inter);
  const int64_t per_row_other = 2 * 2 * hkv * d + 3 * 4;  // k_new v_new, row ints
  // bf16: xb, actb (GEMM inputs in bf16), the Gemm's bf16 copy of the attention output, its cuBLASLt workspace.
  const int64_t gemm_ws = bf16 ? 2 * rows * (h + inter + hq * d) + model::kGemmLtWorkspaceBytes : 0;
  // + the split-KV parts of the prefill attention kernel (allocated at its first split launch).
  return rows * (4 * per_row_f32 + per_row_other) + 4 * logit_rows * c.vocab_size + 4 * int64_t{num_seqs} + gemm_ws +
         detail::kPrefillSplitWorkspaceBytes;
}

RowStaging::RowStaging(int64_t rows_cap, int head_dim) {
  const int64_t half = head_dim / 2;
  bytes = rows_cap * (3 * 4 + 2 * 4 * half);
  RETROINFER_CUDA_CHECK(cudaMallocHost(&base, static_cast<size_t>(bytes)));
  char* p = static_cast<char*>(base);
  tokens = reinterpret_cast<int32_t*>(p);
  seq = tokens + rows_cap;
  pos = seq + rows_cap;
  cos = reinterpret_cast<float*>(pos + rows_cap);
  sin = cos + rows_cap * half;
  cudaEvent_t e = nullptr;
  const cudaError_t st = cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  if (st != cudaSuccess) {
    cudaFreeHost(base);
    RETROINFER_CUDA_CHECK(st);
  }
  ready = e;
}

RowStaging::~RowStaging() {
  if (ready != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(ready));
  if (base != nullptr) cudaFreeHost(base);
}

void RowStaging::wait() { RETROINFER_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(ready))); }

const ::retroinfer::model::RopeFrequencies& CudaSession::Impl::frequencies(int64_t seq_len) {
  const bool dynamic = model.config().rope_scaling.type == "dynamic";
  if (freqs_len < 0 || (dynamic && seq_len != freqs_len)) {
    freqs = ::retroinfer::model::rope_frequencies(model.config(), seq_len);
    freqs_len = seq_len;
  }
  return freqs;
}

void CudaSession::Impl::allocate_activations() {
  const ModelConfig& c = model.config();
  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_heads_q, hkv = c.num_heads_kv;
  const int64_t inter = c.intermediate_size, R = rows_cap;
  const bool bf16 = model.weight_type() == WeightType::kBf16;
  // The Gemm's own bf16 copy serves the one f32 input of a bf16 product: the attention output [rows, Hq D].
  gemm = std::make_unique<model::Gemm>(bf16, bf16 ? R * hq * d : 0);
  a.x = DeviceBuffer(R * h * 4);
  if (bf16) {
    a.xb = DeviceBuffer(R * h * 2);
    a.actb = DeviceBuffer(R * inter * 2);
  } else {
    a.xn = DeviceBuffer(R * h * 4);
  }
  a.qkv = DeviceBuffer(R * (hq + 2 * hkv) * d * 4);
  a.q = DeviceBuffer(R * hq * d * 4);
  a.att = DeviceBuffer(R * hq * d * 4);
  a.gu = DeviceBuffer(R * 2 * inter * 4);
  if (!bf16) a.act = DeviceBuffer(R * inter * 4);
  a.k_new = DeviceBuffer(R * hkv * d * 2);
  a.v_new = DeviceBuffer(R * hkv * d * 2);
  a.rope = DeviceBuffer(R * d * 4);  // [2, R, d / 2]
  a.rows = DeviceBuffer(R * 3 * 4);
  a.logits = DeviceBuffer(logit_rows * c.vocab_size * 4);
  a.next = DeviceBuffer(static_cast<size_t>(num_seqs) * 4);
  staging = std::make_unique<RowStaging>(R, c.head_dim);
}

void CudaSession::Impl::upload_rows(int64_t rows) {
  upload_rows_to(a.rows.as<int32_t>(), a.rope.as<float>(), rows_cap, 0, rows);
}

void CudaSession::Impl::upload_rows_to(int32_t* dev, float* rope, int64_t stride, int64_t offset, int64_t rows) {
  RETROINFER_CHECK(rows >= 1 && rows <= rows_cap && offset >= 0 && offset + rows <= stride,
                   "CudaSession: row upload [", offset, ", ", offset + rows, ") outside a buffer of ", stride, " rows");
  auto st = static_cast<cudaStream_t>(stream);
  const int64_t half = shape.head_dim / 2;
  RETROINFER_CUDA_CHECK(cudaMemcpyAsync(dev + offset, staging->tokens, rows * 4, cudaMemcpyHostToDevice, st));
  RETROINFER_CUDA_CHECK(cudaMemcpyAsync(dev + stride + offset, staging->seq, rows * 4, cudaMemcpyHostToDevice, st));
  RETROINFER_CUDA_CHECK(cudaMemcpyAsync(dev + 2 * stride + offset, staging->pos, rows * 4, cudaMemcpyHostToDevice, st));
  RETROINFER_CUDA_CHECK(
      cudaMemcpyAsync(rope + offset * half, staging->cos, rows * half * 4, cudaMemcpyHostToDevice, st));
  RETROINFER_CUDA_CHECK(cudaMemcpyAsync(rope + (stride + offset) * half, staging->sin, rows * half * 4,
                                        cudaMemcpyHostToDevice, st));
  RETROINFER_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(staging->ready), st));
}

RowView CudaSession::Impl::staged_rows() const {
  const int64_t half = shape.head_dim / 2;
  RowView rv;
  rv.tokens = a.rows.as<int32_t>();
  rv.seq = rv.tokens + rows_cap;
  rv.pos = rv.tokens + 2 * rows_cap;
  rv.cos = a.rope.as<float>();
  rv.sin = rv.cos + rows_cap * half;
  return rv;
}

void CudaSession::Impl::check_host_tier_length(int64_t n, const char* where) const {
  if (!any_host_tier()) return;
  const AttentionConfig& ac = opt.attention;
  const int64_t need = int64_t{ac.sink_tokens} + ac.window_tokens + ac.tokens_per_cluster;
  RETROINFER_CHECK(n >= need, "CudaSession::", where, ": ", num_layers() - plan.gpu_layers,
                   " layer(s) keep their KV in host memory (wave buffer), which needs sequences of at least sink + "
                   "window + tokens_per_cluster = ", need, " tokens to index, got ", n,
                   "; use placement gpu for short sequences");
}

uint16_t* CudaSession::Impl::prefill_k(int l) {
  return owns_kv(l) ? stage_k.as<uint16_t>() : k[static_cast<size_t>(l)].as<uint16_t>();
}
uint16_t* CudaSession::Impl::prefill_v(int l) {
  return owns_kv(l) ? stage_v.as<uint16_t>() : v[static_cast<size_t>(l)].as<uint16_t>();
}

void CudaSession::Impl::record_event(int i) {
  if (recording)
    RETROINFER_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(events[i]), static_cast<cudaStream_t>(stream)));
}

void CudaSession::Impl::forward(int64_t rows, bool decode, int seq, int64_t pos0) {
  RETROINFER_CHECK(rows >= 1 && rows <= rows_cap, "CudaSession: ", rows, " rows exceed the ", rows_cap, " planned");
  const RowView rv = staged_rows();
  embed(rows, rv, a.x.as<float>());
  for (int l = 0; l < num_layers(); ++l) layer_forward(l, rows, rv, a.x.as<float>(), decode, seq, pos0);
}

void CudaSession::Impl::embed(int64_t rows, const RowView& rv, float* x) {
  const CudaModel::Weights& w = model.weights();
  auto st = static_cast<cudaStream_t>(stream);
  model::EmbedParams ep;
  ep.embed = w.embed;
  ep.bf16 = w.type == WeightType::kBf16;
  ep.tokens = rv.tokens;
  ep.x = x;
  ep.rows = rows;
  ep.hidden = model.config().hidden_size;
  detail::launch_check(model::embed_gather(ep, st), "embed_gather", st);
}

void CudaSession::Impl::norm_rows(const float* x, const float* weight, int64_t rows) {
  const ModelConfig& c = model.config();
  const bool bf16 = model.weights().type == WeightType::kBf16;
  auto st = static_cast<cudaStream_t>(stream);
  model::RmsNormParams p;
  p.x = x;
  p.w = weight;
  p.y = bf16 ? nullptr : a.xn.as<float>();
  p.y_bf16 = bf16 ? a.xb.as<uint16_t>() : nullptr;
  p.rows = rows;
  p.hidden = c.hidden_size;
  p.x_stride = c.hidden_size;
  p.eps = c.rms_norm_eps;
  detail::launch_check(model::rms_norm(p, st), "rms_norm", st);
}

void CudaSession::Impl::product(const void* wt, int64_t rows, int64_t in, int64_t out, float* y, float beta,
                                const uint16_t* xb16, const float* x32) {
  if (model.weights().type == WeightType::kBf16) gemm->linear(xb16, rows, in, wt, out, y, beta, stream);
  else gemm->linear(x32, rows, in, wt, out, y, beta, stream);
}

// Where qkv_post writes the prefill chunk's q in bf16 for the Hopper attention kernel (which reads it by
// tensor-map copies): the second half of a.att, whose first half takes that kernel's bf16 output (bf16 weights).
// Else nullptr: the portable kernel reads the f32 q, and a Hopper launch with f32 output rounds q itself.
uint16_t* CudaSession::Impl::prefill_q_bf16() {
  const bool hopper_bf16 = prefill_attention && prefill_attention->kernel() == PrefillKernel::kHopper &&
                           model.weights().type == WeightType::kBf16;
  return hopper_bf16 ? reinterpret_cast<uint16_t*>(a.att.as<uint8_t>() + a.att.bytes() / 2) : nullptr;
}

// RMSNorm -> QKV product -> bias + RoPE + KV append (the runner's K/V; decode of a layer that owns its KV:
// a.k_new / a.v_new only, the layer appends the token to its own store) into a.q.
void CudaSession::Impl::layer_pre_attention(int l, int64_t rows, const RowView& rv, float* x, bool decode) {
  const ModelConfig& c = model.config();
  const CudaModel::Weights::Layer& L = model.weights().layers[l];
  auto st = static_cast<cudaStream_t>(stream);
  const int64_t h = c.hidden_size, qkvw = int64_t{c.num_heads_q + 2 * c.num_heads_kv} * c.head_dim;
  const bool owned = owns_kv(l);
  norm_rows(x, L.attn_norm, rows);
  product(L.wqkv, rows, h, qkvw, a.qkv.as<float>(), 0.0f, a.xb.as<uint16_t>(), a.xn.as<float>());
  uint16_t* kc = decode && (owned || joint) ? nullptr : prefill_k(l);
  uint16_t* vc = decode && (owned || joint) ? nullptr : prefill_v(l);
  model::QkvPostParams qp;
  qp.qkv = a.qkv.as<float>();
  qp.bias = L.bqkv;
  qp.cos = rv.cos;
  qp.sin = rv.sin;
  qp.row_seq = rv.seq;
  qp.row_pos = rv.pos;
  qp.q = a.q.as<float>();
  qp.q_bf16 = decode ? nullptr : prefill_q_bf16();
  qp.k_cache = kc;
  qp.v_cache = vc;
  qp.k_new = decode ? a.k_new.as<uint16_t>() : nullptr;
  qp.v_new = decode ? a.v_new.as<uint16_t>() : nullptr;
  qp.rows = rows;
  qp.kv_stride = max_context;
  qp.num_heads_q = c.num_heads_q;
  qp.num_heads_kv = c.num_heads_kv;
  qp.head_dim = c.head_dim;
  detail::launch_check(model::qkv_post(qp, st), "qkv_post", st);
}

// Decode attention of layer l for every sequence: a.q -> a.att (pos[s] + 1 tokens after the append).
void CudaSession::Impl::layer_attention_decode(int l) {
  const ModelConfig& c = model.config();
  const int64_t hq = c.num_heads_q, hkv = c.num_heads_kv, d = c.head_dim;
  // Layer l + 1's work that needs nothing of layer l (the host tier's apply) goes after layer l's attention of
  // every sequence, beside the products until layer l + 1's attention (queued earlier, an apply waiting for one
  // sequence's attention can hold the next sequence's work behind it in a shared hardware queue).
  const bool next = l + 1 < c.num_layers;
  if (!attn_per_seq) {
    attn[l]->decode(a.q.as<float>(), a.k_new.as<uint16_t>(), a.v_new.as<uint16_t>(), pos[0] + 1, a.att.as<float>(),
                    stream);
    last_stats += attn[l]->last_stats();
    if (next) attn[l + 1]->issue_ahead(stream);
    return;
  }
  for (int s = 0; s < num_seqs; ++s) {
    LayerAttention& la = *attn[static_cast<size_t>(s) * c.num_layers + l];
    la.decode(a.q.as<float>() + s * hq * d, a.k_new.as<uint16_t>() + s * hkv * d, a.v_new.as<uint16_t>() + s * hkv * d,
              pos[s] + 1, a.att.as<float>() + s * hq * d, stream);
    last_stats += la.last_stats();
  }
  if (next)
    for (int s = 0; s < num_seqs; ++s) attn[static_cast<size_t>(s) * c.num_layers + l + 1]->issue_ahead(stream);
}

// O product + residual -> RMSNorm -> gate/up + SwiGLU -> down product + residual, from a.att (f32, or with
// att_bf16 bf16 in its first half) into x.
void CudaSession::Impl::layer_post_attention(int l, int64_t rows, float* x, bool att_bf16) {
  const ModelConfig& c = model.config();
  const CudaModel::Weights::Layer& L = model.weights().layers[l];
  auto st = static_cast<cudaStream_t>(stream);
  const int64_t h = c.hidden_size, inter = c.intermediate_size, hqd = int64_t{c.num_heads_q} * c.head_dim;
  // residual: x += att @ Wo^T
  if (att_bf16) gemm->linear(a.att.as<uint16_t>(), rows, hqd, L.wo, h, x, 1.0f, stream);
  else gemm->linear(a.att.as<float>(), rows, hqd, L.wo, h, x, 1.0f, stream);
  norm_rows(x, L.mlp_norm, rows);
  if (model.weights().type == WeightType::kBf16) {  // gate/up + SwiGLU into actb (gemm.h)
    gemm->linear_swiglu(a.xb.as<uint16_t>(), rows, h, L.wgate_up, inter, a.gu.as<float>(), a.actb.as<uint16_t>(),
                        stream);
  } else {
    product(L.wgate_up, rows, h, 2 * inter, a.gu.as<float>(), 0.0f, nullptr, a.xn.as<float>());
    model::SwiGluParams sp;
    sp.gu = a.gu.as<float>();
    sp.act = a.act.as<float>();
    sp.rows = rows;
    sp.inter = inter;
    detail::launch_check(model::swiglu(sp, st), "swiglu", st);
  }
  product(L.wdown, rows, inter, h, x, 1.0f, a.actb.as<uint16_t>(), a.act.as<float>());  // x += act @ Wd^T
}

void CudaSession::Impl::layer_forward(int l, int64_t rows, const RowView& rv, float* x, bool decode, int seq,
                                      int64_t pos0) {
  RETROINFER_CHECK(rows >= 1 && rows <= rows_cap, "CudaSession: ", rows, " rows exceed the ", rows_cap, " planned");
  RETROINFER_CHECK(l >= 0 && l < num_layers(), "CudaSession: layer ", l, " out of range");
  layer_pre_attention(l, rows, rv, x, decode);
  if (!decode) keep_prompt_queries(l, rows, pos0);
  record_event(2 + 2 * l);
  if (!decode) mark_prefill();
  // The prefill kernels write the O product's bf16 input themselves (bf16 weights; the same rounding as the
  // Gemm's copy of an f32 output, without the f32 round trip).
  const bool att_bf16 = !decode && prefill_attention && model.weights().type == WeightType::kBf16;
  if (decode) {
    layer_attention_decode(l);
  } else {
    const uint16_t* ks = prefill_k(l) + seq * seq_elems();
    const uint16_t* vs = prefill_v(l) + seq * seq_elems();
    if (att_bf16) {
      prefill_attention->run_bf16(a.q.as<float>(), ks, vs, max_context, pos0, rows, opt.attention.scale,
                                  a.att.as<uint16_t>(), stream, prefill_q_bf16());
    } else if (prefill_attention) {
      prefill_attention->run(a.q.as<float>(), ks, vs, max_context, pos0, rows, opt.attention.scale,
                             a.att.as<float>(), stream);
    } else {
      model::RefAttentionArgs ra;
      ra.q = a.q.as<float>();
      ra.k = ks;
      ra.v = vs;
      ra.out = a.att.as<float>();
      ra.kv_stride = max_context;
      ra.pos0 = pos0;
      ra.n = rows;
      ra.num_seqs = 1;
      ra.scale = opt.attention.scale;
      model::prefill_attention_reference(shape, ra, stream);
    }
  }
  record_event(3 + 2 * l);
  if (!decode) mark_prefill();
  layer_post_attention(l, rows, x, att_bf16);
}

void CudaSession::Impl::drop_decode_graphs() {
  for (void* g : graph_exec)
    if (g != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g));  // no throw: also from ~Impl
  graph_exec.clear();
  eager_decode_steps = 0;
}

bool CudaSession::Impl::capture_decode_graphs() {
  drop_decode_graphs();
  const int L = num_layers();
  const int64_t rows = num_seqs;
  const RowView rv = staged_rows();
  float* x = a.x.as<float>();
  const std::string why = capture_graphs(stream, L + 1, [&](int i) {
    if (i == 0) embed(rows, rv, x);
    else layer_post_attention(i - 1, rows, x);
    if (i < L) layer_pre_attention(i, rows, rv, x, true);
    else lm_head(0, rows);
  }, graph_exec);
  if (why.empty()) return true;
  drop_decode_graphs();
  graphs_failed = true;
  std::fprintf(stderr, "[retroinfer] decode CUDA graphs off for this session (capture failed: %s); launching eagerly\n",
               why.c_str());
  return false;
}

std::string capture_graphs(Stream stream, int count, const std::function<void(int)>& segment, std::vector<void*>& out) {
  auto st = static_cast<cudaStream_t>(stream);
  std::string why;
  for (int i = 0; i < count && why.empty(); ++i) {
    cudaError_t e = cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) {
      why = std::string("cudaStreamBeginCapture: ") + cudaGetErrorString(e);
      break;
    }
    try {
      segment(i);
    } catch (const std::exception& ex) {
      why = ex.what();
    }
    cudaGraph_t g = nullptr;
    e = cudaStreamEndCapture(st, &g);
    if (why.empty() && e != cudaSuccess) why = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(e);
    cudaGraphExec_t ex = nullptr;
    if (why.empty()) {
      e = cudaGraphInstantiate(&ex, g, detail::kGraphInstantiateFlags);
      if (e != cudaSuccess) why = std::string("cudaGraphInstantiate: ") + cudaGetErrorString(e);
    }
    if (g != nullptr) cudaGraphDestroy(g);
    if (why.empty()) out.push_back(ex);
  }
  if (!why.empty()) (void)cudaGetLastError();  // a failed capture may leave a sticky launch error of the capture
  return why;
}

void CudaSession::Impl::decode_forward_graphs() {
  auto st = static_cast<cudaStream_t>(stream);
  const int L = num_layers();
  RETROINFER_CHECK(static_cast<int>(graph_exec.size()) == L + 1, "CudaSession: ", graph_exec.size(),
                   " decode graphs for ", L, " layers");
  auto launch = [&](int i) {
    RETROINFER_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph_exec[static_cast<size_t>(i)]), st));
  };
  launch(0);
  for (int l = 0; l < L; ++l) {
    layer_attention_decode(l);
    launch(l + 1);
  }
}

void CudaSession::Impl::lm_head(int64_t row0, int64_t count, const float* x) {
  RETROINFER_CHECK(count >= 1 && count <= logit_rows && row0 >= 0 && (x != nullptr || row0 + count <= rows_cap),
                   "CudaSession: LM head rows [", row0, ", ", row0 + count, ") outside the planned buffers");
  const ModelConfig& c = model.config();
  norm_rows((x != nullptr ? x : a.x.as<float>()) + row0 * c.hidden_size, model.weights().final_norm, count);
  product(model.weights().lm_head, count, c.hidden_size, c.vocab_size, a.logits.as<float>(), 0.0f,
          a.xb.as<uint16_t>(), a.xn.as<float>());
}

// The products of one layer at n rows over every layer's weights (timing rotates over them; gemm.h). Inputs
// of any value (zeros): only the time matters. The outputs are the buffers the forward writes, so that the
// pointer alignments (part of the tuning key) are those of the forward; they hold no state yet. O's input is a
// cudaMalloc buffer like a.xb (decode: the Gemm's bf16 copy of the f32 attention output; prefill: a.att, which
// the prefill attention writes in bf16): the same alignments, so the same key as tuning on a.xb. Returns false,
// with O untuned, when a.xb is too narrow for O's input.
bool CudaSession::Impl::tune_layer_gemms(int64_t n) {
  const ModelConfig& c = model.config();
  const CudaModel::Weights& w = model.weights();
  const int64_t h = c.hidden_size, d = c.head_dim, hq = c.num_heads_q, hkv = c.num_heads_kv;
  const int64_t inter = c.intermediate_size;
  auto st = static_cast<cudaStream_t>(stream);
  RETROINFER_CUDA_CHECK(cudaMemsetAsync(a.xb.data(), 0, a.xb.bytes(), st));
  std::vector<const void*> qkv, o, gu, down;
  for (const auto& L : w.layers) {
    qkv.push_back(L.wqkv);
    o.push_back(L.wo);
    gu.push_back(L.wgate_up);
    down.push_back(L.wdown);
  }
  const uint16_t* xb = a.xb.as<uint16_t>();
  gemm->tune(xb, n, h, qkv, (hq + 2 * hkv) * d, a.qkv.as<float>(), 0.0f, stream);
  const bool o_fits = static_cast<size_t>(n * hq * d) * 2 <= a.xb.bytes();
  if (o_fits) gemm->tune(xb, n, hq * d, o, h, a.x.as<float>(), 1.0f, stream);
  gemm->tune_swiglu(xb, n, h, gu, inter, a.gu.as<float>(), a.actb.as<uint16_t>(), stream);
  RETROINFER_CUDA_CHECK(cudaMemsetAsync(a.actb.data(), 0, a.actb.bytes(), st));
  gemm->tune(a.actb.as<uint16_t>(), n, inter, down, h, a.x.as<float>(), 1.0f, stream);
  return o_fits;
}

void CudaSession::Impl::tune_decode_gemms() {
  const ModelConfig& c = model.config();
  const CudaModel::Weights& w = model.weights();
  if (w.type != WeightType::kBf16 || num_seqs > model::kGemmTuneMaxRows) return;
  const int64_t n = num_seqs, h = c.hidden_size, hqd = int64_t{c.num_heads_q} * c.head_dim;
  auto st = static_cast<cudaStream_t>(stream);
  if (!tune_layer_gemms(n)) {  // a.xb is too narrow: linear() tunes O through its own copy, on layer 0's weights
    RETROINFER_CUDA_CHECK(cudaMemsetAsync(a.att.data(), 0, static_cast<size_t>(n * hqd) * 4, st));
    RETROINFER_CUDA_CHECK(cudaMemsetAsync(a.x.data(), 0, static_cast<size_t>(n * h) * 4, st));
    gemm->linear(a.att.as<float>(), n, hqd, w.layers[0].wo, h, a.x.as<float>(), 1.0f, stream);
  }
  const void* lm[1] = {w.lm_head};
  gemm->tune(a.xb.as<uint16_t>(), n, h, lm, c.vocab_size, a.logits.as<float>(), 0.0f, stream);
  synchronize(stream);
}

// The products at the prefill chunk's row count (rows_cap), tuned once per process and shape before the first
// prefill (Gemm never tunes a prefill shape inside a prefill): cublasGemmEx's default algorithm for these
// large shapes can be well below cuBLASLt's best (H100, gate/up with bf16 output: 583 TFLOP/s at 8192 rows
// against 727 at 2048). The LM head runs on one row (or logit_rows) and is not tuned here; nor is O where a.xb
// is too narrow for its input (it then runs cublasGemmEx's default).
void CudaSession::Impl::tune_prefill_gemms() {
  if (model.weights().type != WeightType::kBf16 || rows_cap <= model::kGemmTuneMaxRows) return;
  tune_layer_gemms(rows_cap);
  synchronize(stream);
}

}  // namespace retroinfer::cuda
