// Gemm: the model runner's products through cuBLAS / cuBLASLt / the GEMV of gemv.h, with the decode autotune
// (see gemm.h).
#include "model/cuda/gemm.h"

#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "kernels/cuda_check.h"
#include "kernels/gemv.h"
#include "kernels/model_kernels.h"

namespace retroinfer::cuda::model {
namespace {

const char* status_name(cublasStatus_t st) {
  switch (st) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "invalid value";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "architecture mismatch";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "execution failed";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "internal error";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "not supported";
    default: return "unknown status";
  }
}

void check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    RETROINFER_FAIL("cuBLAS ", what, " failed: ", status_name(st), " (", static_cast<int>(st),
                    "); check the device state and the matrix shapes");
}

// Largest power of two (at most 256) dividing the address: the alignment cuBLASLt may assume.
uint32_t alignment(const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  if (a == 0) return 256;
  const uintptr_t low = a & (~a + 1);
  return static_cast<uint32_t>(std::min<uintptr_t>(low, 256));
}

// One product shape with the pointer alignments (an algorithm chosen for one alignment may not run on a
// lower one) and whether y is read.
struct Key {
  int device = 0;
  int64_t n = 0, out = 0, in = 0;
  uint32_t align_w = 0, align_x = 0, align_y = 0;
  bool accumulate = false;
  bool swiglu = false;  // linear_swiglu: out = intermediate columns, align_y = the bf16 output's alignment
  bool y_bf16 = false;  // the product writes bf16 (linear_swiglu's gate/up above kGemmTuneMaxRows rows)
  auto tie() const { return std::tie(device, n, out, in, align_w, align_x, align_y, accumulate, swiglu, y_bf16); }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

// kMmaGemv: the tensor-core GEMV; kSwiGluUnfused: the tuned product into gu, then the SwiGLU kernel;
// kSwiGluGemv / kSwiGluMma: the fused GEMV (FMA / tensor-core).
enum class Kind { kGemmEx, kLt, kGemv, kMmaGemv, kSwiGluUnfused, kSwiGluGemv, kSwiGluMma };

struct Choice {
  Kind kind = Kind::kGemmEx;
  int cols = 0;                   // kGemv, kSwiGluGemv: output columns per CTA
  int tiles = 0, warps = 0;       // kMmaGemv, kSwiGluMma: the variant (gemv.h)
  cublasLtMatmulAlgo_t algo{};    // kLt
  size_t workspace = 0;           // kLt: bytes of workspace it needs
  std::string name = "gemm_ex";
  float us = 0.0f;
  float best_lt_us = 0.0f;        // the fastest cuBLASLt candidate's tuned time (0: none timed)
};

// The process-wide cache of tuned choices and the tuning time spent so far per row count (a session's
// decode uses one row count: its budget bounds the tuning a session adds).
struct TuneCache {
  std::recursive_mutex mu;  // recursive: tuning a fused SwiGLU product resolves the plain product inside
  std::map<Key, Choice> choices;
  std::map<int64_t, double> spent_s;
};
TuneCache& tune_cache() {
  static TuneCache c;
  return c;
}

// cuBLASLt descriptors of one (n, out, in): op(A) = W^T as [out, in] of column-major A [in, out] (lda = in),
// B = x^T column-major [in, n] (ldb = in), C = D = y^T column-major [out, n] (ldc = out).
struct LtDescs {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  LtDescs() = default;
  LtDescs(const LtDescs&) = delete;
  LtDescs& operator=(const LtDescs&) = delete;
  ~LtDescs() {
    if (c != nullptr) cublasLtMatrixLayoutDestroy(c);
    if (b != nullptr) cublasLtMatrixLayoutDestroy(b);
    if (a != nullptr) cublasLtMatrixLayoutDestroy(a);
    if (op != nullptr) cublasLtMatmulDescDestroy(op);
  }
};

struct Events {
  cudaEvent_t e0 = nullptr, e1 = nullptr;
  Events() {
    RETROINFER_CUDA_CHECK(cudaEventCreate(&e0));
    const cudaError_t st = cudaEventCreate(&e1);
    if (st != cudaSuccess) {
      cudaEventDestroy(e0);
      RETROINFER_CUDA_CHECK(st);
    }
  }
  ~Events() {
    cudaEventDestroy(e1);
    cudaEventDestroy(e0);
  }
  Events(const Events&) = delete;
  Events& operator=(const Events&) = delete;
};

std::string lt_name(const cublasLtMatmulAlgo_t& algo, size_t ws) {
  int32_t id = -1;
  uint32_t tile = 0, splitk = 0;
  size_t written = 0;
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof id, &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof tile, &written);
  cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk, sizeof splitk, &written);
  char buf[96];
  std::snprintf(buf, sizeof buf, "lt(id=%d tile=%u splitk=%u ws=%zu)", id, tile, splitk, ws);
  return buf;
}

}  // namespace

