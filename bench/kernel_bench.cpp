// Kernel benchmark of the CUDA backend on Llama-3-8B head shapes (32 query / 8 KV heads, head_dim 128):
// per layer and decode step, our dense decode ("full"), retro (score + select + estimate + sparse
// attention + merge, K/V resident on the GPU), quest at retro's exact-token budget, and the k-means
// build of one layer, against the causal prefill attention of that layer for one sequence (PrefillAttention
// over the whole context in chunks of --prefill-chunk tokens, as the runner does; timed once per length in
// the same run: "prefill" lines, and prefill_ms / kmeans_over_prefill on the "kmeans" lines). CUDA events
// around each call, warm-up first, the L2 evicted before every timed call (cold cache), median of the
// repetitions. One JSON object per line on stdout (or --out FILE).
//
//   kernel_bench [--lengths 32768,131072] [--batches 1,4,16] [--reps 30] [--out FILE]
//               [--max-index-work T]   skip retro/quest when batch * n^2 > T * 2^40 (k-means global step cost)
//               [--prefill-chunk 8192]
//               [--flush write|read]  L2 eviction before each timed call (see g_flush_read)
//               [--score-centroids int8|bf16]   the centroids retro scores the clusters against
//                              (AttentionConfig::int8_centroid_scoring; default int8); retro lines carry it
//                              as "score_centroids"
//               [--stages 1]   also stamp the score / selection phases (RETROINFER_SELECT_PHASES=1): one
//                              "retro_phases" line per case (medians over heads and the 10 stage decodes);
//                              --stages 2: the phases of a graph replay straight after another, without the
//                              L2 flush (warm caches; diagnostics: cold-cache cost = phases(1) - phases(2))
//               [--only full,quest,kmeans,retro]   time only these parts of each case (default: all); kmeans
//                              brings the prefill it is compared with
//               [--stack L]   also time L layers back to back in one CUDA graph, each with its own K / V (and
//                              for retro its own index), L2 evicted once before the graph: "full_stack" and
//                              "retro_stack" lines, "ms" = graph time / L (per layer inside a decode step,
//                              without the per-call launch and completion latency a single-layer call pays;
//                              each layer's data is larger than L2, so every layer starts cold)
//               [--kmeans-builds 3]   timed builds per k-means line (median)
//               [--kmeans-iters 9,2,1]   the k-means lines once per spherical segment-iteration count
//               [--kmeans-phases 1]   after the timed builds, one more build with the phase timing on
//                              (kmeans_phases.h set_kmeans_phase_timing): a "kmeans_phases" line (ms per
//                              sequence of each phase: mean_init, assign_segment, assign_global, group,
//                              update, finalize)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench_args.h"
#include "retroinfer/attention.h"
#include "retroinfer/error.h"

#if defined(RETROINFER_WITH_CUDA)
#include "kernels/kernels.h"
#include "index/cuda/kmeans_phases.h"
#include "retroinfer/cuda_backend.h"
#include "retroinfer/cuda_model.h"
#endif

namespace {


struct Stats {
  double median = 0, min = 0, p90 = 0;
};
[[maybe_unused]] Stats stats(std::vector<float> t) {  // unused without CUDA
  std::sort(t.begin(), t.end());
  Stats s;
  s.median = t[t.size() / 2];
  s.min = t.front();
  s.p90 = t[std::min(t.size() - 1, t.size() * 9 / 10)];
  return s;
}

}  // namespace

