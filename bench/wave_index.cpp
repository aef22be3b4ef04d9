// CPU wave index benchmark: time to build the index of one (sequence, layer) and decode time of retro
// against full attention, on synthetic clustered keys. One JSON line per context length.
// Usage: wave_index [tokens...] (default 32768 131072); env-free, fixed seed.
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "attention/retro.h"
#include "retroinfer/attention.h"

namespace {
// 1-minute load average of the host (the dev machine is shared; figures taken under load are slower).
double load_average() {
  double l = -1.0;
  if (std::FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &l) != 1) l = -1.0;
    std::fclose(f);
  }
  return l;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

int main(int argc, char** argv) {
  using namespace retroinfer;
  std::vector<int64_t> lengths;
  for (int i = 1; i < argc; ++i) {
    const int64_t n = std::atoll(argv[i]);
    if (n < 256) {
      std::fprintf(stderr, "usage: wave_index [tokens...]  (each >= 256; default 32768 131072); got '%s'\n", argv[i]);
      return 2;
    }
    lengths.push_back(n);
  }
  if (lengths.empty()) lengths = {32768, 131072};
  {
    // Reference: f32 sgemm throughput at the global step's shape (512 key rows x 8192 centroids x 128),
    // the ceiling of the index build.
    constexpr int kM = 512, kN = 8192, kK = 128, kReps = 16;
    std::vector<float> a(static_cast<size_t>(kM) * kK, 0.5f), b(static_cast<size_t>(kN) * kK, 0.25f),
        c(static_cast<size_t>(kM) * kN);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kM, kN, kK, 1.0f, a.data(), kK, b.data(), kK, 0.0f,
                c.data(), kN);  // warm-up
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < kReps; ++r)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kM, kN, kK, 1.0f, a.data(), kK, b.data(), kK, 0.0f,
                  c.data(), kN);
    const double s = seconds_since(t0);
    std::printf("{\"bench\":\"sgemm\",\"m\":%d,\"n\":%d,\"k\":%d,\"gflops\":%.1f,\"load_avg\":%.2f}\n", kM, kN, kK,
                2.0 * kM * kN * kK * kReps / s / 1e9, load_average());
  }
  const AttentionShape shape{4, 1, 128};  // one KV head, GQA group 4, head_dim 128
  const int d = shape.head_dim;
  for (int64_t n : lengths) {
    KvCache kv(1, d, DType::kBF16);
    {
      std::mt19937 rng(1);
      std::normal_distribution<float> nd(0.0f, 1.0f);
      constexpr int kCenters = 256;
      std::vector<float> c(static_cast<size_t>(kCenters) * d);
      for (auto& x : c) x = 1.5f * nd(rng);
      std::vector<float> k(n * d), v(n * d);
      std::uniform_int_distribution<int> pick(0, kCenters - 1);
      for (int64_t t = 0; t < n; ++t) {
        const int j = pick(rng);
        for (int i = 0; i < d; ++i) {
          k[t * d + i] = c[static_cast<size_t>(j) * d + i] + 0.5f * nd(rng);
          v[t * d + i] = nd(rng);
        }
      }
      kv.append(k.data(), v.data(), n);
    }
    AttentionConfig cfg;  // paper defaults
    attention::RetroAttention retro(cfg, shape);
    auto t0 = std::chrono::steady_clock::now();
    retro.on_prefill(kv);
    const double build_s = seconds_since(t0);

    AttentionConfig full_cfg = cfg;
    full_cfg.kind = AttentionKind::kFull;
    auto full = make_attention(full_cfg, shape);
    std::vector<float> q(4 * d), out(4 * d);
    std::mt19937 rng(2);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    constexpr int kSteps = 20;
    double retro_s = 0.0, full_s = 0.0;
    AttentionStats st;
    for (int s = 0; s < kSteps; ++s) {
      for (auto& x : q) x = nd(rng);
      t0 = std::chrono::steady_clock::now();
      st = retro.decode(kv, q.data(), out.data());
      retro_s += seconds_since(t0);
      t0 = std::chrono::steady_clock::now();
      full->decode(kv, q.data(), out.data());
      full_s += seconds_since(t0);
    }
    std::printf(
        "{\"bench\":\"wave_index\",\"tokens\":%lld,\"head_dim\":%d,\"group\":4,\"kv_dtype\":\"bf16\","
        "\"clusters\":%d,\"build_s\":%.3f,\"retro_decode_ms\":%.3f,\"full_decode_ms\":%.3f,"
        "\"exact_tokens\":%lld,\"retrieved_clusters\":%lld,\"estimated_clusters\":%lld,\"load_avg\":%.2f}\n",
        static_cast<long long>(n), d, retro.wave_index().heads[0].num_clusters(), build_s,
        1e3 * retro_s / kSteps, 1e3 * full_s / kSteps, static_cast<long long>(st.exact_tokens),
        static_cast<long long>(st.retrieved_clusters), static_cast<long long>(st.estimated_clusters), load_average());
    std::fflush(stdout);
  }
  return 0;
}
