// Thread count of the CPU forward pass: OpenMP loops and OpenBLAS's own pool.
#include <cblas.h>
#include <omp.h>

#include "retroinfer/error.h"
#include "retroinfer/model.h"

namespace retroinfer {

void set_num_threads(int n) {
  RETROINFER_CHECK(n >= 1, "threads: need at least 1, got ", n);
  omp_set_num_threads(n);
  openblas_set_num_threads(n);
}

int num_threads() { return omp_get_max_threads(); }

}  // namespace retroinfer