#if defined(RETROINFER_WITH_CUDA)
namespace {

using namespace retroinfer;

FILE* g_out = stdout;
long long g_prefill_chunk = 8192;
// --only full,quest,kmeans,retro: the parts of each case to time (default all). kmeans brings the prefill
// timing it is compared with; retro builds its index untimed when kmeans is left out.
std::string g_only;
bool part_on(const char* name) {
  if (g_only.empty()) return true;
  const std::string n = name;
  size_t at = 0;
  while (at <= g_only.size()) {
    const size_t e = std::min(g_only.find(',', at), g_only.size());
    if (g_only.compare(at, e - at, n) == 0) return true;
    at = e + 1;
  }
  return false;
}
int g_kmeans_builds = 3;                     // --kmeans-builds
bool g_kmeans_phases = false;                // --kmeans-phases 1
std::vector<int> g_kmeans_iters;             // --kmeans-iters 9,2,1: the k-means lines per segment-iteration count
int g_stack = 1;                             // --stack L
bool g_int8_scoring = true;                  // --score-centroids int8 (default) / bf16

// L2 eviction before each timed call. "write" (default, as runs 3-7): cuda::flush_l2, a memset of twice
// the L2 size, which leaves L2 full of dirty lines that the timed kernels' first reads must write back.
// "read": a dense decode over 128 MiB of K/V (2.5x the H200's 50 MiB L2) evicts by reading, leaving clean
// lines: the cold-cache time without the write-back of someone else's data (--flush read; attribution).
bool g_flush_read = false;
// K and V of every case live in two buffers allocated once for the whole run, sized for its largest case (an
// engine allocates its KV cache once). A fresh cudaMalloc per case, inside the address range that a larger
// case had just freed, measured the dense kernel 5-7% slower at batch 1 than the same allocation in a fresh
// process, whatever the K / V offset (measured on the H200); --kv-per-case restores that
// allocation per case (diagnostics).
cuda::DeviceBuffer g_slab_k, g_slab_v;
bool g_kv_per_case = false;
struct ReadFlush {
  static constexpr long long kTokens = 32768;  // 8 heads x 32768 x 128 x 2 B x (K + V) = 128 MiB
  const AttentionShape shape{32, 8, 128};
  cuda::DeviceBuffer k{size_t(8) * kTokens * 128 * 2}, v{size_t(8) * kTokens * 128 * 2};
  cuda::DeviceBuffer q{size_t(32) * 128 * 4}, out{size_t(32) * 128 * 4};
  cuda::DenseDecoder dense{shape, 1, kTokens};
  ReadFlush() {
    cuda::fill_random_bf16(k.as<uint16_t>(), k.bytes() / 2, 11, 1.0f);
    cuda::fill_random_bf16(v.as<uint16_t>(), v.bytes() / 2, 12, 1.0f);
    cuda::fill_random_f32(q.as<float>(), q.bytes() / 4, 13, 1.0f);
  }
  void run(cuda::Stream s) {
    dense.run(q.as<float>(), k.as<uint16_t>(), v.as<uint16_t>(), kTokens, kTokens, 0.0f, out.as<float>(), s);
  }
};
void flush(cuda::Stream s = nullptr) {
  if (!g_flush_read) {
    cuda::flush_l2(s);
    return;
  }
  static ReadFlush rf;
  rf.run(s);
}

constexpr int kQueries = 8;  // query buffers per case, rotated so that consecutive calls see different queries

void emit(const char* method, long long n, long long batch, const Stats& s, double bytes, const std::string& extra) {
  // Retro lines say which centroids the clusters were scored against (--score-centroids).
  const bool retro = std::strncmp(method, "retro", 5) == 0;
  const char* centroids = !retro ? "" : g_int8_scoring ? ",\"score_centroids\":\"int8\""
                                                       : ",\"score_centroids\":\"bf16\"";
  char line[2048];
  std::snprintf(line, sizeof line,
                "{\"bench\":\"kernel\",\"method\":\"%s\",\"n\":%lld,\"batch\":%lld,\"ms\":%.5f,\"ms_min\":%.5f,"
                "\"ms_p90\":%.5f,\"bytes\":%.0f,\"gbps\":%.1f%s%s%s}\n",
                method, n, batch, s.median, s.min, s.p90, bytes, bytes / (s.median * 1e-3) / 1e9, extra.c_str(),
                g_flush_read ? ",\"flush\":\"read\"" : "", centroids);
  std::fputs(line, g_out);
  std::fflush(g_out);
}

// Times fn(i) (i = 0 .. reps - 1) on stream s after `warm` untimed calls, evicting L2 before each; each time divided
// by `per` (the layers of a --stack graph).
template <typename F>
Stats time_calls(F&& fn, int warm, int reps, cuda::Stream s = nullptr, int per = 1) {
  cuda::EventTimer timer;
  for (int i = 0; i < warm; ++i) fn(i);
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    flush(s);
    timer.start(s);
    fn(i);
    timer.stop(s);
    t.push_back(timer.elapsed_ms() / float(per));
  }
  return stats(t);
}

