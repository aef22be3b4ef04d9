// Helpers of the RetroLayer decode tests (test_cuda_zone_decode.cpp, the selection and scoring tests,
// test_cuda_retro.cpp): the production selection rule (index::select_zones) in vector form, one layer built for
// a case, one decode of it with its per-head debug state, the graph-replay and stage-timing checks, the f64
// reference of the zones a decode selected, and the rounding bounds between two decodes that group the same
// terms differently.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gpu_test_util.h"
#include "index/wave_index.h"

namespace retroinfer::gputest {

// The production zone rule (index::select_zones: by score desc, id asc, -inf never picked) on scores sc:
// the first k1 ids in r, the next k2 in e (both ascending).
inline void cpu_select(const std::vector<float>& sc, int k1, int k2, std::vector<int32_t>& r,
                       std::vector<int32_t>& e) {
  index::ZoneSelection sel;
  index::select_zones(sc.data(), int(sc.size()), ZoneCounts{k1, k2}, sel);
  r = std::move(sel.retrieval);
  e = std::move(sel.estimation);
}

// A decode case: num_seqs sequences of hkv KV heads (H = num_seqs * hkv flat heads), GQA group,
// head_dim d, n tokens per head.
struct PathCase {
  int num_seqs, hkv, group, d;
  int64_t n;
  bool estimation, outliers;  // AttentionConfig::estimation; RetroLayer::set_outlier_zone
  bool host_kv;  // clustered K/V from make_kv (small cases, with host copies for f64 references); else device
                 // random (bench-like shapes)
};

inline std::string describe(const PathCase& pc, uint64_t seed) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "seqs=%d hkv=%d G=%d d=%d n=%lld est=%d outliers=%d seed=%llu", pc.num_seqs, pc.hkv,
                pc.group, pc.d, (long long)pc.n, int(pc.estimation), int(pc.outliers), (unsigned long long)seed);
  return buf;
}

// The inputs and the built layer of one case. kv / q hold the host copies when host_kv (else empty).
struct PathLayer {
  int H = 0;
  size_t q_elems = 0;           // H * G * D
  KvData kv;                    // host K/V (host_kv only)
  std::vector<float> q;         // [H, G, D] f32 (host_kv only)
  cuda::DeviceBuffer dk, dv;    // [H, n, D] bf16
  cuda::DeviceBuffer dq;        // [H, G, D] f32
  std::unique_ptr<cuda::RetroLayer> layer;  // built over dk / dv (keeps their pointers)
};

// K/V and query (clustered host data with a short steady zone and 1024-token segments when host_kv; device
// random N(0,1)-scale data with the default config otherwise), and the layer built over them.
inline PathLayer make_path_layer(const PathCase& pc, uint64_t seed) {
  PathLayer t;
  const int G = pc.group, d = pc.d;
  t.H = pc.num_seqs * pc.hkv;
  const size_t kv_elems = size_t(t.H) * pc.n * d;
  t.q_elems = size_t(t.H) * G * d;
  if (pc.host_kv) {
    t.kv = make_kv(t.H, pc.n, pc.n, d, seed);
    t.q = make_q(t.kv, G, seed + 1);
    t.dk = upload(t.kv.k);
    t.dv = upload(t.kv.v);
    t.dq = upload(t.q);
  } else {
    t.dk = cuda::DeviceBuffer(kv_elems * 2);
    t.dv = cuda::DeviceBuffer(kv_elems * 2);
    t.dq = cuda::DeviceBuffer(t.q_elems * 4);
    cuda::fill_random_bf16(t.dk.as<uint16_t>(), kv_elems, seed, 1.0f);
    cuda::fill_random_bf16(t.dv.as<uint16_t>(), kv_elems, seed + 1, 1.0f);
    cuda::fill_random_f32(t.dq.as<float>(), t.q_elems, seed + 2, 1.0f);
  }
  AttentionConfig cfg;
  cfg.estimation = pc.estimation;
  if (pc.host_kv) {
    cfg.sink_tokens = 4;
    cfg.window_tokens = 16;
    cfg.segment_tokens = 1024;
  }
  t.layer = std::make_unique<cuda::RetroLayer>(AttentionShape{pc.hkv * G, pc.hkv, d}, cfg, pc.num_seqs);
  if (pc.outliers) t.layer->set_outlier_zone(true);
  t.layer->build(t.dk.as<uint16_t>(), t.dv.as<uint16_t>(), pc.n, pc.n);
  return t;
}

struct PathResult {
  std::vector<float> out;                     // [H, G, D]
  std::vector<cuda::RetroDebugState> heads;  // per flat head
};

// One eager decode into a poisoned output.
inline PathResult decode_once(cuda::RetroLayer& layer, const float* dq, size_t q_elems, int H) {
  auto dout = poisoned(q_elems);
  layer.decode(dq, dout.as<float>());
  cuda::synchronize();
  PathResult r;
  r.out = download_f32(dout, q_elems);
  for (int h = 0; h < H; ++h) r.heads.push_back(layer.debug_state(h));
  return r;
}
inline PathResult decode_once(PathLayer& t) { return decode_once(*t.layer, t.dq.as<float>(), t.q_elems, t.H); }

