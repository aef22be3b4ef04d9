// Thread count of the CPU forward pass: OpenMP loops and OpenBLAS's own pool.
#include <cblas.h>
#include <omp.h>

#include <cstdlib>
#include <cstring>

#include "model/linear.h"
#include "retroinfer/error.h"
#include "retroinfer/model.h"

namespace retroinfer {

void set_num_threads(int n) {
  RETROINFER_CHECK(n >= 1, "threads: need at least 1, got ", n);
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

namespace model {
bool blas_serial_in_parallel_regions() { return openblas_get_parallel() == 2; }  // 2: OpenMP
}  // namespace model

const char* blas_core_name() {
  const char* core = openblas_get_corename();
  return core != nullptr ? core : "";
}

// Debian 12's OpenBLAS 0.3.21 names the GPU machine's Xeon "Prescott" (SSE3 kernels): its CPU prefill of
// SmolLM2 at 4K tokens on 16 threads ran at 312 tok/s, 580 with OPENBLAS_CORETYPE=SkylakeX.
const char* better_blas_core() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr || std::strcmp(blas_core_name(), "Prescott") != 0) return nullptr;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
      __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

}  // namespace retroinfer
