// The CPU runner's prefill attention alone, both kernels (model::blas_prefill_attention and, where the processor has
// AVX2 + FMA, model::fused_prefill_attention): one chunk of `chunk` query positions ending at `tokens`, against a bf16
// (or f32) KV cache of `tokens` tokens, at the shapes of Qwen2.5-Coder-0.5B (14 q / 2 KV heads, d = 64) and Llama-3-8B
// (32 q / 8 KV heads, d = 128), with every thread the process has (OMP_NUM_THREADS); also the first chunk of a prompt
// (positions [0, chunk)). Wall time, the best of `reps` calls; GFLOP/s counts the causal work only (4 * head_dim per
// visible (query head, key) pair). One JSON line per case.
//   cpu_prefill_attention_bench [tokens=16384] [chunk=512] [reps=3] [bf16|f32]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "model/prefill_attention.h"
#include "retroinfer/model.h"

using namespace retroinfer;

int main(int argc, char** argv) {
  const int64_t tokens = argc > 1 ? std::atoll(argv[1]) : 16384;
  const int64_t chunk = argc > 2 ? std::atoll(argv[2]) : 512;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 3;
  const std::string kv_name = argc > 4 ? argv[4] : "bf16";
  if (chunk < 1 || tokens < chunk || reps < 1 || (kv_name != "bf16" && kv_name != "f32")) {
    std::fprintf(stderr, "usage: cpu_prefill_attention_bench [tokens >= chunk] [chunk >= 1] [reps >= 1] [bf16|f32]\n");
    return 2;
  }
  for (const AttentionShape shape : {AttentionShape{14, 2, 64}, AttentionShape{32, 8, 128}}) {
    const int d = shape.head_dim, hkv = shape.num_heads_kv, hq = shape.num_heads_q;
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    KvCache kv(hkv, d, kv_name == "f32" ? DType::kF32 : DType::kBF16);
    {
      std::vector<float> k(static_cast<size_t>(tokens) * hkv * d), v(k.size());
      for (auto& x : k) x = nd(rng);
      for (auto& x : v) x = nd(rng);
      kv.append(k.data(), v.data(), tokens);
    }
    std::vector<float> q(static_cast<size_t>(chunk) * hq * d), out(q.size());
    for (auto& x : q) x = nd(rng);
    model::PrefillAttentionScratch sc;
    for (const bool fused : {false, true}) {
      if (fused && !model::fused_prefill_attention_supported(shape)) continue;
      for (const int64_t pos0 : {int64_t{0}, tokens - chunk}) {
        double best = 1e30;
        for (int r = 0; r < reps; ++r) {
          const auto t0 = std::chrono::steady_clock::now();
          if (fused) {
            model::fused_prefill_attention(kv, shape, 0.0f, pos0, chunk, q.data(), out.data(), sc);
          } else {
            model::blas_prefill_attention(kv, shape, 0.0f, pos0, chunk, q.data(), out.data(), sc);
          }
          best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        }
        // Query position pos0 + i sees pos0 + i + 1 keys.
        const double pairs = static_cast<double>(chunk) * static_cast<double>(pos0) + chunk * (chunk + 1) / 2.0;
        const double gflop = 4.0 * d * hq * pairs * 1e-9;
        std::printf("{\"bench\":\"cpu_prefill_attention\",\"kernel\":\"%s\",\"num_heads_q\":%d,"
                    "\"num_heads_kv\":%d,\"head_dim\":%d,\"kv_dtype\":\"%s\",\"pos0\":%lld,\"chunk\":%lld,"
                    "\"threads\":%d,\"ms\":%.3f,\"gflops\":%.1f}\n",
                    fused ? "fused" : "blas", hq, hkv, d, kv_name.c_str(), static_cast<long long>(pos0),
                    static_cast<long long>(chunk), num_threads(), best * 1e3, gflop / best);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}
