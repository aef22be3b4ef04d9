// Micro-benchmark of the CUDA model runner's non-attention operations (src/model/cuda): RMSNorm (f32 in, bf16
// out), SwiGLU alone (bf16 out), and the products of a Llama layer + LM head through model::Gemm as the runner
// calls them (autotuned per row count as a session tunes its decode and prefill rows, gemm.h; the tuning log
// goes to stderr and names the best cuBLASLt and cublasGemmEx times next to the choice): QKV, O (decode rows:
// the f32 attention output through the f32 -> bf16 copy unless a GEMV is chosen; prefill rows: bf16, as the
// prefill attention writes it), gate/up with SwiGLU (linear_swiglu: fused GEMV or product + SwiGLU kernel),
// down, LM head. Llama-3-8B shapes by default, random
// bf16 weights, `--layers` copies of each matrix so that consecutive calls read different weights (from HBM,
// as decode does, not from L2). Each op: `reps` calls captured into one CUDA graph (no launch gaps of the
// host in the figure), one untimed replay, then the median of 5 timed replays / reps. One JSON object per
// line: op, rows, n (output columns), k (input columns), us, GB/s (bytes the op must move / time), for the
// products weight_TBps (weight bytes / time) and lt_us (the fastest cuBLASLt candidate's autotune time), algo.
// With --variants 1 (default), for rows <= 8 every tensor-core GEMV variant (gemv.h: mma_gemv, fused
// mma_gemv_swiglu for gate/up) is also timed directly in a graph the same way: op "variant_<product>".
// A last line per row count sums one layer's operations (attention excluded) against the weight-read floor
// at --hbm-gbps.
//
//   model_ops_bench [--rows 1,2,4,8,16] [--hidden 4096] [--heads-q 32] [--heads-kv 8] [--head-dim 128]
//                   [--inter 14336] [--vocab 128256] [--layers 4] [--reps 20] [--hbm-gbps 4218] [--variants 1]
//                   [--out FILE]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_args.h"
#include "retroinfer/error.h"

#if defined(RETROINFER_WITH_CUDA)
#include <cuda_runtime.h>

#include "kernels/cuda_check.h"
#include "model/cuda/gemm.h"
#include "kernels/gemv.h"
#include "kernels/model_kernels.h"
#include "retroinfer/cuda_backend.h"
#endif