// Causal prefill attention of one layer for one sequence of n tokens (the first num_heads_kv heads of
// k, v; kv_stride n), chunked like the runner; timed once per n (a 1M-token prefill takes tens of seconds:
// fewer repetitions there). Returns the median ms.
double prefill_ms(long long n, const AttentionShape& shape, const uint16_t* k, const uint16_t* v) {
  static std::map<long long, double> done;
  if (auto it = done.find(n); it != done.end()) return it->second;
  const long long chunk = std::min(g_prefill_chunk, n);
  const size_t q_elems = size_t(chunk) * shape.num_heads_q * shape.head_dim;
  cuda::DeviceBuffer q(q_elems * 4), out(q_elems * 4);
  cuda::fill_random_f32(q.as<float>(), q_elems, 4000 + n, 1.0f);
  cuda::PrefillAttention attn(shape);
  auto whole = [&](int) {
    for (long long pos0 = 0; pos0 < n; pos0 += chunk)
      attn.run(q.as<float>(), k, v, n, pos0, std::min(chunk, n - pos0), 0.0f, out.as<float>());
  };
  const bool long_ctx = n > 262144;
  const Stats s = time_calls(whole, long_ctx ? 0 : 1, long_ctx ? 1 : 3);
  const double flops = 4.0 * shape.head_dim * shape.num_heads_q * (double(n) * double(n + 1) / 2.0);
  char extra[160];
  std::snprintf(extra, sizeof extra, ",\"chunk\":%lld,\"tflops\":%.1f", chunk, flops / (s.median * 1e-3) / 1e12);
  emit("prefill", n, 1, s, double(n) * shape.num_heads_kv * shape.head_dim * 2 * 2, extra);
  done[n] = s.median;
  return s.median;
}

// --stack L: L layers back to back in one graph (layer 0 on the case's K / V, the others on their own random
// K / V), the L2 evicted once before each replay; per-layer time = graph time / L. Full and retro, each after its
// own warm-up replays.
void stack_case(long long n, long long batch, int reps, const uint16_t* k0, const uint16_t* v0, const float* q,
                float* out) {
  const AttentionShape shape{32, 8, 128};
  const size_t kv_elems = size_t(batch) * shape.num_heads_kv * size_t(n) * shape.head_dim;
  const int L = g_stack;
  std::vector<cuda::DeviceBuffer> ks, vs;
  std::vector<const uint16_t*> kl{k0}, vl{v0};
  for (int l = 1; l < L; ++l) {
    ks.emplace_back(kv_elems * 2);
    vs.emplace_back(kv_elems * 2);
    cuda::fill_random_bf16(ks.back().as<uint16_t>(), kv_elems, 5000 + 17 * l + n, 1.0f);
    cuda::fill_random_bf16(vs.back().as<uint16_t>(), kv_elems, 6000 + 17 * l + n, 1.0f);
    kl.push_back(ks.back().as<uint16_t>());
    vl.push_back(vs.back().as<uint16_t>());
  }
  cuda::StreamHandle stream;
  auto time_graph = [&](cuda::CapturedGraph& g) {
    return time_calls([&](int) { g.launch(stream.get()); }, 3, reps, stream.get(), L);
  };
  char extra[128];
  std::snprintf(extra, sizeof extra, ",\"layers\":%d", L);
  const double kv_bytes = double(kv_elems) * 2 * 2;
  if (part_on("full")) {
    std::vector<std::unique_ptr<cuda::DenseDecoder>> dense;
    for (int l = 0; l < L; ++l)
      dense.push_back(std::make_unique<cuda::DenseDecoder>(shape, static_cast<int>(batch), n));
    for (int l = 0; l < L; ++l) dense[l]->run(q, kl[l], vl[l], n, n, 0.0f, out, stream.get());  // workspaces
    cuda::synchronize(stream.get());
    cuda::CapturedGraph g(stream.get(), [&] {
      for (int l = 0; l < L; ++l) dense[l]->run(q, kl[l], vl[l], n, n, 0.0f, out, stream.get());
    });
    emit("full_stack", n, batch, time_graph(g), kv_bytes, extra);
  }
  if (part_on("retro")) {
    AttentionConfig cfg;
    cfg.int8_centroid_scoring = g_int8_scoring;
    std::vector<std::unique_ptr<cuda::RetroLayer>> retro;
    for (int l = 0; l < L; ++l) {
      retro.push_back(std::make_unique<cuda::RetroLayer>(shape, cfg, static_cast<int>(batch)));
      retro.back()->build(kl[l], vl[l], n, n);
      retro.back()->decode(q, out, stream.get());  // allocations before the capture
    }
    cuda::synchronize(stream.get());
    cuda::CapturedGraph g(stream.get(), [&] {
      for (int l = 0; l < L; ++l) retro[l]->decode(q, out, stream.get());
    });
    emit("retro_stack", n, batch, time_graph(g), retro[0]->decode_bytes_required(), extra);
  }
}

