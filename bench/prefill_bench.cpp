// Causal prefill attention benchmark of cuda::PrefillAttention: one layer of a whole prompt of n tokens,
// chunked as the model runner does (chunk c attends to the prefix [0, c * chunk) and causally to itself),
// and the same prompt in one call (chunk = n). Llama-3-8B head shape by default (32 query / 8 KV heads,
// head_dim 128). CUDA events around the whole sequence of chunk calls, one untimed warm-up, median of
// the repetitions, L2 evicted before each repetition. TFLOP/s counts the causal work only:
// 4 * D * Hq * sum_{i<n} (i + 1) (QK^T and PV, two FLOPs per multiply-add). One JSON object per line.
//
// The output in bf16 by default (PrefillAttention::run_bf16, what the model runner's prefill takes), or f32
// (--out-dtype f32: run); "out" in the JSON says which.
//
//   prefill_bench [--lengths 4096,32768,131072] [--chunk 8192] [--reps 5] [--heads-q 32] [--heads-kv 8]
//                 [--head-dim 128] [--kernels auto|portable|hopper[,...]] [--out-dtype bf16|f32] [--out FILE]
// Peer: scripts/torch_prefill_bench.py (torch scaled_dot_product_attention on the same shapes).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_args.h"
#include "retroinfer/attention.h"
#include "retroinfer/error.h"

#if defined(RETROINFER_WITH_CUDA)
#include "retroinfer/cuda_backend.h"
#include "retroinfer/cuda_model.h"
#endif

namespace {


}  // namespace

#if defined(RETROINFER_WITH_CUDA)
namespace {

using namespace retroinfer;

// Times one whole prefill of n tokens in chunks of `chunk` (the runner's order), reps times.
void run_case(FILE* out, const AttentionShape& shape, long long n, long long chunk, int reps,
              cuda::PrefillKernel kernel, bool out_bf16) {
  const int hq = shape.num_heads_q, hkv = shape.num_heads_kv, d = shape.head_dim;
  const long long max_chunk = std::min(chunk, n);
  const size_t kv_elems = size_t(hkv) * n * d;
  cuda::DeviceBuffer k(kv_elems * 2), v(kv_elems * 2);
  cuda::fill_random_bf16(k.as<uint16_t>(), kv_elems, 11 + n, 1.0f);
  cuda::fill_random_bf16(v.as<uint16_t>(), kv_elems, 12 + n, 1.0f);
  // One query buffer per chunk position would be n * Hq * D f32 (2 GiB at 128K): the chunks reuse one
  // random buffer (attention cost does not depend on the values).
  const size_t q_elems = size_t(max_chunk) * hq * d;
  cuda::DeviceBuffer q(q_elems * 4), o(q_elems * 4), q16(q_elems * 2);
  cuda::fill_random_f32(q.as<float>(), q_elems, 13 + n, 2.0f);
  // The bf16 q the Hopper kernel reads (as the model runner passes it; torch SDPA takes bf16 q too).
  cuda::fill_random_bf16(q16.as<uint16_t>(), q_elems, 13 + n, 2.0f);
  cuda::PrefillAttention attn(shape, kernel);
  auto whole = [&] {
    for (long long pos0 = 0; pos0 < n; pos0 += chunk) {
      const long long m = std::min(chunk, n - pos0);
      if (out_bf16)
        attn.run_bf16(q.as<float>(), k.as<uint16_t>(), v.as<uint16_t>(), n, pos0, m, 0.0f, o.as<uint16_t>(), nullptr,
                      q16.as<uint16_t>());
      else
        attn.run(q.as<float>(), k.as<uint16_t>(), v.as<uint16_t>(), n, pos0, m, 0.0f, o.as<float>(), nullptr,
                 q16.as<uint16_t>());
    }
  };
  whole();  // warm-up (and the shared-memory attribute)
  cuda::synchronize();
  cuda::EventTimer timer;
  std::vector<float> t;
  for (int r = 0; r < reps; ++r) {
    cuda::flush_l2();
    timer.start();
    whole();
    timer.stop();
    t.push_back(timer.elapsed_ms());
  }
  std::sort(t.begin(), t.end());
  const double med = t[t.size() / 2];
  const double flops = 4.0 * d * hq * (double(n) * double(n + 1) / 2.0);
  std::fprintf(out,
               "{\"bench\":\"prefill\",\"impl\":\"retroinfer\",\"kernel\":\"%s\",\"out\":\"%s\",\"n\":%lld,\"chunk\":%lld,\"chunks\":%lld,"
               "\"hq\":%d,\"hkv\":%d,\"d\":%d,\"ms\":%.4f,\"ms_min\":%.4f,\"ms_max\":%.4f,\"reps\":%d,"
               "\"flops\":%.4e,\"tflops\":%.1f}\n",
               std::string(cuda::prefill_kernel_name(attn.kernel())).c_str(), out_bf16 ? "bf16" : "f32", n, max_chunk, (n + chunk - 1) / chunk,
               hq, hkv, d, med, double(t.front()), double(t.back()), reps, flops, flops / (med * 1e-3) / 1e12);
  std::fflush(out);
}

}  // namespace
#endif

