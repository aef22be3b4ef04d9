// Wave-buffer benchmark on Llama-3-8B head shapes (32 query / 8 KV heads, d = 128): one layer's decode
// step with the KV store in pinned host memory (or on the GPU), against the GPU-resident retro step
// (RetroLayer on the same index). JSON lines on stdout (or --out FILE), a table on stderr.
//
//   wave_buffer_bench [--length 131072] [--batches 1,4,8,16] [--steps 40] [--drifts 0.05,0.2,0.4,0.7,1]
//                     [--tiers host] [--store bf16|int8|int4] [--out FILE]
//
// Data: K, V ~ bf16 of N(0, 1) (fill_random_bf16); q_0 ~ N(0, 1) per element.
// Query trace with temporal locality: q_{t+1} = (q_t + s * xi_t) / sqrt(1 + s^2), xi_t ~ N(0, 1) i.i.d.
// per element (std::mt19937_64, seed 1), s = the drift: small s keeps the selected clusters largely the
// same from step to step (high hit ratio), large s changes them (low).
// Per (batch, tier):
//   cold   admissions off, empty cache: every retrieval cluster is a miss (the uncached path); gather
//          GB/s = bytes gathered from the store / gather time;
//   drift  admissions on, for each drift: `steps` steps (the first 10 are warm-up), graph replays timed
//          with CUDA events; after each step the host waits for the manager (wait_manager), standing in
//          for the other layers of the model that run between two steps of one layer; then stage times
//          from `stage_steps` steps of decode_stage_ms (events between the stages, no graph, estimation
//          inline); then `steps` replays back to back with no host wait at all ("free-running": the
//          manager keeps up or its late updates are dropped), timed as a whole.
// --store int8 | int4: the store in int8 with per-row scales or in int4 with a scale per 32 values
// (WaveBufferConfig::store_dtype), widened by the gather. PCIe bytes per step = missed rows * the store's bytes
// per token and head (bf16 2 (K, V) * d * 2; int8 2 * d + 8; int4 d + d / 8); achieved GB/s = those bytes / the gather
// time (the kernel that reads them) and against the 51 GB/s measured for zero-copy reads (GPU.md).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "retroinfer/attention.h"
#include "retroinfer/error.h"

#if defined(RETROINFER_WITH_CUDA)
#include "bench_args.h"
#include "retroinfer/cuda_backend.h"
#include "retroinfer/wave_buffer.h"