// The retro decode of one case: eager calls, the stage breakdown (and with --stages the phase stamps), and graph
// replays; every line tagged with `tag`. qp(i): the i-th query buffer (kQueries of them).
template <typename Q>
void time_retro(cuda::RetroLayer& retro, long long n, long long batch, int reps, Q&& qp, cuda::DeviceBuffer& out,
                const std::string& tag) {
  char extra[512];
  const Stats s = time_calls([&](int i) { retro.decode(qp(i), out.as<float>()); }, 3, reps);
  const double req = retro.decode_bytes_required(), moved = retro.decode_bytes_moved();
  std::snprintf(extra, sizeof extra,
                ",\"clusters\":%d,\"n_retrieval\":%d,\"n_estimation\":%d,\"list_capacity\":%lld,"
                "\"bytes_moved\":%.0f,\"moved_over_required\":%.3f",
                retro.num_clusters(), retro.n_retrieval(), retro.n_estimation(),
                static_cast<long long>(retro.token_list_capacity()), moved, moved / req);
  emit("retro", n, batch, s, req, extra + tag);
  // Stage breakdown (median over 10 decodes, each after an L2 eviction).
  std::vector<std::vector<float>> per;
  std::vector<std::string> names;
  for (int i = 0; i < 10; ++i) {
    flush();
    const auto st = retro.decode_stage_ms(qp(i), out.as<float>());
    if (per.empty()) {
      per.resize(st.size());
      for (const auto& x : st) names.push_back(x.first);
    }
    for (size_t j = 0; j < st.size() && j < per.size(); ++j) per[j].push_back(st[j].second);
  }
  // Stages, then (--stages: RETROINFER_SELECT_PHASES=1) the "phase.*" entries on a line of their own.
  std::string stage_json = ",\"stages_ms\":{", phase_json = ",\"phases_ms\":{";
  bool any_stage = false, any_phase = false;
  for (size_t j = 0; j < per.size(); ++j) {
    const bool ph = names[j].rfind("phase.", 0) == 0;
    bool& any = ph ? any_phase : any_stage;
    char b[128];
    std::snprintf(b, sizeof b, "%s\"%s\":%.5f", any ? "," : "", names[j].c_str() + (ph ? 6 : 0),
                  stats(per[j]).median);
    (ph ? phase_json : stage_json) += b;
    any = true;
  }
  stage_json += "}" + tag;
  phase_json += "}" + tag;
  emit("retro_stages", n, batch, s, req, stage_json);
  if (any_phase) emit("retro_phases", n, batch, s, req, phase_json);
  {
    // The same decode replayed from CUDA graphs (one per query buffer): no per-kernel launch gaps.
    cuda::StreamHandle stream;
    std::vector<std::unique_ptr<cuda::CapturedGraph>> graphs;
    for (int i = 0; i < kQueries; ++i)
      graphs.push_back(std::make_unique<cuda::CapturedGraph>(
          stream.get(), [&] { retro.decode(qp(i), out.as<float>(), stream.get()); }));
    const Stats sg = time_calls([&](int i) { graphs[(i + 3) % kQueries]->launch(stream.get()); }, 3, reps,
                                stream.get());
    emit("retro_graph", n, batch, sg, req, tag);
  }
}