#if defined(RETROINFER_WITH_CUDA)
namespace {

using namespace retroinfer;
using cuda::DeviceBuffer;

struct Args {
  std::vector<long long> rows{1, 2, 4, 8, 16};
  long long hidden = 4096, hq = 32, hkv = 8, d = 128, inter = 14336, vocab = 128256;
  int layers = 4, reps = 20;
  bool variants = true;  // also time every tensor-core GEMV variant directly (rows <= 8)
  double hbm_gbps = 4218.0;
};

// Median time of one call of `op` (us): reps calls (op(r) for r in [0, reps)) in one graph, 5 timed replays.
template <typename Op>
double time_graph(cudaStream_t st, int reps, Op op) {
  cudaGraph_t g = nullptr;
  cudaGraphExec_t ge = nullptr;
  RETROINFER_CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
  try {
    for (int r = 0; r < reps; ++r) op(r);
  } catch (...) {
    cudaStreamEndCapture(st, &g);
    if (g != nullptr) cudaGraphDestroy(g);
    throw;
  }
  RETROINFER_CUDA_CHECK(cudaStreamEndCapture(st, &g));
  RETROINFER_CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  RETROINFER_CUDA_CHECK(cudaEventCreate(&e0));
  RETROINFER_CUDA_CHECK(cudaEventCreate(&e1));
  RETROINFER_CUDA_CHECK(cudaGraphLaunch(ge, st));  // warm-up
  std::vector<float> t;
  for (int i = 0; i < 5; ++i) {
    RETROINFER_CUDA_CHECK(cudaEventRecord(e0, st));
    RETROINFER_CUDA_CHECK(cudaGraphLaunch(ge, st));
    RETROINFER_CUDA_CHECK(cudaEventRecord(e1, st));
    RETROINFER_CUDA_CHECK(cudaEventSynchronize(e1));
    float ms = 0.0f;
    RETROINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    t.push_back(ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  std::sort(t.begin(), t.end());
  return 1000.0 * t[t.size() / 2] / reps;
}

// weight_bytes > 0 adds "weight_TBps" (weight bytes / time, the figure of a bandwidth-bound product); lt_us > 0
// adds "lt_us" (the fastest cuBLASLt candidate's time in the autotune, event-timed outside a graph).
void emit(FILE* out, const char* op, long long rows, long long n, long long k, double us, double bytes,
          const std::string& algo, double weight_bytes = 0.0, double lt_us = 0.0) {
  std::string extra;
  char buf[96];
  if (weight_bytes > 0.0) {
    std::snprintf(buf, sizeof buf, ",\"weight_TBps\":%.3f", weight_bytes / (us * 1e-6) / 1e12);
    extra += buf;
  }
  if (lt_us > 0.0) {
    std::snprintf(buf, sizeof buf, ",\"lt_us\":%.3f", lt_us);
    extra += buf;
  }
  std::fprintf(out, "{\"bench\":\"model_ops\",\"op\":\"%s\",\"rows\":%lld,\"n\":%lld,\"k\":%lld,\"us\":%.3f,"
               "\"GBps\":%.1f%s,\"algo\":\"%s\"}\n",
               op, rows, n, k, us, bytes / (us * 1e-6) / 1e9, extra.c_str(), algo.c_str());
  std::fflush(out);
}

// Every tensor-core GEMV variant (gemv.h) on one product, called directly (not through the autotune): rows <=
// kGemvMaxRows; f32_x: x is f32 (the O product's attention output), act: the fused SwiGLU output (gate/up).
void time_mma_variants(FILE* out, cudaStream_t st, int reps, const char* op, long long rows, long long n, long long k,
                       float beta, const std::vector<const void*>& ws, const uint16_t* xb, const float* xf, float* y,
                       uint16_t* act, bool f32_x) {
  if (rows > cuda::model::kGemvMaxRows) return;
  for (int tiles : cuda::model::kMmaGemvTiles)
    for (int warps : cuda::model::kMmaGemvWarps) {
      cuda::model::GemvParams p;
      p.x = f32_x ? nullptr : xb;
      p.x_f32 = f32_x ? xf : nullptr;
      p.y = y;
      p.act_bf16 = act;
      p.rows = rows;
      p.in = k;
      p.out = act != nullptr ? n / 2 : n;
      p.beta = beta;
      const double us = time_graph(st, reps, [&](int r) {
        p.w = static_cast<const uint16_t*>(ws[static_cast<size_t>(r) % ws.size()]);
        const cudaError_t e = act != nullptr ? cuda::model::mma_gemv_swiglu_bf16(p, tiles, warps, st)
                                             : cuda::model::mma_gemv_bf16(p, tiles, warps, st);
        cuda::detail::launch_check(e, "mma_gemv", st);
      });
      const double wbytes = double(n) * double(k) * 2;
      const double bytes = wbytes + double(rows * k) * (f32_x ? 4 : 2) +
                           (act != nullptr ? double(rows * n / 2) * 2 : double(rows * n) * (beta != 0 ? 8 : 4));
      const std::string name = std::string(act != nullptr ? "mma_gemv_swiglu" : "mma_gemv") + "(tiles=" +
                               std::to_string(tiles) + " warps=" + std::to_string(warps) + ")" +
                               (f32_x ? ", f32 x" : "");
      emit(out, (std::string("variant_") + op).c_str(), rows, n, k, us, bytes, name, wbytes);
    }
}

void run(FILE* out, const Args& a) {
  cudaStream_t st = nullptr;
  RETROINFER_CUDA_CHECK(cudaStreamCreate(&st));
  const long long h = a.hidden, qkvw = (a.hq + 2 * a.hkv) * a.d, attw = a.hq * a.d, inter = a.inter;
  const long long max_rows = *std::max_element(a.rows.begin(), a.rows.end());
  RETROINFER_CHECK(max_rows >= 1 && a.layers >= 1, "model_ops_bench: --rows and --layers must be >= 1");
  struct Mat {
    const char* op;
    long long n, k;
    float beta;
    std::vector<DeviceBuffer> w;
  };
  std::vector<Mat> mats;
  mats.push_back({"gemm_qkv", qkvw, h, 0.0f, {}});
  mats.push_back({"gemm_o", h, attw, 1.0f, {}});
  mats.push_back({"gemm_gate_up", 2 * inter, h, 0.0f, {}});
  mats.push_back({"gemm_down", h, inter, 1.0f, {}});
  mats.push_back({"gemm_lm_head", a.vocab, h, 0.0f, {}});
  uint64_t seed = 1;
  for (Mat& m : mats) {
    const int copies = std::string(m.op) == "gemm_lm_head" ? 1 : a.layers;  // one LM head per step anyway
    for (int l = 0; l < copies; ++l) {
      m.w.emplace_back(static_cast<size_t>(m.n * m.k) * 2);
      cuda::fill_random_bf16(m.w.back().as<uint16_t>(), static_cast<size_t>(m.n * m.k), seed++, 0.02f, st);
    }
  }
  const long long widest = std::max({h, attw, inter, qkvw, 2 * inter, a.vocab});
  DeviceBuffer xf(static_cast<size_t>(max_rows * widest) * 4), xb(static_cast<size_t>(max_rows * (widest + h)) * 2),
      y(static_cast<size_t>(max_rows * widest) * 4), normw(static_cast<size_t>(h) * 4);
  cuda::fill_random_f32(xf.as<float>(), static_cast<size_t>(max_rows * widest), 7, 1.0f, st);
  cuda::fill_random_bf16(xb.as<uint16_t>(), static_cast<size_t>(max_rows * widest), 8, 1.0f, st);
  cuda::fill_random_f32(normw.as<float>(), static_cast<size_t>(h), 9, 1.0f, st);
  RETROINFER_CUDA_CHECK(cudaMemsetAsync(y.data(), 0, y.bytes(), st));
  cuda::model::Gemm gemm(true, max_rows * attw);

  for (long long rows : a.rows) {
    double layer_us = 0.0, layer_weight_bytes = 0.0;
    // RMSNorm [rows, hidden] f32 -> bf16 (twice per layer).
    cuda::model::RmsNormParams np;
    np.x = xf.as<float>();
    np.w = normw.as<float>();
    np.y_bf16 = xb.as<uint16_t>();
    np.rows = rows;
    np.hidden = h;
    np.x_stride = h;
    const double norm_us = time_graph(st, a.reps, [&](int) {
      cuda::detail::launch_check(cuda::model::rms_norm(np, st), "rms_norm", st);
    });
    emit(out, "rms_norm", rows, h, h, norm_us, double(rows * h) * 6 + double(h) * 4,
         cuda::model::rms_norm_vectorised(np) ? "vectorised" : "scalar");
    layer_us += 2 * norm_us;
    // SwiGLU [rows, 2 inter] f32 -> [rows, inter] bf16.
    cuda::model::SwiGluParams sp;
    sp.gu = xf.as<float>();
    sp.act_bf16 = xb.as<uint16_t>();
    sp.rows = rows;
    sp.inter = inter;
    const double swiglu_us = time_graph(st, a.reps, [&](int) {
      cuda::detail::launch_check(cuda::model::swiglu(sp, st), "swiglu", st);
    });
    emit(out, "swiglu", rows, inter, 2 * inter, swiglu_us, double(rows * inter) * 10, "bf16 out");
    // The products; at decode rows gemm_o through the f32 -> bf16 copy of the attention output, as the runner
    // does (the prefill attention writes bf16 itself: above kGemmTuneMaxRows rows gemm_o takes bf16).
    for (Mat& m : mats) {
      std::vector<const void*> ws;
      for (const DeviceBuffer& b : m.w) ws.push_back(b.data());
      const bool f32_in = std::string(m.op) == "gemm_o" && rows <= cuda::model::kGemmTuneMaxRows;
      if (std::string(m.op) == "gemm_gate_up") {  // with SwiGLU, as the runner: fused GEMV or product + kernel
        const long long it = m.n / 2;
        uint16_t* act = xb.as<uint16_t>() + max_rows * h;  // apart from x (the fused GEMV reads x while writing)
        gemm.tune_swiglu(xb.as<uint16_t>(), rows, m.k, ws, it, y.as<float>(), act, st);
        const cuda::model::GemmChoice ch =
            gemm.choice_swiglu(xb.as<uint16_t>(), rows, m.k, ws[0], it, y.as<float>(), act, st);
        const double us = time_graph(st, a.reps, [&](int r) {
          gemm.linear_swiglu(xb.as<uint16_t>(), rows, m.k, ws[static_cast<size_t>(r) % ws.size()], it, y.as<float>(),
                             act, st);
        });
        const double wbytes = double(m.n * m.k) * 2;
        emit(out, "gemm_gate_up_swiglu", rows, m.n, m.k, us, wbytes + double(rows * m.k) * 2 + double(rows * it) * 2,
             ch.name, wbytes, ch.best_lt_us);
        layer_us += us;
        layer_weight_bytes += wbytes;
        if (a.variants)
          time_mma_variants(out, st, a.reps, "gemm_gate_up_swiglu", rows, m.n, m.k, 0.0f, ws, xb.as<uint16_t>(),
                            nullptr, nullptr, act, false);
        continue;
      }
      gemm.tune(xb.as<uint16_t>(), rows, m.k, ws, m.n, y.as<float>(), m.beta, st);  // outside the capture
      if (f32_in) gemm.linear(xf.as<float>(), rows, m.k, ws[0], m.n, y.as<float>(), m.beta, st);  // tunes its copy
      const cuda::model::GemmChoice ch =
          gemm.choice(xb.as<uint16_t>(), rows, m.k, ws[0], m.n, y.as<float>(), m.beta, st);
      const double us = time_graph(st, a.reps, [&](int r) {
        const void* w = ws[static_cast<size_t>(r) % ws.size()];
        if (f32_in) gemm.linear(xf.as<float>(), rows, m.k, w, m.n, y.as<float>(), m.beta, st);
        else gemm.linear(xb.as<uint16_t>(), rows, m.k, w, m.n, y.as<float>(), m.beta, st);
      });
      const double wbytes = double(m.n * m.k) * 2;
      const double bytes = wbytes + double(rows * m.k) * (f32_in ? 4 : 2) + double(rows * m.n) * (m.beta != 0 ? 8 : 4);
      // An f32 input goes through the bf16 copy kernel, unless the choice is the GEMV (it rounds x itself).
      const bool gemv = ch.name.rfind("gemv", 0) == 0 || ch.name.rfind("mma_gemv", 0) == 0;
      const bool copies = f32_in && !gemv;
      emit(out, m.op, rows, m.n, m.k, us, bytes, (copies ? "f32->bf16 copy + " : f32_in ? "f32 x into " : "") + ch.name,
           wbytes, ch.best_lt_us);
      if (a.variants && std::string(m.op) != "gemm_lm_head")
        time_mma_variants(out, st, a.reps, m.op, rows, m.n, m.k, m.beta, ws, xb.as<uint16_t>(), xf.as<float>(),
                          y.as<float>(), nullptr, f32_in);
      if (std::string(m.op) != "gemm_lm_head") {
        layer_us += us;
        layer_weight_bytes += wbytes;
      }
    }
    const double floor_us = layer_weight_bytes / (a.hbm_gbps * 1e9) * 1e6;
    std::fprintf(out, "{\"bench\":\"model_ops\",\"op\":\"layer_non_attention\",\"rows\":%lld,\"us\":%.3f,"
                 "\"weight_floor_us\":%.3f,\"hbm_gbps\":%.0f}\n",
                 rows, layer_us, floor_us, a.hbm_gbps);
    std::fflush(out);
  }
  RETROINFER_CUDA_CHECK(cudaStreamSynchronize(st));
  cudaStreamDestroy(st);
}

}  // namespace
#endif

int main(int argc, char** argv) {
#if defined(RETROINFER_WITH_CUDA)
  Args a;
#endif
  const char* out_path = nullptr;
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "model_ops_bench: %s needs a value\n", argv[i]);
      return 2;
    }
    const char* v = argv[++i];
    if (s == "--out") {
      out_path = v;
      continue;
    }
#if defined(RETROINFER_WITH_CUDA)
    if (s == "--rows") a.rows = retroinfer::bench::parse_list<long long>(v);
    else if (s == "--hidden") a.hidden = std::atoll(v);
    else if (s == "--heads-q") a.hq = std::atoll(v);
    else if (s == "--heads-kv") a.hkv = std::atoll(v);
    else if (s == "--head-dim") a.d = std::atoll(v);
    else if (s == "--inter") a.inter = std::atoll(v);
    else if (s == "--vocab") a.vocab = std::atoll(v);
    else if (s == "--layers") a.layers = std::atoi(v);
    else if (s == "--reps") a.reps = std::atoi(v);
    else if (s == "--hbm-gbps") a.hbm_gbps = std::atof(v);
    else if (s == "--variants") a.variants = std::atoi(v) != 0;
    else {
      std::fprintf(stderr, "model_ops_bench: unknown option %s\n", s.c_str());
      return 2;
    }
#else
    (void)v;
#endif
  }
