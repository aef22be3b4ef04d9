// CudaSession's layer-major prefill, used when any layer keeps its KV in host memory (KvTier::kHost).
//
// The chunk-major prefill (cuda_session.cpp) runs each chunk through every layer, so every layer's K/V must
// be resident for the whole prefill; a host-tier layer has only the one shared staging buffer. Layer-major
// turns the loops around: the residual stream of every prompt token stays on the GPU, and layer l runs over
// every chunk of every sequence (K/V into k[l] or the staging buffer), then hands its K/V to its
// LayerAttention::prefill_done (a host-tier layer copies the staging buffer into its pinned store, and the
// staging buffer serves the next layer). Per (layer, chunk) the kernels, GEMM shapes and inputs are those of
// the chunk-major path (the same chunk boundaries, rows at the same positions), so the K/V and logits are
// the same as with every layer on the GPU.
//
// Device memory beyond the plan, for the prefill only (freed on return), T = the sum of prompt lengths:
//   x     [T, hidden] f32                 the residual stream of every prompt token
//   rows  [3, T] int32                    token, sequence, position of every token
//   rope  [2, T, D / 2] f32               cos, then sin of every token (computed once on the host)
// It must fit in what the plan left of the session's limit (plan.gpu_free_bytes - plan.gpu_bytes), else an
// Error before any work says what to do.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>

#include "backend/cuda/cuda_check.h"
#include "backend/cuda/model/session_state.h"
#include "retroinfer/error.h"

namespace retroinfer::cuda {

std::vector<float> CudaSession::Impl::prefill_layer_major(const std::vector<std::vector<int32_t>>& prompts,
                                                          bool all_logits, const PrefillProgress& progress) {
  const ModelConfig& c = model.config();
  const int L = num_layers();
  const int64_t h = c.hidden_size, half = c.head_dim / 2, vocab = c.vocab_size;
  const int64_t chunk = opt.prefill_chunk;  // a chunk's rows: min(chunk, prompt) <= max_context <= rows_cap
  std::vector<int64_t> off(static_cast<size_t>(num_seqs) + 1, 0);  // first token of sequence s in the stream
  for (int s = 0; s < num_seqs; ++s) off[s + 1] = off[s] + static_cast<int64_t>(prompts[s].size());
  const int64_t total = off[num_seqs];
  const int64_t x_bytes = total * h * 4, row_bytes = total * 3 * 4, rope_bytes = total * 2 * half * 4;
  const int64_t need = x_bytes + row_bytes + rope_bytes;
  const int64_t headroom = plan.gpu_free_bytes - plan.gpu_bytes;
  auto mib = [](int64_t b) { return double(b) / double(1 << 20); };
  if (need > headroom) {
    char buf[160];
    std::snprintf(buf, sizeof buf, "%.1f MiB", mib(need));
    const std::string need_s = buf;
    std::snprintf(buf, sizeof buf, "%.1f MiB", mib(std::max<int64_t>(0, headroom)));
    RETROINFER_FAIL("CudaSession::prefill: ", L - plan.gpu_layers, " of ", L, " layers keep their KV in host memory, ",
                    "so the prefill runs layer by layer and keeps the hidden state of all ", total,
                    " prompt tokens on the GPU (", need_s, "), but the session's memory plan leaves only ", buf,
                    " of its GPU limit; prefill fewer or shorter prompts, raise gpu_memory_limit, place fewer layers "
                    "on the GPU (placement split with a smaller gpu_layers), use placement gpu, or fill the KV with "
                    "fill_synthetic");
  }
  DeviceBuffer x_all(static_cast<size_t>(x_bytes)), rows_all(static_cast<size_t>(row_bytes)),
      rope_all(static_cast<size_t>(rope_bytes));
  float* x = x_all.as<float>();
  int32_t* dev_rows = rows_all.as<int32_t>();
  float* dev_rope = rope_all.as<float>();
  auto view = [&](int64_t o) {  // row data of the tokens from stream row o on
    RowView rv;
    rv.tokens = dev_rows + o;
    rv.seq = dev_rows + total + o;
    rv.pos = dev_rows + 2 * total + o;
    rv.cos = dev_rope + o * half;
    rv.sin = dev_rope + (total + o) * half;
    return rv;
  };

  // Row data and embeddings, chunk by chunk (RoPE rows computed once per token on the host, as chunk-major).
  for (int s = 0; s < num_seqs; ++s) {
    const std::vector<int32_t>& p = prompts[s];
    const int64_t n = static_cast<int64_t>(p.size());
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t m = std::min(chunk, n - start);
      staging->wait();
      for (int64_t i = 0; i < m; ++i) {
        staging->tokens[i] = p[start + i];
        staging->seq[i] = s;
        staging->pos[i] = static_cast<int32_t>(start + i);
      }
      ::retroinfer::model::rope_table(frequencies(n), start, m, staging->cos, staging->sin);
      upload_rows_to(dev_rows, dev_rope, total, off[s] + start, m);
      embed(m, view(off[s] + start), x + (off[s] + start) * h);
    }
    pos[s] = n;
  }
  make_attention();
  for (int l = 0; l < L; ++l) {
    for (int s = 0; s < num_seqs; ++s) {
      const int64_t n = static_cast<int64_t>(prompts[s].size());
      for (int64_t start = 0; start < n; start += chunk) {
        const int64_t m = std::min(chunk, n - start);
        layer_forward(l, m, view(off[s] + start), x + (off[s] + start) * h, false, s, start);
      }
    }
    attention_prefill_done(l);  // synchronises: the staging buffer is free for the next layer
    if (progress) progress(total * (l + 1) / L, total);
  }

  // Logits, in the row blocks of the chunk-major path.
  auto st = static_cast<cudaStream_t>(stream);
  std::vector<float> out(static_cast<size_t>((all_logits ? total : num_seqs) * vocab));
  for (int s = 0; s < num_seqs; ++s) {
    const int64_t n = static_cast<int64_t>(prompts[s].size());
    if (!all_logits) {
      lm_head(off[s] + n - 1, 1, x);
      RETROINFER_CUDA_CHECK(cudaMemcpyAsync(out.data() + s * vocab, a.logits.data(), vocab * 4, cudaMemcpyDeviceToHost,
                                            st));
      synchronize(stream);  // a.logits is reused by the next sequence
      continue;
    }
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t m = std::min(chunk, n - start);
      for (int64_t b0 = 0; b0 < m; b0 += logit_rows) {
        const int64_t cnt = std::min(logit_rows, m - b0);
        lm_head(off[s] + start + b0, cnt, x);
        RETROINFER_CUDA_CHECK(cudaMemcpyAsync(out.data() + (off[s] + start + b0) * vocab, a.logits.data(),
                                              cnt * vocab * 4, cudaMemcpyDeviceToHost, st));
        synchronize(stream);
      }
    }
  }
  synchronize(stream);  // before x_all, rows_all, rope_all are freed
  return out;
}

}  // namespace retroinfer::cuda