namespace {


double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// One batch on one tier: the cold phase, then one drift phase per drift (file comment). k, v: the batch's
// K/V; dq / dout / dref: its query, output and GPU-resident reference output buffers.
struct BatchCase {
  retroinfer::AttentionShape shape;
  retroinfer::AttentionConfig cfg;
  int B = 0;
  int64_t length = 0;
  size_t q_elems = 0;
  int steps = 0, warmup = 0, stage_steps = 0;
  std::vector<double> drifts;
  double kZeroCopyPeak = 0.0;
  retroinfer::StoreDtype store_dtype = retroinfer::StoreDtype::kBf16;
  FILE* out = nullptr;
};

void bench_tier(const BatchCase& bc, retroinfer::KvTier tier, retroinfer::cuda::DeviceBuffer& k,
                retroinfer::cuda::DeviceBuffer& v, retroinfer::cuda::DeviceBuffer& dq,
                retroinfer::cuda::DeviceBuffer& dout, retroinfer::cuda::DeviceBuffer& dref) {
  using namespace retroinfer;
  const AttentionShape& shape = bc.shape;
  const AttentionConfig& cfg = bc.cfg;
  const int B = bc.B;
  const int64_t length = bc.length;
  const size_t q_elems = bc.q_elems;
  const int steps = bc.steps, warmup = bc.warmup, stage_steps = bc.stage_steps;
  const std::vector<double>& drifts = bc.drifts;
  const double kZeroCopyPeak = bc.kZeroCopyPeak;
  FILE* out = bc.out;
  WaveBufferConfig w;
  w.tier = tier;
  w.store_dtype = bc.store_dtype;
  cuda::WaveBufferLayer layer(shape, cfg, w, B);
  layer.build(k.as<uint16_t>(), v.as<uint16_t>(), length, length);
  cuda::StreamHandle stream_handle;
  cuda::Stream s = stream_handle.get();
  std::mt19937_64 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> q(q_elems);
  for (auto& x : q) x = nd(rng);
  auto step_q = [&](double drift) {
    const float a = 1.0f / std::sqrt(1.0f + float(drift * drift));
    for (auto& x : q) x = (x + float(drift) * nd(rng)) * a;
    dq.upload(q.data(), q.size() * 4);
  };
  dq.upload(q.data(), q.size() * 4);
  layer.index().decode(dq.as<float>(), dref.as<float>());  // warm-up: one-time kernel attributes
  cuda::synchronize();
  layer.capture_graph(dq.as<float>(), dout.as<float>(), s);
  cuda::EventTimer timer, ref_timer;
  const double row_bytes = double(store_token_bytes(bc.store_dtype, shape.head_dim));  // K + V of one token
  auto run_phase = [&](const char* name, double drift, bool admit) {
    layer.set_admission(admit);
    std::vector<double> step_ms, ref_ms, hit, pcie;
    for (int t = 0; t < steps; ++t) {
      step_q(drift);
      timer.start(s);
      layer.replay_graph(s);
      timer.stop(s);
      const float ms = timer.elapsed_ms();
      const auto c = layer.last_step_counts();
      ref_timer.start(nullptr);
      layer.index().decode(dq.as<float>(), dref.as<float>());
      ref_timer.stop(nullptr);
      const float rms = ref_timer.elapsed_ms();
      layer.wait_manager();
      if (t < warmup) continue;
      step_ms.push_back(ms);
      ref_ms.push_back(rms);
      const double all = double(c.hit_clusters + c.miss_clusters);
      hit.push_back(all > 0 ? double(c.hit_clusters) / all : 0.0);
      pcie.push_back(double(c.miss_rows) * row_bytes);
    }
    // Stage split (default stream, events between stages).
    std::vector<std::vector<double>> st(5);
    std::vector<std::string> names(5);
    std::vector<double> gather_bytes;
    for (int t = 0; t < stage_steps; ++t) {
      step_q(drift);
      const auto sm = layer.decode_stage_ms(dq.as<float>(), dout.as<float>());
      const auto c = layer.last_step_counts();
      layer.wait_manager();
      for (size_t i = 0; i < sm.size() && i < 5; ++i) {
        names[i] = sm[i].first;
        st[i].push_back(sm[i].second);
      }
      gather_bytes.push_back(double(c.miss_rows) * row_bytes / std::max(1e-9, double(sm[3].second) * 1e-3) / 1e9);
    }
    // GPU-resident step by stage (RetroLayer::decode_stage_ms), for attribution.
    std::vector<std::vector<double>> rst(5);
    for (int t = 0; t < 3; ++t) {
      const auto sm = layer.index().decode_stage_ms(dq.as<float>(), dref.as<float>());
      for (size_t i = 0; i < sm.size() && i < 5; ++i) rst[i].push_back(sm[i].second);
    }
    // Free-running: `steps` graph replays back to back, no host wait between them; the manager
    // keeps up or not (late updates are dropped). Hit ratio from the manager's counters.
    const auto before = layer.stats();
    const double free_drift = drift;
    std::vector<std::vector<float>> qs(static_cast<size_t>(steps));
    for (auto& qq : qs) {
      step_q(free_drift);
      qq = q;
    }
    cuda::DeviceBuffer qtrace(size_t(steps) * q_elems * 4);
    for (int t = 0; t < steps; ++t) qtrace.upload(qs[size_t(t)].data(), q_elems * 4, size_t(t) * q_elems * 4);
    cuda::synchronize();
    timer.start(s);
    for (int t = 0; t < steps; ++t) {
      cuda::copy_device_async(dq.data(), static_cast<const char*>(qtrace.data()) + size_t(t) * q_elems * 4, q_elems * 4, s);
      layer.replay_graph(s);
    }
    timer.stop(s);
    const double free_ms = timer.elapsed_ms() / steps;
    layer.wait_manager();
    const auto after = layer.stats();
    const double fh = double(after.hits - before.hits), fm = double(after.misses - before.misses);
    const double free_hit = fh + fm > 0 ? fh / (fh + fm) : 0.0;
    const double step = median(step_ms), ref = median(ref_ms), pcie_b = median(pcie);
    const double gather_ms = median(st[3]);
    const double gbps = median(gather_bytes);
    const auto ws = layer.stats();
    std::fprintf(out,
                 "{\"bench\":\"wave_buffer\",\"phase\":\"%s\",\"n\":%lld,\"batch\":%d,\"tier\":\"%s\",\"store\":\"%s\",\"drift\":%.3f,"
                 "\"cache_pages_per_head\":%lld,\"exec_rows_per_head\":%lld,\"steps\":%zu,\"hit_ratio\":%.4f,"
                 "\"step_ms\":%.4f,\"gpu_resident_ms\":%.4f,\"ratio\":%.3f,\"apply_ms\":%.4f,\"select_ms\":%.4f,"
                 "\"lookup_ms\":%.4f,\"gather_ms\":%.4f,\"attention_ms\":%.4f,\"pcie_bytes_per_step\":%.0f,"
                 "\"pcie_gbps_in_gather\":%.2f,\"pcie_gbps_over_step\":%.2f,\"zero_copy_peak_gbps\":%.1f,"
                 "\"updates\":%llu,\"updates_dropped\":%llu,\"evicted\":%llu,\"steps_lost\":%llu,"
                 "\"free_step_ms\":%.4f,\"free_hit_ratio\":%.4f,\"free_updates_dropped\":%llu,"
                 "\"gpu_resident_score_ms\":%.4f,\"gpu_resident_select_ms\":%.4f,\"gpu_resident_estimate_ms\":%.4f,"
                 "\"gpu_resident_attention_ms\":%.4f,\"gpu_resident_combine_ms\":%.4f}\n",
                 name, (long long)length, B, tier == KvTier::kHost ? "host" : "gpu",
                 std::string(store_dtype_name(bc.store_dtype)).c_str(), drift,
                 (long long)layer.cache_pages_per_head(), (long long)layer.exec_capacity(), step_ms.size(),
                 median(hit), step, ref, ref > 0 ? step / ref : 0.0, median(st[0]), median(st[1]), median(st[2]),
                 gather_ms, median(st[4]), pcie_b, gbps, step > 0 ? pcie_b / (step * 1e-3) / 1e9 : 0.0,
                 kZeroCopyPeak, (unsigned long long)ws.updates, (unsigned long long)ws.updates_dropped,
                 (unsigned long long)ws.evicted, (unsigned long long)ws.steps_lost, free_ms, free_hit,
                 (unsigned long long)(after.updates_dropped - before.updates_dropped), median(rst[0]),
                 median(rst[1]), median(rst[2]), median(rst[3]), median(rst[4]));
    std::fflush(out);
    std::fprintf(stderr, "| %d | %s | %s %.3f | %.3f | %.4f | %.4f | %.2f | %.4f | %.4f | %.4f | %.4f | %.4f | %.2f | %.1f | %.4f (%.3f) |\n", B,
                 tier == KvTier::kHost ? "host" : "gpu", name, drift, median(hit), step, ref,
                 ref > 0 ? step / ref : 0.0, median(st[1]), median(st[2]), gather_ms, median(st[4]), median(st[0]),
                 pcie_b / 1e6, gbps, free_ms, free_hit);
  };
  run_phase("cold", 0.05, false);
  for (double d : drifts) run_phase("drift", d, true);
}

}  // namespace
#endif