int main(int argc, char** argv) {
  std::vector<long long> lengths{4096, 32768, 131072};
  long long chunk = 8192;
  int reps = 5, hq = 32, hkv = 8, d = 128;
  const char* out_path = nullptr;
  std::vector<std::string> kernels{"auto"};
  std::string out_dtype = "bf16";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "prefill_bench: %s needs a value\n", argv[i]);
      return 2;
    }
    if (a == "--lengths") lengths = retroinfer::bench::parse_list<long long>(argv[++i]);
    else if (a == "--chunk") chunk = std::atoll(argv[++i]);
    else if (a == "--reps") reps = std::atoi(argv[++i]);
    else if (a == "--heads-q") hq = std::atoi(argv[++i]);
    else if (a == "--heads-kv") hkv = std::atoi(argv[++i]);
    else if (a == "--head-dim") d = std::atoi(argv[++i]);
    else if (a == "--out") out_path = argv[++i];
    else if (a == "--kernels") kernels = retroinfer::bench::parse_list<std::string>(argv[++i]);
    else if (a == "--out-dtype") out_dtype = argv[++i];
    else {
      std::fprintf(stderr, "prefill_bench: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  if (chunk < 1 || reps < 1) {
    std::fprintf(stderr, "prefill_bench: --chunk and --reps must be >= 1\n");
    return 2;
  }
  if (out_dtype != "bf16" && out_dtype != "f32") {
    std::fprintf(stderr, "prefill_bench: --out-dtype must be bf16 or f32, got %s\n", out_dtype.c_str());
    return 2;
  }
#if defined(RETROINFER_WITH_CUDA)
  if (!retroinfer::cuda::device_available()) {
    std::fprintf(stderr, "prefill_bench: %s\n", retroinfer::cuda::device_description().c_str());
    return 1;
  }
  FILE* out = stdout;
  if (out_path != nullptr) {
    out = std::fopen(out_path, "a");
    if (out == nullptr) {
      std::fprintf(stderr, "prefill_bench: cannot open %s\n", out_path);
      return 1;
    }
  }
  std::fprintf(stderr, "prefill_bench on %s\n", retroinfer::cuda::device_description().c_str());
  try {
    const retroinfer::AttentionShape shape{hq, hkv, d};
    for (long long n : lengths)
      for (const std::string& k : kernels) {
        const retroinfer::cuda::PrefillKernel kernel = retroinfer::cuda::parse_prefill_kernel(k);
        run_case(out, shape, n, chunk, reps, kernel, out_dtype == "bf16");
        if (chunk < n) run_case(out, shape, n, n, reps, kernel, out_dtype == "bf16");  // the same prompt in one call
      }
  } catch (const retroinfer::Error& e) {
    std::fprintf(stderr, "prefill_bench: %s\n", e.what());
    return 1;
  }
  return 0;
#else
  (void)hq;
  (void)hkv;
  (void)d;
  (void)out_path;
  (void)kernels;
  std::fprintf(stderr, "prefill_bench: built without the CUDA backend (configure with -DRETROINFER_CUDA=ON)\n");
  return 0;
#endif
}