struct Gemm::Impl {
  cublasHandle_t h = nullptr;
  cublasLtHandle_t lt = nullptr;
  bool bf16 = true;
  int device = 0;   // the device current at construction (the handles and buffers belong to it)
  DeviceBuffer xb;  // [max_x_elems] bf16: f32 x rounded for the bf16 product
  DeviceBuffer ws;  // [kGemmLtWorkspaceBytes]: cuBLASLt workspace (bf16 weights only)
  std::map<std::tuple<int64_t, int64_t, int64_t, bool>, std::unique_ptr<LtDescs>> descs;

  ~Impl() {
    if (lt != nullptr) cublasLtDestroy(lt);
    if (h != nullptr) cublasDestroy(h);
  }

  Key key(const uint16_t* x, int64_t n, int64_t in, const void* w, int64_t out, const float* y, float beta) const {
    Key k;
    k.device = device;
    k.n = n;
    k.out = out;
    k.in = in;
    k.align_w = alignment(w);
    k.align_x = alignment(x);
    k.align_y = alignment(y);
    k.accumulate = beta != 0.0f;
    return k;
  }

  LtDescs& lt_descs(int64_t n, int64_t in, int64_t out, bool y_bf16) {
    auto& slot = descs[{n, in, out, y_bf16}];
    if (slot) return *slot;
    auto d = std::make_unique<LtDescs>();
    check(cublasLtMatmulDescCreate(&d->op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    check(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta), "set TRANSA");
    check(cublasLtMatmulDescSetAttribute(d->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb), "set TRANSB");
    check(cublasLtMatrixLayoutCreate(&d->a, CUDA_R_16BF, static_cast<uint64_t>(in), static_cast<uint64_t>(out), in),
          "cublasLtMatrixLayoutCreate(W)");
    check(cublasLtMatrixLayoutCreate(&d->b, CUDA_R_16BF, static_cast<uint64_t>(in), static_cast<uint64_t>(n), in),
          "cublasLtMatrixLayoutCreate(x)");
    check(cublasLtMatrixLayoutCreate(&d->c, y_bf16 ? CUDA_R_16BF : CUDA_R_32F, static_cast<uint64_t>(out),
                                     static_cast<uint64_t>(n), out),
          "cublasLtMatrixLayoutCreate(y)");
    slot = std::move(d);
    return *slot;
  }

  // cublasGemmEx (CUBLAS_GEMM_DEFAULT), y of type y_type (CUDA_R_32F or CUDA_R_16BF; f32 accumulation).
  cublasStatus_t gemm_ex_into(const uint16_t* x, int64_t n, int64_t in, const void* w, int64_t out, void* y,
                              cudaDataType_t y_type, float beta, cudaStream_t st) {
    const float alpha = 1.0f;
    const cublasStatus_t s1 = cublasSetStream(h, st);
    if (s1 != CUBLAS_STATUS_SUCCESS) return s1;
    // cuBLAS is column-major: row-major y [n, out] is C [out, n] (ldc = out); row-major W [out, in] is
    // [in, out] (lda = in), taken transposed; row-major x [n, in] is B [in, n] (ldb = in).
    const int m = static_cast<int>(out), nn = static_cast<int>(n), k = static_cast<int>(in);
    return cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &alpha, w, CUDA_R_16BF, k, x, CUDA_R_16BF, k, &beta, y,
                        y_type, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }

  // The GEMV arguments both product kinds share: x [n, in] bf16 against W [out, in] bf16 (gemv.h).
  static GemvParams gemv_params(const uint16_t* x, int64_t n, int64_t in, const void* w, int64_t out) {
    GemvParams p;
    p.w = static_cast<const uint16_t*>(w);
    p.x = x;
    p.rows = n;
    p.in = in;
    p.out = out;
    return p;
  }

  // Runs choice c; returns false (nothing thrown) when cuBLAS or the launch refuses it.
  bool run(const Choice& c, const uint16_t* x, int64_t n, int64_t in, const void* w, int64_t out, float* y,
           float beta, cudaStream_t st) {
    return run_into(c, x, n, in, w, out, y, false, beta, st);
  }

  // As run, y f32 or (y_bf16; cuBLAS kinds only) bf16.
  bool run_into(const Choice& c, const uint16_t* x, int64_t n, int64_t in, const void* w, int64_t out, void* y,
                bool y_bf16, float beta, cudaStream_t st) {
    if (c.kind == Kind::kGemmEx)
      return gemm_ex_into(x, n, in, w, out, y, y_bf16 ? CUDA_R_16BF : CUDA_R_32F, beta, st) == CUBLAS_STATUS_SUCCESS;
    if (y_bf16 && c.kind != Kind::kLt) return false;
    if (c.kind == Kind::kGemv || c.kind == Kind::kMmaGemv) {
      GemvParams p = gemv_params(x, n, in, w, out);
      p.y = static_cast<float*>(y);
      p.beta = beta;
      return (c.kind == Kind::kGemv ? gemv_bf16(p, c.cols, st) : mma_gemv_bf16(p, c.tiles, c.warps, st)) == cudaSuccess;
    }
    if (c.kind != Kind::kLt) return false;  // a SwiGLU kind: run_swiglu's
    LtDescs& d = lt_descs(n, in, out, y_bf16);
    const float alpha = 1.0f;
    return cublasLtMatmul(lt, d.op, &alpha, w, d.a, x, d.b, &beta, y, d.c, y, d.c, &c.algo, ws.data(), ws.bytes(),
                          st) == CUBLAS_STATUS_SUCCESS;
  }

  // The candidates for key k: cuBLASLt's heuristic list (its first, the heuristic pick, first of all; then,
  // for n <= kGemvMaxRows, the tensor-core GEMV variants, so that a spent budget still times them), the
  // GEMV variants, cublasGemmEx. Above kGemmTuneMaxRows rows the first kGemmPrefillTuneCandidates of
  // cuBLASLt's list and cublasGemmEx.
  std::vector<Choice> candidates(const Key& k, const uint16_t* x, const void* w, const float* y) {
    std::vector<Choice> out;
    LtDescs& d = lt_descs(k.n, k.in, k.out, k.y_bf16);
    cublasLtMatmulPreference_t pref = nullptr;
    check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint64_t ws_bytes = ws.bytes();
    bool ok = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                   sizeof ws_bytes) == CUBLAS_STATUS_SUCCESS;
    const uint32_t aw = k.align_w, ax = k.align_x, ay = k.align_y;
    ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aw, sizeof aw) ==
                   CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ax, sizeof ax) ==
                   CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ay, sizeof ay) ==
                   CUBLAS_STATUS_SUCCESS;
    ok = ok && cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ay, sizeof ay) ==
                   CUBLAS_STATUS_SUCCESS;
    const int wanted = k.n > kGemmTuneMaxRows ? kGemmPrefillTuneCandidates : kGemmTuneCandidates;
    std::vector<cublasLtMatmulHeuristicResult_t> res(static_cast<size_t>(wanted));
    int found = 0;
    if (ok && cublasLtMatmulAlgoGetHeuristic(lt, d.op, d.a, d.b, d.c, d.c, pref, wanted, res.data(), &found) !=
                  CUBLAS_STATUS_SUCCESS)
      found = 0;  // no cuBLASLt candidate: the others remain
    cublasLtMatmulPreferenceDestroy(pref);
    for (int i = 0; i < found; ++i) {
      if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > ws.bytes()) continue;
      Choice c;
      c.kind = Kind::kLt;
      c.algo = res[i].algo;
      c.workspace = res[i].workspaceSize;
      c.name = lt_name(c.algo, c.workspace);
      out.push_back(c);
    }
    GemvParams gp;
    gp.w = static_cast<const uint16_t*>(w);
    gp.x = x;
    gp.y = const_cast<float*>(y);
    gp.rows = k.n;
    gp.in = k.in;
    gp.out = k.out;
    if (!k.y_bf16 && gemv_supported(gp)) {
      std::vector<Choice> mma = mma_candidates(Kind::kMmaGemv, "mma_gemv");
      out.insert(out.begin() + (out.empty() ? 0 : 1), mma.begin(), mma.end());
    }
    if (!k.y_bf16 && gemv_supported(gp)) {
      for (int cols : {1, 2, 4}) {
        Choice c;
        c.kind = Kind::kGemv;
        c.cols = cols;
        c.name = "gemv(cols=" + std::to_string(cols) + ")";
        out.push_back(c);
      }
    }
    out.push_back(Choice{});  // cublasGemmEx, CUBLAS_GEMM_DEFAULT
    return out;
  }

  // The tensor-core GEMV variants of gemv.h as choices of kind (kMmaGemv or kSwiGluMma).
  static std::vector<Choice> mma_candidates(Kind kind, const char* name) {
    std::vector<Choice> out;
    for (int tiles : kMmaGemvTiles)
      for (int warps : kMmaGemvWarps) {
        Choice c;
        c.kind = kind;
        c.tiles = tiles;
        c.warps = warps;
        c.name = std::string(name) + "(tiles=" + std::to_string(tiles) + " warps=" + std::to_string(warps) + ")";
        out.push_back(c);
      }
    return out;
  }

  // Times the candidates (run_one(c, w) issues candidate c on weights w; false: refused) and returns the
  // fastest; the caller holds the cache lock. Each candidate: one untimed warm-up, then reps calls (rep r on
  // weights ws[(r + 1) % size], so that with several layers' weights they come from HBM), reps sized to
  // ~300 us of work (2..10). Logs one line to stderr.
  Choice time_candidates(const Key& k, const char* what, std::vector<Choice>& cands,
                         const std::function<bool(const Choice&, const void*)>& run_one,
                         std::span<const void* const> ws_list, cudaStream_t st, double& spent_s) {
    const auto t0 = std::chrono::steady_clock::now();
    Events ev;
    Choice best;
    bool have = false;
    int timed = 0;
    std::string others;
    for (Choice& c : cands) {
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (have && spent_s + elapsed > kGemmTuneBudgetS) break;  // budget spent: keep the best so far
      RETROINFER_CUDA_CHECK(cudaEventRecord(ev.e0, st));
      if (!run_one(c, ws_list[0])) {
        (void)cudaGetLastError();  // a refused launch (invalid configuration) is not sticky
        continue;
      }
      RETROINFER_CUDA_CHECK(cudaEventRecord(ev.e1, st));
      RETROINFER_CUDA_CHECK(cudaEventSynchronize(ev.e1));
      float warm_ms = 0.0f;
      RETROINFER_CUDA_CHECK(cudaEventElapsedTime(&warm_ms, ev.e0, ev.e1));
      const int reps = std::clamp(static_cast<int>(0.3f / std::max(warm_ms, 1e-3f)), 2, 10);
      RETROINFER_CUDA_CHECK(cudaEventRecord(ev.e0, st));
      bool ok = true;
      for (int r = 0; r < reps && ok; ++r) ok = run_one(c, ws_list[static_cast<size_t>(r + 1) % ws_list.size()]);
      RETROINFER_CUDA_CHECK(cudaEventRecord(ev.e1, st));
      RETROINFER_CUDA_CHECK(cudaEventSynchronize(ev.e1));
      if (!ok) {
        (void)cudaGetLastError();
        continue;
      }
      detail::launch_check(cudaSuccess, "Gemm autotune", st);  // a faulting candidate is an error, not skipped
      float ms = 0.0f;
      RETROINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, ev.e0, ev.e1));
      c.us = 1000.0f * ms / static_cast<float>(reps);
      ++timed;
      if (c.kind == Kind::kGemmEx || c.kind == Kind::kSwiGluUnfused) {
        char buf[160];
        std::snprintf(buf, sizeof buf, " %s %.2f us;", c.name.c_str(), c.us);
        others = buf;
      }
      if (!have || c.us < best.us) {
        best = c;
        have = true;
      }
    }
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    spent_s += took;
    if (!have)
      RETROINFER_FAIL("Gemm: no algorithm ran for the ", what, " [", k.n, ", ", k.in, "] x [", k.out, ", ", k.in,
                      "]^T (cuBLAS and the GEMV refused every candidate); check the device state and the shapes");
    float best_lt = 0.0f;
    for (const Choice& c : cands)
      if (c.kind == Kind::kLt && c.us > 0.0f && (best_lt == 0.0f || c.us < best_lt)) best_lt = c.us;
    std::fprintf(stderr,
                 "[retroinfer] %s autotune n=%lld out=%lld in=%lld: %s %.2f us (best cuBLASLt %.2f us;%s "
                 "%d of %zu candidates timed in %.1f ms)\n",
                 what, static_cast<long long>(k.n), static_cast<long long>(k.out), static_cast<long long>(k.in),
                 best.name.c_str(), best.us, best_lt, others.c_str(), timed, cands.size(), 1000.0 * took);
    best.best_lt_us = best_lt;
    return best;
  }

  Choice tune_key(const Key& k, const uint16_t* x, std::span<const void* const> ws_list, float* y, float beta,
                  cudaStream_t st, double& spent_s) {
    std::vector<Choice> cands = candidates(k, x, ws_list[0], y);
    return time_candidates(
        k, k.y_bf16 ? "gemm(bf16 out)" : "gemm", cands,
        [&](const Choice& c, const void* w) { return run_into(c, x, k.n, k.in, w, k.out, y, k.y_bf16, beta, st); },
        ws_list, st, spent_s);
  }

  // act [n, inter] bf16 = SwiGLU(x @ W^T), W [2 inter, in], through choice c (a SwiGLU kind); gu [n, 2 inter]
  // f32 holds the unfused product. False when refused.
  bool run_swiglu(const Choice& c, const uint16_t* x, int64_t n, int64_t in, const void* w, int64_t inter, float* gu,
                  uint16_t* act, cudaStream_t st) {
    if (c.kind == Kind::kSwiGluGemv || c.kind == Kind::kSwiGluMma) {
      GemvParams p = gemv_params(x, n, in, w, inter);
      p.act_bf16 = act;
      if (c.kind == Kind::kSwiGluGemv) return gemv_swiglu_bf16(p, c.cols, st) == cudaSuccess;
      return mma_gemv_swiglu_bf16(p, c.tiles, c.warps, st) == cudaSuccess;
    }
    SwiGluParams sp;
    if (n > kGemmTuneMaxRows) {
      // Prefill rows: gate/up in bf16 (the front half of gu), which halves the bytes of the product's output
      // and of the SwiGLU's input, the largest activation of the layer (2 x 14336 values a row for
      // Llama-3-8B); the algorithm tuned for the shape when tune_swiglu ran for it, else cublasGemmEx's.
      uint16_t* gu16 = reinterpret_cast<uint16_t*>(gu);
      const Choice pc = cached_or_gemm_ex(gate_up_bf16_key(x, n, in, w, inter, gu));
      if (!run_into(pc, x, n, in, w, 2 * inter, gu16, true, 0.0f, st)) return false;
      sp.gu_bf16 = gu16;
    } else {
      const Choice pc = resolve_for_call(key(x, n, in, w, 2 * inter, gu, 0.0f), x, w, gu, 0.0f, st);
      if (!run(pc, x, n, in, w, 2 * inter, gu, 0.0f, st)) return false;
      sp.gu = gu;
    }
    sp.act_bf16 = act;
    sp.rows = n;
    sp.inter = inter;
    return swiglu(sp, st) == cudaSuccess;
  }

  // The cached SwiGLU choice of (n <= kGemmTuneMaxRows) rows, tuned now if new: the unfused pair (its product
  // tuned first, over the same weights) against the fused GEMVs (the tensor-core variants, then 1 and 2
  // columns per CTA). gu and act are clobbered.
  Choice resolve_swiglu(const uint16_t* x, int64_t n, int64_t in, std::span<const void* const> ws_list,
                        int64_t inter, float* gu, uint16_t* act, cudaStream_t st) {
    Key k = key(x, n, in, ws_list[0], inter, reinterpret_cast<const float*>(act), 0.0f);
    k.swiglu = true;
    TuneCache& tc = tune_cache();
    std::lock_guard<std::recursive_mutex> lock(tc.mu);
    auto it = tc.choices.find(k);
    if (it != tc.choices.end()) return it->second;
    const Choice plain = resolve(key(x, n, in, ws_list[0], 2 * inter, gu, 0.0f), x, ws_list, gu, 0.0f, st);
    std::vector<Choice> cands;
    Choice unfused;
    unfused.kind = Kind::kSwiGluUnfused;
    unfused.name = plain.name + " + swiglu";
    cands.push_back(unfused);
    GemvParams p;
    p.w = static_cast<const uint16_t*>(ws_list[0]);
    p.x = x;
    p.act_bf16 = act;
    p.rows = n;
    p.in = in;
    p.out = inter;
    if (gemv_swiglu_supported(p)) {
      const std::vector<Choice> mma = mma_candidates(Kind::kSwiGluMma, "mma_gemv_swiglu");
      cands.insert(cands.end(), mma.begin(), mma.end());
      for (int cols : {1, 2}) {
        Choice c;
        c.kind = Kind::kSwiGluGemv;
        c.cols = cols;
        c.name = "gemv_swiglu(cols=" + std::to_string(cols) + ")";
        cands.push_back(c);
      }
    }
    Choice c = time_candidates(
        k, "gate_up+swiglu", cands,
        [&](const Choice& cc, const void* w) { return run_swiglu(cc, x, n, in, w, inter, gu, act, st); }, ws_list, st,
        tc.spent_s[k.n]);
    c.best_lt_us = plain.best_lt_us;  // the gate/up product alone (no cuBLASLt candidate in this list)
    tc.choices.emplace(k, c);
    return c;
  }

  // The key of linear_swiglu's bf16 gate/up product (above kGemmTuneMaxRows rows).
  Key gate_up_bf16_key(const uint16_t* x, int64_t n, int64_t in, const void* w, int64_t inter, const float* gu) const {
    Key k = key(x, n, in, w, 2 * inter, gu, 0.0f);
    k.y_bf16 = true;
    return k;
  }

  // The cached choice for key k, or cublasGemmEx's when none is (a prefill shape nothing tuned: tuning it
  // inside a prefill would synchronise between its layers).
  Choice cached_or_gemm_ex(const Key& k) {
    TuneCache& tc = tune_cache();
    std::lock_guard<std::recursive_mutex> lock(tc.mu);
    auto it = tc.choices.find(k);
    return it != tc.choices.end() ? it->second : Choice{};
  }

  // The cached choice for key k, tuned now if new (y_scratch: an [n, out] f32 buffer the tuning may clobber).
  Choice resolve(const Key& k, const uint16_t* x, std::span<const void* const> ws_list, float* y_scratch, float beta,
                 cudaStream_t st) {
    TuneCache& tc = tune_cache();
    std::lock_guard<std::recursive_mutex> lock(tc.mu);
    auto it = tc.choices.find(k);
    if (it != tc.choices.end()) return it->second;
    const Choice c = tune_key(k, x, ws_list, y_scratch, beta, st, tc.spent_s[k.n]);
    tc.choices.emplace(k, c);
    return c;
  }

  Choice resolve_for_call(const Key& k, const uint16_t* x, const void* w, float* y, float beta, cudaStream_t st) {
    {
      TuneCache& tc = tune_cache();
      std::lock_guard<std::recursive_mutex> lock(tc.mu);
      auto it = tc.choices.find(k);
      if (it != tc.choices.end()) return it->second;
    }
    const void* one[1] = {w};
    if (beta == 0.0f) return resolve(k, x, one, y, beta, st);  // y is overwritten by the call anyway
    DeviceBuffer scratch(static_cast<size_t>(k.n * k.out) * 4);  // y holds data the call accumulates into
    RETROINFER_CUDA_CHECK(cudaMemsetAsync(scratch.data(), 0, scratch.bytes(), st));
    const Choice c = resolve(k, x, one, scratch.as<float>(), beta, st);
    RETROINFER_CUDA_CHECK(cudaStreamSynchronize(st));  // before scratch is freed
    return c;
  }
};