void run_case(long long n, long long batch, int reps, double max_index_work) {
  const AttentionShape shape{32, 8, 128};
  const int H = static_cast<int>(batch) * shape.num_heads_kv, G = 4, D = shape.head_dim;
  const size_t kv_elems = size_t(H) * n * D;
  cuda::DeviceBuffer case_k(g_kv_per_case ? kv_elems * 2 : 0), case_v(g_kv_per_case ? kv_elems * 2 : 0);
  cuda::DeviceBuffer& kb = g_kv_per_case ? case_k : g_slab_k;
  cuda::DeviceBuffer& vb = g_kv_per_case ? case_v : g_slab_v;
  RETROINFER_CHECK(kb.bytes() >= kv_elems * 2 && vb.bytes() >= kv_elems * 2, "kernel_bench: K/V buffers of ",
                   kb.bytes(), " bytes for a case of ", kv_elems * 2);
  uint16_t* const kp = kb.as<uint16_t>();
  uint16_t* const vp = vb.as<uint16_t>();
  cuda::fill_random_bf16(kp, kv_elems, 1000 + n + batch, 1.0f);
  cuda::fill_random_bf16(vp, kv_elems, 2000 + n + batch, 1.0f);
  const size_t q_elems = size_t(H) * G * D;
  cuda::DeviceBuffer q(q_elems * 4 * kQueries), out(q_elems * 4);
  cuda::fill_random_f32(q.as<float>(), q_elems * kQueries, 3000 + n, 1.0f);
  auto qp = [&](int i) { return q.as<float>() + size_t(i % kQueries) * q_elems; };
  const double io_bytes = 2.0 * q_elems * 4;
  char extra[512];

  if (part_on("full")) {
    cuda::DenseDecoder dense(shape, static_cast<int>(batch), n);
    const Stats s = time_calls([&](int i) { dense.run(qp(i), kp, vp, n, n, 0.0f, out.as<float>()); },
                               3, reps);
    // Where K and V lie (diagnostics: batch 1 after a larger case is slower than in a fresh process).
    const auto ka = reinterpret_cast<uintptr_t>(kp), va = reinterpret_cast<uintptr_t>(vp);
    std::snprintf(extra, sizeof extra, ",\"splits\":%d,\"k_addr\":\"0x%llx\",\"v_minus_k\":%lld%s",
                  dense.num_splits(n), static_cast<unsigned long long>(ka),
                  static_cast<long long>(va) - static_cast<long long>(ka), g_kv_per_case ? ",\"kv\":\"per_case\"" : "");
    emit("full", n, batch, s, double(kv_elems) * 2 * 2 + io_bytes, extra);
  }
  const double work = double(batch) * double(n) * double(n) / double(1ull << 40);
  if (work > max_index_work) {
    std::fprintf(stderr, "skip retro/quest at n=%lld batch=%lld (index work %.2f > %.2f)\n", n, batch, work,
                 max_index_work);
    return;
  }
  const double pre_ms = part_on("kmeans") ? prefill_ms(n, shape, kp, vp) : 0.0;
  AttentionConfig cfg;  // paper defaults
  cfg.int8_centroid_scoring = g_int8_scoring;
  if (part_on("quest")) {
    cuda::QuestLayer quest(shape, cfg, static_cast<int>(batch));
    quest.build(kp, vp, n, n);
    const Stats s = time_calls([&](int i) { quest.decode(qp(i), out.as<float>()); }, 3, reps);
    std::snprintf(extra, sizeof extra, ",\"pages\":%d,\"selected_pages\":%d", quest.num_pages(), quest.selected_pages());
    emit("quest", n, batch, s, quest.decode_bytes_required(), extra);
  }
  {
    cuda::RetroLayer retro(shape, cfg, static_cast<int>(batch));
    retro.build(kp, vp, n, n);  // allocations happen here
    // --kmeans-iters: the "kmeans" line again per segment-iteration count, each on its own layer (this one
    // for the default count).
    std::vector<int> iters_list = g_kmeans_iters;
    if (iters_list.empty()) iters_list = {cfg.kmeans_segment_iters};
    if (!part_on("kmeans")) iters_list.clear();
    for (const int iters : iters_list) {
      std::unique_ptr<cuda::RetroLayer> own;
      if (iters != cfg.kmeans_segment_iters) {
        AttentionConfig c2 = cfg;
        c2.kmeans_segment_iters = iters;
        own = std::make_unique<cuda::RetroLayer>(shape, c2, static_cast<int>(batch));
        own->build(kp, vp, n, n);  // allocations
      }
      cuda::RetroLayer& layer = own ? *own : retro;
      const std::string tag = ",\"segment_iters\":" + std::to_string(iters);
      std::vector<float> bt, h_enq, h_wait, h_after;  // + the host split of each build (kmeans_phases.h)
      for (int i = 0; i < g_kmeans_builds; ++i) {
        cuda::synchronize();
        const auto t0 = std::chrono::steady_clock::now();
        layer.build(kp, vp, n, n);  // synchronous at its end
        bt.push_back(std::chrono::duration<float, std::milli>(std::chrono::steady_clock::now() - t0).count());
        const auto ht = cuda::detail::build_host_times_last();
        h_enq.push_back(float(ht.enqueue_ms));
        h_wait.push_back(float(ht.wait_ms));
        h_after.push_back(float(ht.after_ms));
      }
      const Stats sb = stats(bt);
      std::snprintf(extra, sizeof extra,
                    ",\"clusters\":%d,\"per_sequence_ms\":%.4f,\"prefill_ms\":%.4f,\"kmeans_over_prefill\":%.4f,"
                    "\"builds\":%d,\"host_enqueue_ms\":%.4f,\"host_wait_ms\":%.4f,\"host_after_ms\":%.4f%s",
                    layer.num_clusters(), sb.median / double(batch), pre_ms, sb.median / double(batch) / pre_ms,
                    g_kmeans_builds, stats(h_enq).median, stats(h_wait).median, stats(h_after).median, tag.c_str());
      emit("kmeans", n, batch, sb, double(kv_elems) * 2 * 2, extra);
      if (g_kmeans_phases) {
        // One more build with an event after every phase (kmeans_phases.h): ms per sequence of each phase.
        cuda::detail::set_kmeans_phase_timing(true);
        cuda::detail::kmeans_phase_reset();
        cuda::synchronize();
        layer.build(kp, vp, n, n);
        cuda::detail::set_kmeans_phase_timing(false);
        const auto tot = cuda::detail::kmeans_phase_totals();
        std::string ph = ",\"phases_ms\":{";
        double sum = 0;
        for (int i = 0; i < cuda::detail::kKmPhases; ++i) {
          char b[96];
          std::snprintf(b, sizeof b, "%s\"%s\":%.4f", i ? "," : "", cuda::detail::kmeans_phase_name(i),
                        tot.ms[i] / double(batch));
          ph += b;
          sum += tot.ms[i] / double(batch);
        }
        char b[96];
        std::snprintf(b, sizeof b, "},\"phases_sum_ms\":%.4f,\"runs\":%lld", sum, static_cast<long long>(tot.runs));
        emit("kmeans_phases", n, batch, sb, double(kv_elems) * 2 * 2, ph + b + tag);
      }
    }  // iters
    if (part_on("retro")) {
      time_retro(retro, n, batch, reps, qp, out, "");
    }  // part_on("retro")
  }
  if (g_stack > 1) stack_case(n, batch, reps, kp, vp, qp(0), out.as<float>());
}

}  // namespace
#endif

