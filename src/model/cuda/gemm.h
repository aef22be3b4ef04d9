// The runner's matrix products: y[n, out] = x[n, in] @ W[out, in]^T + beta * y, y f32 row-major, W row-major
// in bf16 or f32, x f32 or (bf16 weights only) bf16. Included only from src/model/cuda, tests/gpu and bench.
//
// bf16 weights: the product takes bf16 x (linear(const uint16_t*...), written directly by the producer:
// RMSNorm, SwiGLU) or f32 x, rounded to bf16 into a workspace first (or, when the tuned choice for that
// workspace is a GEMV, FMA or tensor-core, rounded by the GEMV as it loads x: the same values, no copy
// kernel); bf16 inputs, f32 accumulation and output. Rounding x (relative 2^-9) is the extra error against
// the CPU.
//   n <= kGemmTuneMaxRows (decode): an autotuned choice per (n, out, in, pointer alignments): cuBLASLt's
//   heuristic candidates (up to kGemmTuneCandidates) and, for n <= kGemvMaxRows, the hand-written GEMVs of
//   gemv.h (tensor-core mma_gemv: 1 or 2 tiles x 4, 8 or 16 warps per CTA, timed right after cuBLASLt's
//   heuristic pick; FMA gemv: 1, 2, 4 columns per CTA), each timed with CUDA events on the real weights
//   (tune() rotates over several layers' weights so that they stream from HBM as in decode, not from L2);
//   the fastest is kept in a process-wide cache (every Gemm of the process reuses it, so sessions of one
//   process pick the same kernels: forks stay bitwise equal). The time spent tuning is bounded
//   (kGemmTuneBudgetS per row count per process; past it a new shape times only its first candidate,
//   cuBLASLt's heuristic pick) and logged once per shape to stderr.
//   n > kGemmTuneMaxRows (prefill): the choice tune() / tune_swiglu() made for the shape (the session tunes its
//   prefill chunk's row count when it is created: the first kGemmPrefillTuneCandidates of cuBLASLt's heuristic
//   list and cublasGemmEx, timed the same way), else cublasGemmEx with CUBLAS_GEMM_DEFAULT (a shape is never
//   tuned inside a prefill, whose layers would wait for it). linear_swiglu's gate/up product writes bf16 there
//   (as a bf16 model computes it), which its SwiGLU widens back to f32.
//   Tuning synchronises the stream: tune a shape (tune(), or one call) before capturing a CUDA graph over it.
// f32 weights: cublasGemmEx with f32 inputs and CUBLAS_COMPUTE_32F_PEDANTIC, so that neither the math mode
// nor NVIDIA_TF32_OVERRIDE can switch to TF32: the f32 path differs from the CPU's cblas_sgemm only in
// summation order (not tuned).
// Threading contract: one host thread at a time per Gemm (the handles are bound to the stream of each call);
// the process-wide cache is locked.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "retroinfer/cuda_backend.h"

namespace retroinfer::cuda::model {

constexpr int64_t kGemmTuneMaxRows = 16;
constexpr int kGemmTuneCandidates = 16;
// cuBLASLt candidates timed for a prefill shape: its heuristic ranks the large tiles well, and each timing of
// a [8192, 4096] x [28672, 4096]^T product costs ~10 ms.
constexpr int kGemmPrefillTuneCandidates = 8;
// cuBLASLt workspace per Gemm (split-K partial sums of the decode shapes: n * out * 4 bytes per split, at most
// 16 x 28672 x 4 = 1.8 MB for Llama-3-8B's gate/up, so 16 MiB leaves room for 8 splits).
constexpr int64_t kGemmLtWorkspaceBytes = int64_t{16} << 20;
constexpr double kGemmTuneBudgetS = 0.5;

// What linear() runs for one shape (for the benchmark and the tests).
struct GemmChoice {
  std::string name;   // "gemm_ex", "lt(id=.. tile=.. splitk=.. ws=..)", "gemv(cols=..)", "gemv_swiglu(cols=..)",
                      // "mma_gemv(tiles=.. warps=..)", "mma_gemv_swiglu(tiles=.. warps=..)", "<product> + swiglu"
  float us = 0.0f;    // its tuned time per call (0: not timed)
  float best_lt_us = 0.0f;  // the fastest cuBLASLt candidate's tuned time (linear_swiglu: of the gate/up product
                            // alone; 0: none timed)
};

class Gemm {
 public:
  // max_x_elems: the largest n * in of an f32-input bf16 product (sizes the bf16 copy of x; 0 for f32
  // weights).
  Gemm(bool bf16_weights, int64_t max_x_elems);
  ~Gemm();
  Gemm(const Gemm&) = delete;
  Gemm& operator=(const Gemm&) = delete;

  // x: device [n, in] f32; w: device [out, in] (bf16 bits or f32 as constructed); y: device [n, out] f32.
  // beta 0 overwrites y, 1 accumulates (the residual adds).
  void linear(const float* x, int64_t n, int64_t in, const void* w, int64_t out, float* y, float beta, Stream s);
  // x: device [n, in] bf16 (bf16 weights only; throws otherwise), the rest as above.
  void linear(const uint16_t* x, int64_t n, int64_t in, const void* w, int64_t out, float* y, float beta, Stream s);

  // act [n, inter] bf16 = SwiGLU of the gate/up product: silu(x @ Wg^T) * (x @ Wu^T) rounded to bf16, for
  // x [n, in] bf16 and w [2 inter, in] bf16 (gate rows, then up rows), bf16 weights only. Either the product
  // into gu [n, 2 inter] (f32 for n <= kGemmTuneMaxRows, tuned as linear(); bf16 in gu's first half above)
  // followed by the SwiGLU kernel, or, for n <= kGemvMaxRows when the autotune finds it faster, one fused GEMV
  // (FMA or tensor-core; gu untouched). act must not overlap x.
  void linear_swiglu(const uint16_t* x, int64_t n, int64_t in, const void* w, int64_t inter, float* gu, uint16_t* act,
                     Stream s);
  // As tune(), for linear_swiglu (gu and act are clobbered; n > kGemmTuneMaxRows: the bf16 gate/up product).
  void tune_swiglu(const uint16_t* x, int64_t n, int64_t in, std::span<const void* const> ws, int64_t inter,
                   float* gu, uint16_t* act, Stream s);
  // The choice linear_swiglu makes for these pointers (tuning it first if needed, n <= kGemmTuneMaxRows;
  // clobbers gu and act).
  GemmChoice choice_swiglu(const uint16_t* x, int64_t n, int64_t in, const void* w, int64_t inter, float* gu,
                           uint16_t* act, Stream s);

  // Tunes the product of n rows (bf16 weights; else a no-op) before first use (n > kGemmTuneMaxRows: before any
  // use, which does not tune):
  // x device [n, in] bf16 (any values), ws: the weights [out, in] bf16 of every layer with this shape (timing
  // rotates over them), y_scratch device [n, out] f32 (overwritten), beta as the later calls will use. linear()
  // tunes a new shape itself on first use (over its one weight matrix); this call keeps that out of the first
  // decode step and times with the weights streaming from HBM.
  void tune(const uint16_t* x, int64_t n, int64_t in, std::span<const void* const> ws, int64_t out, float* y_scratch,
            float beta, Stream s);
  // The choice linear(bf16 x) makes for this call's shape and pointers (tuning it first if needed,
  // n <= kGemmTuneMaxRows).
  GemmChoice choice(const uint16_t* x, int64_t n, int64_t in, const void* w, int64_t out, float* y, float beta,
                    Stream s);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace retroinfer::cuda::model