int main(int argc, char** argv) {
#if !defined(RETROINFER_WITH_CUDA)
  (void)argc;
  (void)argv;
  std::fprintf(stderr, "wave_buffer_bench: built without CUDA (RETROINFER_CUDA=OFF)\n");
  return 0;
#else
  using namespace retroinfer;
  int64_t length = 131072;
  std::vector<double> batches{1, 4, 8, 16}, drifts{0.05, 0.2, 0.4, 0.7, 1.0};
  std::vector<KvTier> tiers{KvTier::kHost};
  StoreDtype store_dtype = StoreDtype::kBf16;
  int steps = 40, stage_steps = 8;
  const int warmup = 10;
  FILE* out = stdout;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "missing value after %s\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--length") length = std::atoll(next());
    else if (a == "--batches") batches = retroinfer::bench::parse_list<double>(next());
    else if (a == "--drifts") drifts = retroinfer::bench::parse_list<double>(next());
    else if (a == "--steps") steps = std::atoi(next());
    else if (a == "--tiers") {
      tiers.clear();
      const std::string t = next();
      if (t.find("host") != std::string::npos) tiers.push_back(KvTier::kHost);
      if (t.find("gpu") != std::string::npos) tiers.push_back(KvTier::kGpu);
    } else if (a == "--store") {
      try {
        store_dtype = parse_store_dtype(next());
      } catch (const Error& e) {  // names the accepted types
        std::fprintf(stderr, "--store: %s\n", e.what());
        return 2;
      }
    } else if (a == "--out") {
      out = std::fopen(next(), "w");
      if (out == nullptr) {
        std::fprintf(stderr, "cannot open output\n");
        return 2;
      }
    } else {
      std::fprintf(stderr, "usage: wave_buffer_bench [--length N] [--batches 1,4,8,16] [--steps S] [--drifts d,..] [--tiers host,gpu] [--store bf16|int8|int4] [--out F]\n");
      return 2;
    }
  }
  if (!cuda::device_available()) {
    std::fprintf(stderr, "wave_buffer_bench: no GPU (%s)\n", cuda::device_description().c_str());
    return 0;
  }
  try {
    const AttentionShape shape{32, 8, 128};
    const AttentionConfig cfg;  // paper defaults: 1.8% retrieval, 23.2% estimation, clusters of 16
    const double kZeroCopyPeak = 51.0;  // GB/s, GPU.md
    std::fprintf(stderr, "%s\n", cuda::device_description().c_str());
    std::fprintf(stderr, "| batch | tier | phase drift | hit ratio | step ms | GPU-resident ms | ratio | select | lookup | gather | attention | apply | PCIe MB/step | gather GB/s | free-running ms (hit) |\n");
    std::fprintf(stderr, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (double bd : batches) {
      const int B = static_cast<int>(bd);
      const int H = B * shape.num_heads_kv;
      const size_t kv_elems = size_t(H) * length * shape.head_dim;
      cuda::DeviceBuffer k(kv_elems * 2), v(kv_elems * 2);
      cuda::fill_random_bf16(k.as<uint16_t>(), kv_elems, 11 + B, 1.0f);
      cuda::fill_random_bf16(v.as<uint16_t>(), kv_elems, 23 + B, 1.0f);
      const size_t q_elems = size_t(B) * shape.num_heads_q * shape.head_dim;
      cuda::DeviceBuffer dq(q_elems * 4), dout(q_elems * 4), dref(q_elems * 4);
      cuda::synchronize();
      const BatchCase bc{shape, cfg, B, length, q_elems, steps, warmup, stage_steps, drifts, kZeroCopyPeak, store_dtype, out};
      for (KvTier tier : tiers) bench_tier(bc, tier, k, v, dq, dout, dref);
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "wave_buffer_bench: %s\n", e.what());
    return 1;
  }
  if (out != stdout) std::fclose(out);
  return 0;
#endif
}