Gemm::Gemm(bool bf16_weights, int64_t max_x_elems) : impl_(std::make_unique<Impl>()) {
  Impl& im = *impl_;
  im.bf16 = bf16_weights;
  RETROINFER_CUDA_CHECK(cudaGetDevice(&im.device));
  check(cublasCreate(&im.h), "cublasCreate");
  if (im.bf16) {
    check(cublasLtCreate(&im.lt), "cublasLtCreate");
    im.ws = DeviceBuffer(static_cast<size_t>(kGemmLtWorkspaceBytes));
    if (max_x_elems > 0) im.xb = DeviceBuffer(static_cast<size_t>(max_x_elems) * 2);
  }
}

Gemm::~Gemm() = default;

namespace {
void check_shape(int64_t n, int64_t in, int64_t out) {
  RETROINFER_CHECK(n >= 1 && in >= 1 && out >= 1 && n <= INT_MAX && in <= INT_MAX && out <= INT_MAX,
                   "Gemm: shape [", n, ", ", in, "] x [", out, ", ", in, "]^T outside cuBLAS's int range");
}
}  // namespace

void Gemm::linear(const float* x, int64_t n, int64_t in, const void* w, int64_t out, float* y, float beta, Stream s) {
  check_shape(n, in, out);
  Impl& im = *impl_;
  auto st = static_cast<cudaStream_t>(s);
  if (im.bf16) {
    RETROINFER_CHECK(static_cast<size_t>(n * in) * 2 <= im.xb.bytes(), "Gemm: ", n * in,
                     " activations exceed the bf16 workspace of ", im.xb.bytes() / 2);
    if (n <= kGemmTuneMaxRows && alignment(x) >= 16) {
      // The choice for the bf16 copy; a GEMV reads x itself, rounding as the copy would (bit-identical).
      const Choice c = im.resolve_for_call(im.key(im.xb.as<uint16_t>(), n, in, w, out, y, beta), im.xb.as<uint16_t>(),
                                           w, y, beta, st);
      GemvParams p;
      p.w = static_cast<const uint16_t*>(w);
      p.x_f32 = x;
      p.y = y;
      p.rows = n;
      p.in = in;
      p.out = out;
      p.beta = beta;
      if (c.kind == Kind::kGemv && gemv_supported(p)) {
        detail::launch_check(gemv_bf16(p, c.cols, st), "gemv_bf16(f32 x)", st);
        return;
      }
      if (c.kind == Kind::kMmaGemv && gemv_supported(p)) {
        detail::launch_check(mma_gemv_bf16(p, c.tiles, c.warps, st), "mma_gemv_bf16(f32 x)", st);
        return;
      }
    }
    detail::launch_check(f32_to_bf16_array(x, im.xb.as<uint16_t>(), static_cast<size_t>(n * in), st), "f32_to_bf16",
                         st);
    linear(im.xb.as<uint16_t>(), n, in, w, out, y, beta, s);
    return;
  }
  const float alpha = 1.0f;
  check(cublasSetStream(im.h, st), "cublasSetStream");
  // Column-major view as in Impl::gemm_ex.
  const int m = static_cast<int>(out), nn = static_cast<int>(n), k = static_cast<int>(in);
  check(cublasGemmEx(im.h, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &alpha, w, CUDA_R_32F, k, x, CUDA_R_32F, k, &beta, y,
                     CUDA_R_32F, m, CUBLAS_COMPUTE_32F_PEDANTIC, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx(f32)");
  detail::launch_check(cudaSuccess, "cublasGemmEx", st);
}

void Gemm::linear(const uint16_t* x, int64_t n, int64_t in, const void* w, int64_t out, float* y, float beta,
                  Stream s) {
  check_shape(n, in, out);
  Impl& im = *impl_;
  RETROINFER_CHECK(im.bf16, "Gemm: a bf16 input needs bf16 weights; this Gemm was made for f32 weights");
  auto st = static_cast<cudaStream_t>(s);
  if (n > kGemmTuneMaxRows) {
    const Choice c = im.cached_or_gemm_ex(im.key(x, n, in, w, out, y, beta));
    if (!im.run(c, x, n, in, w, out, y, beta, st))
      RETROINFER_FAIL("Gemm: ", c.name, " refused [", n, ", ", in, "] x [", out, ", ", in, "]^T: ",
                      cudaGetErrorString(cudaGetLastError()), "; check the device state");
  } else {
    const Choice c = im.resolve_for_call(im.key(x, n, in, w, out, y, beta), x, w, y, beta, st);
    if (!im.run(c, x, n, in, w, out, y, beta, st))
      RETROINFER_FAIL("Gemm: the tuned algorithm ", c.name, " refused [", n, ", ", in, "] x [", out, ", ", in,
                      "]^T: ", cudaGetErrorString(cudaGetLastError()), "; check the device state");
  }
  detail::launch_check(cudaSuccess, "Gemm::linear", st);
}

void Gemm::linear_swiglu(const uint16_t* x, int64_t n, int64_t in, const void* w, int64_t inter, float* gu,
                         uint16_t* act, Stream s) {
  check_shape(n, in, 2 * inter);
  Impl& im = *impl_;
  RETROINFER_CHECK(im.bf16, "Gemm::linear_swiglu needs bf16 weights; this Gemm was made for f32 weights");
  auto st = static_cast<cudaStream_t>(s);
  Choice c;  // kSwiGluUnfused by default (prefill rows: cublasGemmEx + the SwiGLU kernel)
  c.kind = Kind::kSwiGluUnfused;
  if (n <= kGemmTuneMaxRows) {
    const void* one[1] = {w};
    c = im.resolve_swiglu(x, n, in, one, inter, gu, act, st);
  }
  if (!im.run_swiglu(c, x, n, in, w, inter, gu, act, st))
    RETROINFER_FAIL("Gemm: the gate/up + SwiGLU choice ", c.name, " refused [", n, ", ", in, "] x [", 2 * inter, ", ",
                    in, "]^T: ", cudaGetErrorString(cudaGetLastError()), "; check the device state");
  detail::launch_check(cudaSuccess, "Gemm::linear_swiglu", st);
}

void Gemm::tune_swiglu(const uint16_t* x, int64_t n, int64_t in, std::span<const void* const> ws, int64_t inter,
                       float* gu, uint16_t* act, Stream s) {
  check_shape(n, in, 2 * inter);
  Impl& im = *impl_;
  if (!im.bf16) return;
  RETROINFER_CHECK(!ws.empty() && x != nullptr && gu != nullptr && act != nullptr,
                   "Gemm::tune_swiglu: needs x, weights, gu and act");
  if (n > kGemmTuneMaxRows) {  // the bf16 gate/up product alone (the SwiGLU kernel after it is fixed)
    im.resolve(im.gate_up_bf16_key(x, n, in, ws[0], inter, gu), x, ws, gu, 0.0f, static_cast<cudaStream_t>(s));
    return;
  }
  im.resolve_swiglu(x, n, in, ws, inter, gu, act, static_cast<cudaStream_t>(s));
}

GemmChoice Gemm::choice_swiglu(const uint16_t* x, int64_t n, int64_t in, const void* w, int64_t inter, float* gu,
                               uint16_t* act, Stream s) {
  check_shape(n, in, 2 * inter);
  Impl& im = *impl_;
  if (!im.bf16) return GemmChoice{"gemm_ex(f32, pedantic) + swiglu", 0.0f, 0.0f};
  if (n > kGemmTuneMaxRows) {
    const Choice c = im.cached_or_gemm_ex(im.gate_up_bf16_key(x, n, in, w, inter, gu));
    return GemmChoice{c.name + "(bf16 out) + swiglu", c.us, c.best_lt_us};
  }
  const void* one[1] = {w};
  const Choice c = im.resolve_swiglu(x, n, in, one, inter, gu, act, static_cast<cudaStream_t>(s));
  return GemmChoice{c.name, c.us, c.best_lt_us};
}

void Gemm::tune(const uint16_t* x, int64_t n, int64_t in, std::span<const void* const> ws, int64_t out,
                float* y_scratch, float beta, Stream s) {
  check_shape(n, in, out);
  Impl& im = *impl_;
  if (!im.bf16) return;
  RETROINFER_CHECK(!ws.empty() && x != nullptr && y_scratch != nullptr, "Gemm::tune: needs x, weights and a scratch y");
  im.resolve(im.key(x, n, in, ws[0], out, y_scratch, beta), x, ws, y_scratch, beta, static_cast<cudaStream_t>(s));
}

GemmChoice Gemm::choice(const uint16_t* x, int64_t n, int64_t in, const void* w, int64_t out, float* y, float beta,
                        Stream s) {
  check_shape(n, in, out);
  Impl& im = *impl_;
  if (!im.bf16) return GemmChoice{"gemm_ex(f32, pedantic)", 0.0f, 0.0f};
  if (n > kGemmTuneMaxRows) {
    const Choice c = im.cached_or_gemm_ex(im.key(x, n, in, w, out, y, beta));
    return GemmChoice{c.name, c.us, c.best_lt_us};
  }
  const Choice c = im.resolve_for_call(im.key(x, n, in, w, out, y, beta), x, w, y, beta, static_cast<cudaStream_t>(s));
  return GemmChoice{c.name, c.us, c.best_lt_us};
}

}  // namespace retroinfer::cuda::model
