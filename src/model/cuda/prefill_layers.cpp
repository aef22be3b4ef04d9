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
// Memory beyond the plan, for the prefill only (freed on return), T = the sum of prompt lengths:
//   x     [T, hidden] f32                 the residual stream of every prompt token: on the GPU when it fits
//                                         with rows and rope in what the plan left of the session's GPU
//                                         limit (plan.gpu_free_bytes - plan.gpu_bytes), else in pinned host
//                                         memory within what the plan left of the host limit, each chunk
//                                         copied into the activation buffer a.x before its layer and back
//                                         after (2 x T x hidden x 4 bytes over PCIe per layer)
//   rows  [3, T] int32 (device)           token, sequence, position of every token
//   rope  [2, T, D / 2] f32 (device)      cos, then sin of every token (computed once on the host)
// When neither fits, an Error before any work says what to do.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "kernels/cuda_check.h"
#include "model/cuda/session_state.h"
#include "retroinfer/error.h"
#include "retroinfer/fault_injection.h"

namespace retroinfer::cuda {
namespace {

// Page-locked host memory for the prefill's residual stream (0 bytes: none).
struct PinnedHostBuffer {
  explicit PinnedHostBuffer(int64_t bytes) {
    if (bytes <= 0) return;
    const cudaError_t e = fault::should_fail(fault::Point::kPinnedHostAlloc)
                              ? cudaErrorMemoryAllocation
                              : cudaMallocHost(&data, static_cast<size_t>(bytes));
    if (e != cudaSuccess) {
      data = nullptr;
      RETROINFER_FAIL("CudaSession::prefill: cudaMallocHost of ", bytes, " bytes for the hidden states failed: ",
                      cudaGetErrorString(e), "; prefill fewer or shorter prompts or use fill_synthetic");
    }
  }
  ~PinnedHostBuffer() {
    if (data != nullptr) cudaFreeHost(data);  // no throw from a destructor
  }
  PinnedHostBuffer(const PinnedHostBuffer&) = delete;
  PinnedHostBuffer& operator=(const PinnedHostBuffer&) = delete;
  void* data = nullptr;
};

}  // namespace

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
  const int64_t gpu_headroom = plan.gpu_free_bytes - plan.gpu_bytes;
  const int64_t host_headroom = plan.host_free_bytes - plan.host_bytes;
  const bool x_on_gpu = x_bytes + row_bytes + rope_bytes <= gpu_headroom;
  if (!x_on_gpu && !(row_bytes + rope_bytes <= gpu_headroom && x_bytes <= host_headroom)) {
    auto mib = [](int64_t b) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.1f MiB", double(std::max<int64_t>(0, b)) / double(1 << 20));
      return std::string(buf);
    };
    RETROINFER_FAIL("CudaSession::prefill: ", L - plan.gpu_layers, " of ", L, " layers keep their KV in host memory, ",
                    "so the prefill runs layer by layer and keeps the hidden state of all ", total,
                    " prompt tokens (", mib(x_bytes), ") on the GPU or in pinned host memory, and their row data (",
                    mib(row_bytes + rope_bytes), ") on the GPU; the session's memory plan leaves ", mib(gpu_headroom),
                    " of its GPU limit and ", mib(host_headroom), " of its host limit. Prefill fewer or shorter "
                    "prompts, raise gpu_memory_limit / host_memory_limit, place fewer layers on the GPU (placement "
                    "split with a smaller gpu_layers), use placement gpu, or fill the KV with fill_synthetic");
  }
  DeviceBuffer x_dev(static_cast<size_t>(x_on_gpu ? x_bytes : 0)), rows_all(static_cast<size_t>(row_bytes)),
      rope_all(static_cast<size_t>(rope_bytes));
  PinnedHostBuffer x_host(x_on_gpu ? 0 : x_bytes);
  float* const xd = x_dev.as<float>();                     // device residual stream, or null
  float* const xh = static_cast<float*>(x_host.data);     // pinned residual stream, or null
  int32_t* dev_rows = rows_all.as<int32_t>();
  float* dev_rope = rope_all.as<float>();
  auto st = static_cast<cudaStream_t>(stream);
  // Rows [o, o + m) of the residual stream on the device: in place, or copied into a.x.
  auto load = [&](int64_t o, int64_t m) -> float* {
    if (x_on_gpu) return xd + o * h;
    RETROINFER_CUDA_CHECK(cudaMemcpyAsync(a.x.data(), xh + o * h, m * h * 4, cudaMemcpyHostToDevice, st));
    return a.x.as<float>();
  };
  auto store = [&](int64_t o, int64_t m) {
    if (!x_on_gpu)
      RETROINFER_CUDA_CHECK(cudaMemcpyAsync(xh + o * h, a.x.data(), m * h * 4, cudaMemcpyDeviceToHost, st));
  };
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
      embed(m, view(off[s] + start), x_on_gpu ? xd + (off[s] + start) * h : a.x.as<float>());
      store(off[s] + start, m);
    }
    pos[s] = n;
  }
  make_attention();
  for (int l = 0; l < L; ++l) {
    for (int s = 0; s < num_seqs; ++s) {
      const int64_t n = static_cast<int64_t>(prompts[s].size());
      for (int64_t start = 0; start < n; start += chunk) {
        const int64_t m = std::min(chunk, n - start);
        layer_forward(l, m, view(off[s] + start), load(off[s] + start, m), false, s, start);
        store(off[s] + start, m);
      }
    }
    timed_prefill_done(l);  // synchronises: the staging buffer is free for the next layer
    if (progress) progress(total * (l + 1) / L, total);
  }
  timed_build([&] { calibrate_layer_budgets(); });

  // Logits, in the row blocks of the chunk-major path.
  std::vector<float> out(static_cast<size_t>((all_logits ? total : num_seqs) * vocab));
  for (int s = 0; s < num_seqs; ++s) {
    const int64_t n = static_cast<int64_t>(prompts[s].size());
    if (!all_logits) {
      lm_head(0, 1, load(off[s] + n - 1, 1));
      RETROINFER_CUDA_CHECK(cudaMemcpyAsync(out.data() + s * vocab, a.logits.data(), vocab * 4, cudaMemcpyDeviceToHost,
                                            st));
      synchronize(stream);  // a.logits is reused by the next sequence
      continue;
    }
    for (int64_t start = 0; start < n; start += chunk) {
      const int64_t m = std::min(chunk, n - start);
      for (int64_t b0 = 0; b0 < m; b0 += logit_rows) {
        const int64_t cnt = std::min(logit_rows, m - b0);
        lm_head(0, cnt, load(off[s] + start + b0, cnt));
        RETROINFER_CUDA_CHECK(cudaMemcpyAsync(out.data() + (off[s] + start + b0) * vocab, a.logits.data(),
                                              cnt * vocab * 4, cudaMemcpyDeviceToHost, st));
        synchronize(stream);
      }
    }
  }
  synchronize(stream);  // before the residual stream and the row data are freed
  return out;
}

}  // namespace retroinfer::cuda
