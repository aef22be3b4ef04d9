// CPU decode-attention kernels alone, one thread: exact attention of one GQA group over a KV head's tokens
// (accumulate_range, f32, bf16, int8 and fp8 KV; the 8-bit ones also with keys through a key calibration, as the
// model runner's 8-bit caches store them) and retro's cluster scoring (score_clusters), at the shapes of the
// Llama-3 (d = 128, group 4) and Qwen2.5-Coder-0.5B (d = 64, group 7) heads. CPU time of the calling thread
// (the host may be shared), the best of `reps` calls. One JSON line per case.
//   cpu_attention_bench [tokens=32768] [reps=15]
#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "attention/exact.h"
#include "index/wave_index.h"

using namespace retroinfer;

namespace {

double thread_cpu_s() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

template <typename F>
double best_ms(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = thread_cpu_s();
    f();
    best = std::min(best, thread_cpu_s() - t0);
  }
  return best * 1e3;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 32768;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 15;
  if (n < 64 || reps < 1) {
    std::fprintf(stderr, "usage: cpu_attention_bench [tokens >= 64] [reps >= 1]\n");
    return 2;
  }
  struct Shape {
    int d, group;
  };
  for (const Shape sh : {Shape{128, 4}, Shape{64, 7}}) {
    std::mt19937 rng(1);
    std::normal_distribution<float> nd;
    std::vector<float> k(static_cast<size_t>(n) * sh.d), v(k.size()), q(static_cast<size_t>(sh.group) * sh.d);
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    for (auto& x : q) x = nd(rng);
    KeyCalibration cal;  // any mean and factors: the cost does not depend on them
    for (int i = 0; i < sh.d; ++i) {
      cal.mean.push_back(0.01f * i);
      cal.factor.push_back(1.0f + 0.001f * i);
    }
    for (int variant = 0; variant < 6; ++variant) {
      const DType dt = std::array{DType::kF32, DType::kBF16, DType::kI8, DType::kF8E4M3, DType::kI8,
                                  DType::kF8E4M3}[variant];
      const bool calibrated = variant >= 4;
      KvCache kv(1, sh.d, dt, calibrated ? &cal : nullptr);
      kv.append(k.data(), v.data(), n);
      const double ms = best_ms(reps, [&] {
        attention::GroupState gs(sh.group, sh.d);
        attention::accumulate_range(kv, 0, q.data(), 0.1f, 0, n, gs);
      });
      std::printf("{\"bench\":\"cpu_exact_attention\",\"tokens\":%lld,\"head_dim\":%d,\"group\":%d,\"kv_dtype\":\"%s\","
                  "\"key_calibration\":%s,\"ms\":%.4f,\"tokens_per_us\":%.2f}\n",
                  static_cast<long long>(n), sh.d, sh.group, std::string(dtype_name(dt)).c_str(),
                  calibrated ? "true" : "false", ms, n / (ms * 1e3));
    }
    // Retro's scoring at 2 tokens per cluster (the default below head_dim 128) and at 16 (from 128 on).
    const int per_cluster = sh.d < 128 ? 2 : 16;
    index::HeadIndex hi;
    hi.head_dim = sh.d;
    const int clusters = static_cast<int>(n / per_cluster);
    hi.centroids.assign(k.begin(), k.begin() + static_cast<int64_t>(clusters) * sh.d);
    hi.sizes.assign(clusters, per_cluster);
    std::vector<float> logits(static_cast<size_t>(sh.group) * clusters), scores(clusters);
    const double ms = best_ms(reps, [&] {
      index::score_clusters(hi, q.data(), sh.group, 0.1f, logits.data(), scores.data());
    });
    std::printf("{\"bench\":\"cpu_score_clusters\",\"clusters\":%d,\"head_dim\":%d,\"group\":%d,\"ms\":%.4f}\n",
                clusters, sh.d, sh.group, ms);
    std::fflush(stdout);
  }
  return 0;
}