// The command line; false (after a message on stderr) on a bad option.
struct BenchOptions {
  std::vector<long long> lengths{32768, 131072, 524288, 1048576}, batches{1, 4, 16};
  int reps = 30;
  double max_index_work = 1.0;  // batch * n^2 <= 2^40: 1M x 1, 512K x 4, 128K x 16 ...
  const char* out_path = nullptr;
  long long prefill_chunk = 8192;  // the runner's prefill block for the "prefill" timing
  bool flush_read = false;         // --flush read (g_flush_read in a CUDA build)
  bool kv_per_case = false;        // --kv-per-case (g_kv_per_case)
  int stack_layers = 1;            // --stack L (g_stack)
  bool scoring_int8 = true;        // --score-centroids (g_int8_scoring)
  std::string only_arg;            // --only kmeans
  int kmeans_builds = 3;
  std::vector<int> kmeans_iters;  // --kmeans-iters
  bool kmeans_phases = false;
};

bool parse_options(int argc, char** argv, BenchOptions& o) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "kernel_bench: %s needs a value\n", argv[i]);
      return false;
    }
    if (a == "--lengths") o.lengths = retroinfer::bench::parse_list<long long>(argv[++i]);
    else if (a == "--batches") o.batches = retroinfer::bench::parse_list<long long>(argv[++i]);
    else if (a == "--reps") o.reps = std::atoi(argv[++i]);
    else if (a == "--max-index-work") o.max_index_work = std::atof(argv[++i]);
    else if (a == "--out") o.out_path = argv[++i];
    else if (a == "--prefill-chunk") o.prefill_chunk = std::max(1LL, std::atoll(argv[++i]));
    else if (a == "--flush") o.flush_read = std::string(argv[++i]) == "read";
    else if (a == "--kv-per-case") o.kv_per_case = true;
    else if (a == "--only") o.only_arg = argv[++i];
    else if (a == "--stack") {
      const char* v = argv[++i];  // present: checked above
      char* endp = nullptr;
      const long l = std::strtol(v, &endp, 10);
      if (endp == v || *endp != '\0' || l < 1 || l > 64) {
        std::fprintf(stderr, "kernel_bench: --stack takes 1..64 layers, not '%s'\n", v);
        return false;
      }
      o.stack_layers = static_cast<int>(l);
    }
    else if (a == "--kmeans-builds") o.kmeans_builds = std::max(1, std::atoi(argv[++i]));
    else if (a == "--kmeans-phases") o.kmeans_phases = std::atoi(argv[++i]) != 0;
    else if (a == "--kmeans-iters") {  // a comma list of counts 0..999
      const std::string list = argv[++i];
      o.kmeans_iters = retroinfer::bench::parse_list<int>(list.c_str());
      if (list.find_first_not_of("0123456789,") != std::string::npos || o.kmeans_iters.empty() ||
          std::any_of(o.kmeans_iters.begin(), o.kmeans_iters.end(), [](int v) { return v > 999; })) {
        std::fprintf(stderr, "kernel_bench: --kmeans-iters takes non-negative integers (0..999); not '%s'\n", list.c_str());
        return false;
      }
    }
    else if (a == "--score-centroids") {
      const std::string c = argv[++i];
      if (c != "int8" && c != "bf16") {
        std::fprintf(stderr, "kernel_bench: --score-centroids takes int8 or bf16, not %s\n", c.c_str());
        return false;
      }
      o.scoring_int8 = c == "int8";
    }
    else if (a == "--stages") {  // phase stamps inside the score / selection kernels (retro_phases lines)
      if (const int st = std::atoi(argv[++i]); st != 0) setenv("RETROINFER_SELECT_PHASES", st == 2 ? "2" : "1", 1);
    }
    else {
      std::fprintf(stderr, "kernel_bench: unknown option %s\n", argv[i]);
      return false;
    }
  }
  return true;
}