// Two decodes of one layer that must agree bit for bit: per flat head the logits, scores, ids and token list,
// then every output element.
inline void expect_identical(const PathResult& x, const PathResult& ref, const char* what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(x.heads.size(), ref.heads.size());
  for (size_t h = 0; h < ref.heads.size(); ++h) {
    SCOPED_TRACE(testing::Message() << "flat head " << h);
    EXPECT_EQ(x.heads[h].logits, ref.heads[h].logits);
    EXPECT_EQ(x.heads[h].scores, ref.heads[h].scores);
    EXPECT_EQ(x.heads[h].retrieval_ids, ref.heads[h].retrieval_ids);
    EXPECT_EQ(x.heads[h].estimation_ids, ref.heads[h].estimation_ids);
    EXPECT_EQ(x.heads[h].token_list, ref.heads[h].token_list);
  }
  ASSERT_EQ(x.out.size(), ref.out.size());
  for (size_t i = 0; i < ref.out.size(); ++i) ASSERT_EQ(x.out[i], ref.out[i]) << what << ": output element " << i;
}

// Two graph replays of the decode into a poisoned output, each bit-identical to `eager` (the grid selection's
// workspace and the grid barriers reset themselves), then one more eager decode, returned (the caller compares
// it with what it needs; its output is checked here).
inline PathResult expect_graph_replays(PathLayer& t, const std::vector<float>& eager) {
  cuda::StreamHandle stream;
  auto dg = poisoned(t.q_elems);
  cuda::CapturedGraph graph(stream.get(), [&] { t.layer->decode(t.dq.as<float>(), dg.as<float>(), stream.get()); });
  for (int rep = 0; rep < 2; ++rep) {
    dg.fill_bytes(0xff);
    cuda::synchronize();  // the memset runs on the legacy stream, the graph on a non-blocking one
    graph.launch(stream.get());
    cuda::synchronize(stream.get());
    const auto g = download_f32(dg, t.q_elems);
    for (size_t i = 0; i < g.size(); ++i) {
      EXPECT_EQ(g[i], eager[i]) << "graph replay " << rep << " element " << i;
      if (g[i] != eager[i]) break;
    }
  }
  PathResult e = decode_once(t);
  for (size_t i = 0; i < e.out.size(); ++i) {
    EXPECT_EQ(e.out[i], eager[i]) << "eager after replays, element " << i;
    if (e.out[i] != eager[i]) break;
  }
  return e;
}

// The stage-timing decode (events between the stages, no programmatic launches) with phase stamps
// (RETROINFER_SELECT_PHASES=1) into a poisoned output, bit-identical to `eager` (the same kernels); where the
// bins kernel selects (1..40K clusters) it must have stamped its phases.
struct StageRun {
  std::vector<float> out;      // [H, G, D]
  int n_phase = 0;             // "phase.*" entries
  double select_total = -1.0;  // phase.select_head_total (ms); -1: absent
};
inline StageRun expect_stage_path(PathLayer& t, const std::vector<float>& eager) {
  EnvGuard phases("RETROINFER_SELECT_PHASES", "1");
  auto ds = poisoned(t.q_elems);
  const auto st = t.layer->decode_stage_ms(t.dq.as<float>(), ds.as<float>());
  StageRun r;
  r.out = download_f32(ds, t.q_elems);
  for (size_t i = 0; i < r.out.size(); ++i) {
    EXPECT_EQ(r.out[i], eager[i]) << "stage path, element " << i;
    if (r.out[i] != eager[i]) break;
  }
  for (const auto& [name, ms] : st) {
    if (name.rfind("phase.", 0) != 0) continue;
    ++r.n_phase;
    if (name == "phase.select_head_total") r.select_total = ms;
  }
  const int C = t.layer->num_clusters();
  if (C > 0 && C <= 40 * 1024) {  // the bins kernel stamps
    EXPECT_GT(r.n_phase, 8);
  }
  return r;
}

// f64 reference of the zones a decode selected (host-side K/V only): exact tokens = the list, estimation = the
// estimated clusters' (logit from the scored centroid: gpu_test_util.h scored_centroid, weight = size, value =
// bf16 value sum).
inline std::vector<float> f64_reference(const PathLayer& t, const PathResult& r, int G, int d) {
  const float scale = 1.0f / std::sqrt(float(d));
  std::vector<float> ref(t.q_elems);
  for (int h = 0; h < t.H; ++h) {
    const auto& st = r.heads[h];
    for (int g = 0; g < G; ++g) {
      RefState rs(d);
      const float* qq = &t.q[(size_t(h) * G + g) * d];
      ref_exact(t.kv, qq, scale, h, st.token_list, rs);
      std::vector<float> vsum(d);
      for (int32_t cl : st.estimation_ids) {
        double sc = 0;
        for (int i = 0; i < d; ++i) sc += double(qq[i]) * scored_centroid(st, d, cl, i);
        for (int i = 0; i < d; ++i) vsum[i] = bf16_to_f32(st.value_sums_bf16[size_t(cl) * d + i]);
        rs.push(sc * scale, double(st.sizes[cl]), vsum.data(), d);
      }
      rs.finish(&ref[(size_t(h) * G + g) * d], d);
    }
  }
  return ref;
}

// Two decodes over the same selection whose exact tokens are grouped differently (other splits, tiles or
// warps; the same tokens in another cluster order): each P is formed against a different running max and split
// into bf16 hi + lo differently, which carries P to 2^-18 relative (decode.cu), so an output (a convex
// combination of value rows, |v| <= ~4.5 for the N(0,1)-like values here) moves by <= 2^-18 * 4.5 = 1.7e-5 per
// decode, 3.4e-5 between two in the worst case; the merges of the partial states add ~S * 2^-24 relative for S
// states. We require max-abs < 5e-5; the nmse of such errors is ~(2^-19)^2 = 4e-12 against outputs of rms
// ~0.3-1, required < 1e-10.
inline constexpr double kMaxAbsRegroup = 5e-5;
inline constexpr double kNmseRegroup = 1e-10;

}  // namespace retroinfer::gputest