#if defined(RETROINFER_WITH_CUDA)
  if (a.rows.empty() || a.reps < 1 || a.layers < 1 || a.hidden < 1 || a.inter < 1 || a.vocab < 1 || a.hq < 1 ||
      a.hkv < 1 || a.d < 1) {
    std::fprintf(stderr, "model_ops_bench: every size, --reps and --layers must be >= 1\n");
    return 2;
  }
  if (!retroinfer::cuda::device_available()) {
    std::fprintf(stderr, "model_ops_bench: %s\n", retroinfer::cuda::device_description().c_str());
    return 1;
  }
  FILE* out = stdout;
  if (out_path != nullptr) {
    out = std::fopen(out_path, "a");
    if (out == nullptr) {
      std::fprintf(stderr, "model_ops_bench: cannot open %s\n", out_path);
      return 1;
    }
  }
  std::fprintf(stderr, "model_ops_bench on %s\n", retroinfer::cuda::device_description().c_str());
  try {
    run(out, a);
  } catch (const retroinfer::Error& e) {
    std::fprintf(stderr, "model_ops_bench: %s\n", e.what());
    return 1;
  }
  if (out != stdout) std::fclose(out);
  return 0;
#else
  (void)out_path;
  std::fprintf(stderr, "model_ops_bench: built without the CUDA backend (configure with -DRETROINFER_CUDA=ON)\n");
  return 1;
#endif
}