int main(int argc, char** argv) {
  BenchOptions o;
  if (!parse_options(argc, argv, o)) return 2;
  auto& lengths = o.lengths;
  auto& batches = o.batches;
  auto& reps = o.reps;
  auto& max_index_work = o.max_index_work;
  auto& out_path = o.out_path;
  auto& prefill_chunk = o.prefill_chunk;
  auto& flush_read = o.flush_read;
  auto& kv_per_case = o.kv_per_case;
  auto& stack_layers = o.stack_layers;
  auto& scoring_int8 = o.scoring_int8;
  auto& only_arg = o.only_arg;
  auto& kmeans_builds = o.kmeans_builds;
  auto& kmeans_iters = o.kmeans_iters;
  auto& kmeans_phases = o.kmeans_phases;
#if defined(RETROINFER_WITH_CUDA)
  g_flush_read = flush_read;
  g_int8_scoring = scoring_int8;
  // The phase stamps' replay inside RetroLayer::decode_stage_ms flushes L2 the same way.
  if (flush_read) setenv("RETROINFER_PHASE_FLUSH", "read", 1);
  g_kv_per_case = kv_per_case;
  g_stack = stack_layers;
  if (!retroinfer::cuda::device_available()) {
    std::fprintf(stderr, "kernel_bench: %s\n", retroinfer::cuda::device_description().c_str());
    return 1;
  }
  if (out_path != nullptr) {
    g_out = std::fopen(out_path, "a");
    if (g_out == nullptr) {
      std::fprintf(stderr, "kernel_bench: cannot open %s\n", out_path);
      return 1;
    }
  }
  g_prefill_chunk = prefill_chunk;
  g_only = only_arg;
  {
    size_t at = 0;
    while (!only_arg.empty() && at <= only_arg.size()) {
      const size_t e = std::min(only_arg.find(',', at), only_arg.size());
      const std::string w = only_arg.substr(at, e - at);
      if (w != "full" && w != "quest" && w != "kmeans" && w != "retro") {
        std::fprintf(stderr, "kernel_bench: --only takes a list of full, quest, kmeans, retro; not '%s'\n", w.c_str());
        return 2;
      }
      at = e + 1;
    }
  }
  g_kmeans_builds = kmeans_builds;
  g_kmeans_iters = kmeans_iters;
  g_kmeans_phases = kmeans_phases;
  std::fprintf(stderr, "kernel_bench on %s\n", retroinfer::cuda::device_description().c_str());
  // K + V of one layer must fit with room for the index workspace (~0.7x K+V at most).
  auto kv_gib = [](long long n, long long b) { return double(b) * 8 * n * 128 * 2 * 2 / double(1ull << 30); };
  try {
    if (!g_kv_per_case) {  // one K and one V buffer for the largest case that runs (see g_slab_k)
      size_t most = 0;
      for (long long n : lengths)
        for (long long b : batches)
          if (kv_gib(n, b) <= 70.0) most = std::max(most, size_t(b) * 8 * size_t(n) * 128 * 2);
      g_slab_k = cuda::DeviceBuffer(most);
      g_slab_v = cuda::DeviceBuffer(most);
    }
    for (long long n : lengths)
      for (long long b : batches) {
        if (kv_gib(n, b) > 70.0) {
          std::fprintf(stderr, "skip n=%lld batch=%lld: %.0f GiB of K/V\n", n, b, kv_gib(n, b));
          continue;
        }
        run_case(n, b, reps, max_index_work);
      }
  } catch (const retroinfer::Error& e) {
    std::fprintf(stderr, "kernel_bench: %s\n", e.what());
    return 1;
  }
  g_slab_k = cuda::DeviceBuffer();  // freed while the CUDA runtime is up (not by a static destructor)
  g_slab_v = cuda::DeviceBuffer();
  return 0;
#else
  (void)reps;
  (void)max_index_work;
  (void)out_path;
  (void)prefill_chunk;
  (void)flush_read;
  (void)kv_per_case;
  (void)stack_layers;
  (void)only_arg;
  (void)kmeans_builds;
  (void)kmeans_phases;
  (void)kmeans_iters;
  std::fprintf(stderr, "kernel_bench: built without the CUDA backend (configure with -DRETROINFER_CUDA=ON)\n");
  return 0;
#endif
}
