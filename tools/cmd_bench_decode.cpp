// `retroinfer bench decode`: end-to-end batched decode throughput of the CUDA model runner on a model
// shape with random weights, over context lengths, batch sizes, attention methods and KV placements, as
// JSON lines (one per configuration, refusals included), with the bytes-moved floor of every step at the
// HBM and PCIe bandwidths measured at start. Contexts beyond --max-real-prefill get synthetic K/V
// (cuda_synthetic.h) instead of a prefill, and the line says so. --plan-only prints the memory plans
// alone (no GPU needed with explicit --gpu-memory-limit / --host-memory-limit).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "retroinfer/memory_planner.h"
#include "retroinfer/session_planner.h"
#include "command.h"
#include "plot_charts.h"
#include "retroinfer/attention.h"
#include "retroinfer/cluster_trace.h"
#include "retroinfer/error.h"
#include "retroinfer/model_config.h"
#include "retroinfer/model_file.h"
#include "retroinfer/model_shapes.h"
#if RETROINFER_WITH_CUDA
#include "retroinfer/cuda_device.h"
#include "retroinfer/cuda_backend.h"
#include "retroinfer/cuda_model.h"
#include "retroinfer/wave_buffer.h"
#endif

namespace retroinfer::cli {
namespace {

using nlohmann::json;
constexpr double kGiB = double(int64_t{1} << 30);

struct BenchDecodeOptions {
  std::string model = "llama3-8b";
  std::string contexts = "32768,131072";
  std::string batches = "1,4";
  std::string methods = "full,retro";
  std::string placements = "gpu";
  int gpu_layers = -1;
  double cache_fraction = WaveBufferConfig{}.cache_fraction;  // host-tier layers' block cache
  int steps = 20;
  int warmup = 3;
  std::string synthetic = "auto";
  int64_t max_real_prefill = 32768;
  int prefill_chunk = 2048;
  int layer_budget_queries = 0;  // retro: retrieval budgets by layer calibrated after the prefill (in fill_s)
  double retrieval_fraction = AttentionConfig{}.retrieval_fraction;  // retro (and the baselines' nominal budget)
  double gpu_memory_gib = 0.0;   // 0: free memory minus the reserve
  double host_memory_gib = 0.0;  // 0: a share of MemAvailable
  std::string out;
  uint64_t seed = 1;
  bool plan_only = false;
  bool check_refusal = false;  // on a refused plan, also call the CudaSession constructor
  // The batch as one-sequence sessions decoded through one CudaJoinedDecoder step per token (the server's
  // continuous batching) instead of one session of the batch in lockstep.
  bool joined = false;
  int joined_gpu_sessions = 0;  // joined: the first this many sessions with every layer on the GPU
  std::string host_store = "bf16";  // host-tier layers' store element type (WaveBufferConfig::store_dtype)
  std::string kv_dtype = "bf16";    // GPU-tier KV cache: bf16 or int8 (CudaSessionOptions::kv_dtype)
  std::string query_trace;     // --query-trace: host-tier retrieval clusters follow this cluster trace
  bool stage_times = false;    // --stage-times: host-tier layers time their steps' stages (WaveStageTimes)
  bool prefill_breakdown = false;  // --prefill-breakdown: CudaSession::set_prefill_timing around the prefill
  std::string plot_dir;        // --plot: PNG charts of the --out file here after the run
  std::vector<std::string> plot_from;  // --plot-from: chart these JSON lines files instead of running
  std::string plot_title;      // --plot-title: the charts' title (default: model shape and device)
  std::shared_ptr<const ClusterTraceSchedule> query_schedule;  // read from query_trace before the runs
};

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

int64_t parse_count(const std::string& s, const char* what) {
  size_t used = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  RETROINFER_CHECK(used == s.size() && v >= 1, "bench decode: ", what, " '", s, "' is not a positive integer");
  return v;
}

// A shape name (model_shapes.h) or a model path: a config.json, a model directory or a .gguf file (only
// its config is read; the weights are random either way).
ModelConfig resolve_model(const std::string& name, std::string& label) {
  for (const std::string& n : model_shape_names())
    if (n == name) {
      label = n;
      return model_shape(n);
    }
  if (!std::filesystem::exists(name)) return model_shape(name);  // throws: unknown shape, names the known ones
  label = std::filesystem::path(name).filename().string();
  if (std::filesystem::path(name).extension() == ".json") return parse_hf_config(name);
  return ModelFile::open(name)->config();
}

// The attention of one configuration: the method, retro's retrieval share (the baselines' nominal budget) and,
// for retro, its budgets by layer.
AttentionConfig bench_attention(const BenchDecodeOptions& o, AttentionKind kind) {
  AttentionConfig a;
  a.kind = kind;
  a.retrieval_fraction = o.retrieval_fraction;
  if (kind == AttentionKind::kRetro) a.layer_budget_queries = o.layer_budget_queries;
  return a;
}

// Everything the plan needs besides the model.
buffer::SessionPlanRequest plan_request(const ModelConfig& cfg, const BenchDecodeOptions& o, AttentionKind kind,
                                        KvPlacement placement, int64_t max_context, int num_seqs,
                                        int64_t gpu_free, int64_t host_free) {
  buffer::SessionPlanRequest r;
  buffer::set_model_shape(r, cfg);
  r.attention = bench_attention(o, kind);
  r.max_context = max_context;
  r.prefill_chunk = o.prefill_chunk;
  r.num_seqs = num_seqs;
  r.placement = placement;
  r.gpu_layers = placement == KvPlacement::kSplit ? o.gpu_layers : -1;
  r.wave.store_dtype = parse_store_dtype(o.host_store);
  r.wave.cache_fraction = o.cache_fraction;
  r.kv_dtype = parse_dtype(o.kv_dtype);
  r.gpu_free_bytes = gpu_free;
  r.host_free_bytes = host_free;
  return r;
}

// --joined: the batch is c.batch one-sequence sessions, each planning alone (its own activations and
// workspaces; the weights are shared and not counted), the first gpu_sessions with every layer on the GPU and
// the others with req's placement. The batch fits when their one-sequence plans add up within the limits;
// otherwise an Error ("session plan: ...", reported as refused) before any session is made. Returns the plan
// of the sessions with req's placement (of the GPU sessions when all are), and the sums in j["plan_joined"].
buffer::SessionPlanBreakdown plan_joined(buffer::SessionPlanRequest req, int batch, int gpu_sessions, json& j) {
  const int on_gpu = std::min(batch, gpu_sessions), others = batch - on_gpu;
  req.num_seqs = 1;
  int64_t gpu_need = 0, host_need = 0;
  buffer::SessionPlanBreakdown other_plan, gpu_plan;
  if (others > 0) {
    other_plan = buffer::plan_session(req);
    gpu_need += others * other_plan.gpu_bytes;
    host_need += others * other_plan.host_bytes;
  }
  if (on_gpu > 0) {
    buffer::SessionPlanRequest g = req;
    g.placement = KvPlacement::kGpu;
    g.gpu_layers = -1;
    gpu_plan = buffer::plan_session(g);
    gpu_need += on_gpu * gpu_plan.gpu_bytes;
    host_need += on_gpu * gpu_plan.host_bytes;
  }
  j["plan_joined"] = {{"gpu_sessions", on_gpu},       {"other_sessions", others},
                      {"gpu_bytes", gpu_need},        {"host_bytes", host_need},
                      {"gpu_free_bytes", req.gpu_free_bytes}, {"host_free_bytes", req.host_free_bytes}};
  using buffer::format_gib;
  RETROINFER_CHECK(gpu_need <= req.gpu_free_bytes && host_need <= req.host_free_bytes, "session plan: joined batch of ",
                   batch, " one-sequence sessions (", on_gpu, " on the GPU, ", others, " ",
                   buffer::kv_placement_name(req.placement), ") x ", req.max_context, " tokens needs ",
                   format_gib(gpu_need), " of GPU memory with ", format_gib(req.gpu_free_bytes), " free and ",
                   format_gib(host_need), " of pinned host memory with ", format_gib(req.host_free_bytes),
                   " free (does not fit); nothing was allocated. Use fewer sessions, fewer on the GPU, or raise the "
                   "memory limits");
  return others > 0 ? other_plan : gpu_plan;
}

json plan_json(const buffer::SessionPlanBreakdown& p) {
  return {{"placement", buffer::kv_placement_name(p.placement)},
          {"gpu_layers", p.gpu_layers},
          {"host_layers", p.host_layers},
          {"gpu_bytes", p.gpu_bytes},
          {"host_bytes", p.host_bytes},
          {"gpu_free_bytes", p.gpu_free_bytes},
          {"host_free_bytes", p.host_free_bytes},
          {"kv_layer_bytes", p.kv_layer_bytes},
          {"method_layer_bytes", p.method_layer_bytes},
          {"host_layer_gpu_bytes", p.host_layer_gpu_bytes},
          {"host_layer_host_bytes", p.host_layer_host_bytes},
          {"staging_bytes", p.staging_bytes},
          {"build_workspace_bytes", p.build_workspace_bytes},
          {"activation_bytes", p.activation_bytes + p.logits_bytes}};
}

class JsonOut {
 public:
  explicit JsonOut(const std::string& path) {
    if (path.empty()) return;
    f_.open(path, std::ios::app);
    RETROINFER_CHECK(f_.good(), "bench decode: cannot append to --out '", path, "'");
  }
  void write(json j) {
    j["unix_time"] = static_cast<int64_t>(std::time(nullptr));
    const std::string line = j.dump();
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
    if (f_.is_open()) {
      f_ << line << "\n";
      f_.flush();
    }
  }

 private:
  std::ofstream f_;
};

// Bytes of the model's weights in bf16 (as CudaModel::random allocates them).
int64_t bf16_weight_bytes(const ModelConfig& c) {
  const int64_t h = c.hidden_size, d = c.head_dim, qkv = int64_t{c.num_heads_q + 2 * c.num_heads_kv} * d;
  const int64_t layer = 2 * h + qkv * h + (c.attention_bias ? qkv : 0) + h * c.num_heads_q * d +
                        3 * int64_t{c.intermediate_size} * h;
  return 2 * (int64_t{c.vocab_size} * h * (c.tie_word_embeddings ? 1 : 2) + h + c.num_layers * layer);
}

struct Config {
  int64_t context = 0;
  AttentionKind kind = AttentionKind::kFull;
  KvPlacement placement = KvPlacement::kGpu;
  int batch = 0;  // resolved
  bool batch_max = false;
};

#if RETROINFER_WITH_CUDA
int64_t rss_bytes() {
  std::ifstream f("/proc/self/statm");
  int64_t size = 0, resident = 0;
  f >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

KvPlacement to_cuda(KvPlacement p) {
  switch (p) {
    case KvPlacement::kGpu: return KvPlacement::kGpu;
    case KvPlacement::kHost: return KvPlacement::kHost;
    case KvPlacement::kSplit: return KvPlacement::kSplit;
    case KvPlacement::kAuto: return KvPlacement::kAuto;
  }
  return KvPlacement::kGpu;
}

// Which queries choose the host-tier layers' retrieval clusters (the GPU-tier layers always use their own).
void add_query_source(json& j, const BenchDecodeOptions& o) {
  j["query_source"] = o.query_trace.empty() ? "synthetic" : "trace:" + o.query_trace;
  if (o.query_schedule) j["query_trace_rule"] = o.query_schedule->rule();
}

// How long filling the KV took (a real prefill, or synthetic K/V), the index build's part of it, and for a real
// prefill its tokens per second and chunk.
void add_fill_figures(json& j, const BenchDecodeOptions& o, const Config& c, bool synthetic, double fill_s,
                      double index_build_s) {
  j["fill_s"] = fill_s;
  j["index_build_s"] = index_build_s;
  if (synthetic) return;
  j["prefill_tok_s"] = double(c.batch) * double(c.context) / fill_s;
  j["prefill_chunk"] = o.prefill_chunk;
}

// One configuration on the GPU: session, fill, warm-up, timed steps, one timed-breakdown step.
cuda::CudaSessionOptions session_options(const BenchDecodeOptions& o, const Config& c,
                                         const buffer::SessionPlanBreakdown& plan, int64_t gpu_limit, int64_t host_limit) {
  cuda::CudaSessionOptions opt;
  opt.attention = bench_attention(o, c.kind);
  opt.max_context = plan.max_context;
  opt.prefill_chunk = o.prefill_chunk;
  opt.exact_stats = true;  // the report's exact-KV-read figures (read back after the timed steps)
  opt.placement = to_cuda(c.placement);
  opt.gpu_layers = o.gpu_layers;
  opt.wave.store_dtype = parse_store_dtype(o.host_store);
  opt.wave.stage_times = o.stage_times;
  opt.wave.cache_fraction = o.cache_fraction;
  opt.kv_dtype = parse_dtype(o.kv_dtype);
  opt.gpu_memory_limit = gpu_limit;
  opt.host_memory_limit = host_limit;
  opt.query_trace = o.query_schedule;
  return opt;
}

void add_step_figures(json& j, const cuda::CudaModel& model, const Config& c, const BenchDecodeOptions& o,
                      const cuda::CudaSessionOptions& opt, double decode_s, const AttentionStats& st,
                      const cuda::CudaWaveCounts& wave0, const cuda::CudaWaveCounts& wave1,
                      const cuda::CudaWaveCounts& wave, const cuda::BandwidthFigures& bw);

json run_config(const cuda::CudaModel& model, const BenchDecodeOptions& o, const Config& c,
                const buffer::SessionPlanBreakdown& plan, const cuda::BandwidthFigures& bw, int64_t gpu_limit,
                int64_t host_limit) {
  const ModelConfig& cfg = model.config();
  json j;
  j["mode"] = "lockstep";
  add_query_source(j, o);
  const cuda::CudaSessionOptions opt = session_options(o, c, plan, gpu_limit, host_limit);
  const int64_t gpu_free0 = cuda::device_memory_info().first, rss0 = rss_bytes();
  double t0 = now_s();
  auto session = std::make_unique<cuda::CudaSession>(model, opt, c.batch);
  j["session_s"] = now_s() - t0;
  const bool synthetic = o.synthetic == "always" || (o.synthetic == "auto" && c.context > o.max_real_prefill);
  auto progress = [&, last = 0.0](int64_t done, int64_t total) mutable {
    if (now_s() - last < 2.0 && done < total) return;
    last = now_s();
    std::fprintf(stderr, "\r  %s %lld/%lld", synthetic ? "fill" : "prefill", static_cast<long long>(done),
                 static_cast<long long>(total));
    if (done == total) std::fprintf(stderr, "\n");
  };
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(0, cfg.vocab_size - 1);
  t0 = now_s();
  if (synthetic) {
    session->fill_synthetic(c.context, o.seed, progress);
    j["kv_source"] = "synthetic";
    j["synthetic_kv"] =
        "eval/synthetic.h generator, one layer (each KV head its own seed) generated on the host and copied to every "
        "layer and sequence, then indexed by each method";
  } else {
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(c.batch), std::vector<int32_t>(size_t(c.context)));
    for (auto& p : prompts)
      for (auto& t : p) t = token(rng);
    session->set_prefill_timing(o.prefill_breakdown);
    session->prefill(prompts, false, progress);
    j["kv_source"] = "prefill";
  }
  const double fill_s = now_s() - t0;
  add_fill_figures(j, o, c, synthetic, fill_s, session->index_build_seconds());
  if (!synthetic && o.prefill_breakdown) {
    json pb = json::object();
    for (const auto& [name, ms] : session->last_prefill_ms()) pb[name] = ms;
    j["prefill_breakdown_ms"] = pb;  // empty for a layer-major prefill (host-tier layers)
  }
  if (c.kind == AttentionKind::kRetro) {
    j["retrieval_fraction"] = opt.attention.retrieval_fraction;
    j["layer_budget_queries"] = opt.attention.layer_budget_queries;
    const std::vector<double>& multipliers = session->layer_budget_multipliers();
    if (!multipliers.empty()) j["layer_budget_multipliers"] = multipliers;
  }
  j["gpu_used_bytes"] = gpu_free0 - cuda::device_memory_info().first;
  j["host_rss_growth_bytes"] = rss_bytes() - rss0;
  j["host_rss_bytes"] = rss_bytes();

  std::vector<int32_t> cur(static_cast<size_t>(c.batch)), next(cur.size());
  for (auto& t : cur) t = token(rng);
  for (int i = 0; i < o.warmup; ++i) {
    session->decode_greedy(cur, next);
    cur.swap(next);
  }
  const cuda::CudaWaveCounts wave0 = session->last_wave_counts();  // host-tier layers (synchronous, untimed)
  const double issue0 = session->host_issue_seconds();
  t0 = now_s();
  for (int i = 0; i < o.steps; ++i) {  // decode_greedy returns host tokens: each step ends synchronised
    session->decode_greedy(cur, next);
    cur.swap(next);
  }
  const double decode_s = now_s() - t0;
  // Host time issuing the timed steps, per step: near ms_per_step, the host's launches bound the step.
  j["host_issue_ms"] = 1e3 * (session->host_issue_seconds() - issue0) / o.steps;
  const cuda::CudaWaveCounts wave1 = session->last_wave_counts();
  const bool graphs_active = session->decode_graphs_active();
  session->set_step_timing(true);
  session->decode_greedy(cur, next);
  json breakdown = json::object();
  for (const auto& [name, ms] : session->last_step_ms()) breakdown[name] = ms;
  session->set_step_timing(false);
  const AttentionStats st = session->last_stats();
  const cuda::CudaWaveCounts wave = session->last_wave_counts();  // the breakdown step's counts
  j["breakdown_ms"] = breakdown;  // an eager step with events (graphs are not used while timing)
  j["decode_graphs"] = graphs_active;  // the timed steps replayed the non-attention work from CUDA graphs
  add_step_figures(j, model, c, o, opt, decode_s, st, wave0, wave1, wave, bw);
  session.reset();
  return j;
}

// The step figures: throughput of the timed steps, the attention stats and wave counts of the last step
// (`st`, `wave`), the hit ratio between wave0 and wave1 (before and after the timed steps), the bytes-moved
// floor.
void add_step_figures(json& j, const cuda::CudaModel& model, const Config& c, const BenchDecodeOptions& o,
                      const cuda::CudaSessionOptions& opt, double decode_s, const AttentionStats& st,
                      const cuda::CudaWaveCounts& wave0, const cuda::CudaWaveCounts& wave1,
                      const cuda::CudaWaveCounts& wave, const cuda::BandwidthFigures& bw) {
  const ModelConfig& cfg = model.config();
  const double ms_step = 1e3 * decode_s / o.steps;
  // Floor: bytes one step must read (bf16 weights; K and V of every exactly attended token; retro's bf16
  // centroids of every cluster and value sums of the estimated ones) at the measured HBM copy rate, plus
  // the host-tier misses (K and V rows read from pinned host memory by the gather kernel, last step's
  // device counts) at the measured host->device rate. In lockstep everything runs on one stream, so the PCIe
  // reads add to the step; in a joined step they may overlap the GPU-tier sessions' attention, so the sum can
  // exceed the least the step needs. exact_tokens: the tokens the device attended exactly in that step (read
  // back).
  const int64_t row = int64_t{cfg.head_dim} * 2;  // one K (or V) row, bf16
  // A miss row (one token of one head) reads its K and V from the store: bf16 4 D bytes, int8 2 D + 8.
  const int64_t pcie_bytes = wave.step.miss_rows * store_token_bytes(opt.wave.store_dtype, cfg.head_dim);
  const int64_t kv_bytes = std::max<int64_t>(0, (st.exact_tokens - wave.step.miss_rows) * 2 * row);
  const int64_t index_bytes =
      c.kind == AttentionKind::kRetro
          ? (st.context_tokens / std::max(1, opt.attention.tokens_per_cluster) + st.estimated_clusters) * row
          : 0;
  const int64_t floor_bytes = model.weight_bytes() + kv_bytes + index_bytes;
  const double hbm_ms = 1e3 * double(floor_bytes) / (bw.hbm_gb_s * 1e9);
  const double pcie_ms = bw.h2d_gb_s > 0 ? 1e3 * double(pcie_bytes) / (bw.h2d_gb_s * 1e9) : 0.0;
  const double floor_ms = hbm_ms + pcie_ms;
  // Hit ratio of the timed steps: the managers' cluster counters (they trail the issued steps by the
  // manager's queue, a step or two, at both ends of the window).
  const int64_t hits = int64_t(wave1.totals.hits - wave0.totals.hits);
  const int64_t misses = int64_t(wave1.totals.misses - wave0.totals.misses);
  j["steps"] = o.steps;
  j["warmup"] = o.warmup;
  j["decode_s"] = decode_s;
  j["ms_per_step"] = ms_step;
  j["tok_s"] = double(c.batch) * o.steps / decode_s;
  j["context_tokens"] = st.context_tokens;
  j["exact_tokens"] = st.exact_tokens;
  j["kv_read_share"] = st.context_tokens > 0 ? double(st.exact_tokens) / double(st.context_tokens) : 0.0;
  j["retrieved_clusters"] = st.retrieved_clusters;
  j["estimated_clusters"] = st.estimated_clusters;
  if (wave.objects > 0) {
    j["hit_ratio"] = hits + misses > 0 ? json(double(hits) / double(hits + misses)) : json(nullptr);
    j["hit_ratio_last_step"] = wave.step_hit_ratio() >= 0 ? json(wave.step_hit_ratio()) : json(nullptr);
    j["wave"] = {{"host_tier_objects", wave.objects},
                 {"timed_hit_clusters", hits},
                 {"timed_miss_clusters", misses},
                 {"last_step", {{"hit_clusters", wave.step.hit_clusters},
                                {"miss_clusters", wave.step.miss_clusters},
                                {"hit_rows", wave.step.hit_rows},
                                {"miss_rows", wave.step.miss_rows},
                                {"steady_rows", wave.step.steady_rows}}},
                 {"totals", {{"steps_seen", wave.totals.steps_seen},
                             {"steps_lost", wave.totals.steps_lost},
                             {"hits", wave.totals.hits},
                             {"misses", wave.totals.misses},
                             {"admitted", wave.totals.admitted},
                             {"evicted", wave.totals.evicted},
                             {"updates_dropped", wave.totals.updates_dropped}}}};
    if (o.stage_times && wave1.stages.steps > wave0.stages.steps) {
      // ms per decode step, summed over the host-tier layers (each layer's steps timed by its own events).
      json stages = json::object();
      const auto before = wave0.stages.named();
      const auto after = wave1.stages.named();
      for (size_t i = 0; i < after.size(); ++i) stages[after[i].first] = (after[i].second - before[i].second) / o.steps;
      j["wave_stage_ms"] = stages;
    }
  } else {
    j["hit_ratio"] = nullptr;  // no host-tier layer: no wave buffer, every KV read is from HBM
  }
  j["floor"] = {{"weight_bytes", model.weight_bytes()},
                {"kv_bytes", kv_bytes},
                {"index_bytes", index_bytes},
                {"bytes", floor_bytes},
                {"pcie_miss_bytes", pcie_bytes},
                {"hbm_gb_s", bw.hbm_gb_s},
                {"h2d_gb_s", bw.h2d_gb_s},
                {"hbm_ms", hbm_ms},
                {"pcie_ms", pcie_ms},
                {"ms", floor_ms},
                {"tok_s", 1e3 * c.batch / floor_ms},
                {"fraction", floor_ms / ms_step},
                {"note", "HBM read floor plus the host-tier misses' K/V rows at the pinned host->device rate "
                         "(last step's device counts)"}};
  j["status"] = "ok";
}

// --joined: the batch as c.batch one-sequence sessions (the first o.joined_gpu_sessions with every layer on the
// GPU, the others with c.placement), each prefilled or filled alone, decoded through one CudaJoinedDecoder step
// per token with greedy selection on the device (the server's continuous batching; a host-tier layer's
// attention overlaps the GPU-tier sessions' on its session's stream). No per-layer breakdown (the joined step
// has no step timing).
json run_joined_config(const cuda::CudaModel& model, const BenchDecodeOptions& o, const Config& c,
                       const buffer::SessionPlanBreakdown& plan, const cuda::BandwidthFigures& bw, int64_t gpu_limit,
                       int64_t host_limit) {
  const ModelConfig& cfg = model.config();
  json j;
  j["mode"] = "joined";
  add_query_source(j, o);  // every one-sequence session follows the trace as sequence 0
  const int gpu_sessions = std::min(c.batch, o.joined_gpu_sessions);
  j["joined_gpu_sessions"] = gpu_sessions;
  const cuda::CudaSessionOptions opt = session_options(o, c, plan, gpu_limit, host_limit);
  const int64_t gpu_free0 = cuda::device_memory_info().first, rss0 = rss_bytes();
  const bool synthetic = o.synthetic == "always" || (o.synthetic == "auto" && c.context > o.max_real_prefill);
  std::mt19937_64 rng(o.seed);
  std::uniform_int_distribution<int32_t> token(0, cfg.vocab_size - 1);
  std::vector<std::unique_ptr<cuda::CudaSession>> sessions;
  std::vector<cuda::CudaSession*> ss;
  double session_s = 0.0, fill_s = 0.0, index_build_s = 0.0;
  for (int i = 0; i < c.batch; ++i) {
    cuda::CudaSessionOptions oi = opt;
    if (i < gpu_sessions) oi.placement = KvPlacement::kGpu;
    double t0 = now_s();
    sessions.push_back(std::make_unique<cuda::CudaSession>(model, oi, 1));
    ss.push_back(sessions.back().get());
    session_s += now_s() - t0;
    std::fprintf(stderr, "  session %d of %d (%s)\n", i + 1, c.batch,
                 std::string(buffer::kv_placement_name(oi.placement)).c_str());
    t0 = now_s();
    if (synthetic) {
      sessions.back()->fill_synthetic(c.context, o.seed);
    } else {
      std::vector<std::vector<int32_t>> prompt(1, std::vector<int32_t>(size_t(c.context)));
      for (auto& t : prompt[0]) t = token(rng);
      sessions.back()->prefill(prompt);
    }
    fill_s += now_s() - t0;
    index_build_s += sessions.back()->index_build_seconds();
  }
  j["session_s"] = session_s;
  j["kv_source"] = synthetic ? "synthetic" : "prefill";
  add_fill_figures(j, o, c, synthetic, fill_s, index_build_s);
  j["gpu_used_bytes"] = gpu_free0 - cuda::device_memory_info().first;
  j["host_rss_growth_bytes"] = rss_bytes() - rss0;
  j["host_rss_bytes"] = rss_bytes();

  auto wave_sum = [&] {
    cuda::CudaWaveCounts r;
    for (auto& s : sessions) {
      const cuda::CudaWaveCounts w = s->last_wave_counts();  // synchronous
      r.objects += w.objects;
      r.step += w.step;
      r.totals += w.totals;
      r.stages += w.stages;
    }
    return r;
  };
  cuda::CudaJoinedDecoder dec(model);
  std::vector<int32_t> cur(static_cast<size_t>(c.batch)), next(cur.size());
  for (auto& t : cur) t = token(rng);
  for (int i = 0; i < o.warmup; ++i) {  // the second step of a batch size captures the decoder's graphs
    dec.decode_greedy(ss, cur, next);
    cur.swap(next);
  }
  const cuda::CudaWaveCounts wave0 = wave_sum();
  const double t0 = now_s();
  for (int i = 0; i < o.steps; ++i) {  // decode_greedy returns host tokens: each step ends synchronised
    dec.decode_greedy(ss, cur, next);
    cur.swap(next);
  }
  const double decode_s = now_s() - t0;
  const cuda::CudaWaveCounts wave1 = wave_sum();
  AttentionStats st;
  for (auto& s : sessions) st += s->last_stats();
  add_step_figures(j, model, c, o, opt, decode_s, st, wave0, wave1, wave1, bw);
  return j;
}

// A refused plan: the CudaSession constructor must refuse too, before allocating (free memory unchanged).
json check_constructor_refusal(const cuda::CudaModel& model, const Config& c, int64_t max_context,
                               const BenchDecodeOptions& o, int64_t gpu_limit, int64_t host_limit) {
  cuda::CudaSessionOptions opt;
  opt.attention = bench_attention(o, c.kind);
  opt.max_context = max_context;
  opt.prefill_chunk = o.prefill_chunk;
  opt.placement = to_cuda(c.placement);
  opt.gpu_layers = o.gpu_layers;
  opt.wave.store_dtype = parse_store_dtype(o.host_store);
  opt.wave.stage_times = o.stage_times;
  opt.wave.cache_fraction = o.cache_fraction;
  opt.kv_dtype = parse_dtype(o.kv_dtype);
  opt.gpu_memory_limit = gpu_limit;
  opt.host_memory_limit = host_limit;
  const int64_t free0 = cuda::device_memory_info().first;
  json j;
  try {
    cuda::CudaSession session(model, opt, std::max(1, c.batch));
    j["constructor_refused"] = false;
  } catch (const Error& e) {
    j["constructor_refused"] = true;
    j["constructor_message"] = e.what();
  }
  j["constructor_gpu_free_delta_bytes"] = cuda::device_memory_info().first - free0;
  return j;
}
#endif

void run_bench_decode(const BenchDecodeOptions& o) {
  RETROINFER_CHECK(o.steps >= 1 && o.warmup >= 0, "bench decode: --steps must be >= 1 and --warmup >= 0");
  RETROINFER_CHECK(o.synthetic == "auto" || o.synthetic == "always" || o.synthetic == "never",
                   "bench decode: --synthetic must be auto, always or never, got '", o.synthetic, "'");
  RETROINFER_CHECK(o.gpu_layers >= -1, "bench decode: --gpu-layers must be >= -1");
  RETROINFER_CHECK(o.joined_gpu_sessions >= 0 && (o.joined || o.joined_gpu_sessions == 0),
                   "bench decode: --joined-gpu-sessions must be >= 0 and needs --joined");
  std::vector<int64_t> contexts;
  for (const auto& s : split_list(o.contexts)) contexts.push_back(parse_count(s, "context"));
  std::vector<std::string> batch_specs = split_list(o.batches);
  for (const auto& b : batch_specs)
    if (b != "max") parse_count(b, "batch");
  std::vector<AttentionKind> kinds;
  for (const auto& m : split_list(o.methods)) kinds.push_back(parse_attention_kind(m));
  std::vector<KvPlacement> placements;
  for (const auto& p : split_list(o.placements)) placements.push_back(buffer::parse_kv_placement(p));
  RETROINFER_CHECK(!contexts.empty() && !batch_specs.empty() && !kinds.empty() && !placements.empty(),
                   "bench decode: --contexts, --batches, --methods and --placement must each name at least one value");
  std::string label;
  ModelConfig cfg = resolve_model(o.model, label);
  // Positions: the longest context plus the decoded tokens (warm-up, timed, breakdown step).
  const int64_t extra = o.warmup + o.steps + 2;
  const int64_t longest = *std::max_element(contexts.begin(), contexts.end()) + extra;
  const bool extended = longest > cfg.max_position_embeddings;
  cfg = with_max_context(cfg, longest);
  JsonOut out(o.out);

  const int64_t gpu_limit = static_cast<int64_t>(o.gpu_memory_gib * kGiB);
  const int64_t host_limit = static_cast<int64_t>(o.host_memory_gib * kGiB);
  json env = {{"bench", "decode_env"}, {"model", label}, {"layers", cfg.num_layers}, {"hidden", cfg.hidden_size},
              {"heads_q", cfg.num_heads_q}, {"heads_kv", cfg.num_heads_kv}, {"head_dim", cfg.head_dim},
              {"vocab", cfg.vocab_size}, {"max_positions", cfg.max_position_embeddings},
              {"positions_extended_for_benchmark", extended}, {"weights", "random bf16"}};
#if RETROINFER_WITH_CUDA
  const bool gpu = !o.plan_only;
  std::unique_ptr<cuda::CudaModel> model;
  cuda::BandwidthFigures bw;
  if (gpu) {
    RETROINFER_CHECK(cuda::device_available(), "bench decode: no usable CUDA device (",
                     cuda::device_description(), "); --plan-only prints the memory plans without one");
    env["device"] = cuda::device_description();
    std::fprintf(stderr, "bench decode: measuring bandwidths on %s\n", cuda::device_description().c_str());
    bw = cuda::measure_bandwidth();
    env["hbm_gb_s"] = bw.hbm_gb_s;
    env["h2d_gb_s"] = bw.h2d_gb_s;
    std::fprintf(stderr, "bench decode: HBM copy %.0f GB/s, pinned host->device %.1f GB/s; random %s weights\n",
                 bw.hbm_gb_s, bw.h2d_gb_s, label.c_str());
    const double t0 = now_s();
    model = cuda::CudaModel::random(cfg, o.seed);
    env["model_init_s"] = now_s() - t0;
    env["weight_bytes"] = model->weight_bytes();
  }
  auto gpu_free = [&] {
    return buffer::resolve_gpu_limit(gpu_limit, [] {
      RETROINFER_CHECK(cuda::device_available(), "bench decode: no usable CUDA device to ask for free memory (",
                       cuda::device_description(), "); pass --gpu-memory-limit");
      return cuda::device_memory_info().first;
    });
  };
#else
  RETROINFER_CHECK(o.plan_only, "bench decode: this build has no CUDA backend; only --plan-only works here");
  auto gpu_free = [&] {
    return buffer::resolve_gpu_limit(gpu_limit, [] {
      RETROINFER_FAIL("bench decode: no CUDA backend to ask for free GPU memory; pass --gpu-memory-limit");
      return int64_t{0};
    });
  };
#endif
  // As CudaSession::plan: the limit (given, or the free memory with the weights loaded) is the session's
  // alone, so the weights are not counted against it; plan-only reports their bf16 size.
  if (o.plan_only) env["weight_bytes_bf16"] = bf16_weight_bytes(cfg);
  env["plan_only"] = o.plan_only;
  out.write(env);

  for (int64_t ctx : contexts)
    for (AttentionKind kind : kinds)
      for (KvPlacement placement : placements) {
        if (kind != AttentionKind::kRetro && placement != KvPlacement::kGpu &&
            placement != KvPlacement::kAuto) {
          std::fprintf(stderr, "bench decode: skipping %s with placement %s (host-tier layers are retro only)\n",
                       std::string(attention_kind_name(kind)).c_str(),
                       std::string(buffer::kv_placement_name(placement)).c_str());
          continue;
        }
        for (const std::string& spec : batch_specs) {
          json j = {{"bench", "decode"}, {"model", label}, {"context", ctx}, {"method", attention_kind_name(kind)},
                    {"placement", buffer::kv_placement_name(placement)}, {"batch_spec", spec},
                    {"host_store", o.host_store}, {"kv_dtype", o.kv_dtype}};
          try {
            const int64_t host_free =
                buffer::resolve_host_limit(host_limit, [] { return buffer::host_memory_available(); });
            buffer::SessionPlanRequest req =
                plan_request(cfg, o, kind, placement, ctx + extra, 1, gpu_free(), host_free);
            Config c{ctx, kind, placement, 0, spec == "max"};
            c.batch = c.batch_max ? buffer::largest_batch(req) : static_cast<int>(parse_count(spec, "batch"));
            j["batch"] = c.batch;
            req.num_seqs = std::max(1, c.batch);
            std::fprintf(stderr, "bench decode: context %lld, %s, placement %s, batch %d\n",
                         static_cast<long long>(ctx), std::string(attention_kind_name(kind)).c_str(),
                         std::string(buffer::kv_placement_name(placement)).c_str(), c.batch);
            const buffer::SessionPlanBreakdown plan =  // throws: refused
                o.joined ? plan_joined(req, c.batch, o.joined_gpu_sessions, j) : buffer::plan_session(req);
            j["plan"] = plan_json(plan);
            if (o.plan_only) {
              j["status"] = "planned";
            } else {
#if RETROINFER_WITH_CUDA
              j.update(o.joined ? run_joined_config(*model, o, c, plan, bw, gpu_limit, host_limit)
                                : run_config(*model, o, c, plan, bw, gpu_limit, host_limit));
#endif
            }
          } catch (const std::exception& e) {  // Error, or bad_alloc of a host buffer: record and go on
            const std::string what = e.what();
            j["status"] = what.find("session plan:") != std::string::npos ? "refused" : "error";
            j["message"] = what;
#if RETROINFER_WITH_CUDA
            if (o.check_refusal && model && j["status"] == "refused") {
              try {
                const int b = j.contains("batch") ? j["batch"].get<int>() : 1;
                j.update(check_constructor_refusal(*model, Config{ctx, kind, placement, b, false}, ctx + extra, o,
                                                   gpu_limit, host_limit));
              } catch (const Error& e2) {
                j["constructor_message"] = e2.what();
              }
            }
#endif
            std::fprintf(stderr, "bench decode: %s: %s\n", j["status"].get<std::string>().c_str(), what.c_str());
          }
          out.write(j);
        }
      }
}


void setup_bench_decode(CLI::App& app) {
  auto o = std::make_shared<BenchDecodeOptions>();
  auto* cmd = bench_command(app)->add_subcommand(
      "decode", "CUDA batched decode tokens/s per context, batch, method and KV placement (random weights)");
  cmd->add_option("--model", o->model, "Shape name (" + [] {
    std::string s;
    for (const auto& n : model_shape_names()) s += (s.empty() ? "" : ", ") + n;
    return s;
  }() + ") or a model file / config.json (its shape)")->capture_default_str();
  cmd->add_option("--contexts", o->contexts, "Comma-separated context lengths in tokens")->capture_default_str();
  cmd->add_option("--batches", o->batches, "Comma-separated batch sizes; 'max' = the largest the plan accepts")
      ->capture_default_str();
  cmd->add_option("--methods", o->methods, "Comma-separated: full, retro, quest, streaming, oracle")
      ->capture_default_str();
  cmd->add_option("--kv-placement,--placement", o->placements, "Comma-separated KV placements: gpu, host, split, auto")
      ->capture_default_str();
  cmd->add_option("--gpu-layers", o->gpu_layers, "split: layers on the GPU (-1: as many as fit)")
      ->capture_default_str();
  cmd->add_option("--cache-fraction", o->cache_fraction,
                  "Host-tier layers: GPU block cache per KV head as a fraction of the context")
      ->check(CLI::Range(1e-9, 1.0))
      ->capture_default_str();
  // The last value wins (scripts pass a default, then a part may override it).
  cmd->add_option("--steps", o->steps, "Timed decode steps per configuration (the last one given counts)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->capture_default_str();
  cmd->add_option("--warmup", o->warmup, "Untimed decode steps first (the last one given counts)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->capture_default_str();
  cmd->add_option("--synthetic", o->synthetic, "auto | always | never: synthetic K/V instead of a prefill")
      ->capture_default_str();
  cmd->add_option("--max-real-prefill", o->max_real_prefill, "auto: contexts above this get synthetic K/V")
      ->capture_default_str();
  cmd->add_option("--prefill-chunk", o->prefill_chunk, "Prefill block in tokens")->capture_default_str();
  cmd->add_option("--retrieval-fraction", o->retrieval_fraction,
                  "retro: share of clusters attended exactly (quest / streaming / oracle: their nominal budget)")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1.0));
  cmd->add_option("--layer-budget-queries", o->layer_budget_queries,
                  "retro: retrieval budgets by layer from the prompt's last queries (batch 1, prefilled; the "
                  "calibration counts in fill_s; 0: off)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--gpu-memory-limit", o->gpu_memory_gib,
                  "GiB of GPU memory for each session, weights excluded (0: free memory - 2 GiB after loading)")
      ->check(CLI::Range(0.0, 1.0e6))  // GiB; the byte count must fit in int64
      ->capture_default_str();
  cmd->add_option("--host-memory-limit", o->host_memory_gib, "GiB of pinned host memory (0: 80% of MemAvailable)")
      ->check(CLI::Range(0.0, 1.0e6))
      ->capture_default_str();
  cmd->add_option("--out", o->out, "Append the JSON lines to this file (they also go to stdout)");
  cmd->add_option("--seed", o->seed, "Weights, tokens and synthetic K/V seed")->capture_default_str();
  cmd->add_flag("--plan-only", o->plan_only, "Print the memory plans only (no GPU work)");
  cmd->add_flag("--check-refusal", o->check_refusal,
                "On a refused plan also call the CudaSession constructor and record its refusal and free memory");
  cmd->add_flag("--joined", o->joined,
                "Decode each batch as that many one-sequence sessions through one joined step per token (the "
                "server's continuous batching, CudaJoinedDecoder) instead of one session of the batch in lockstep");
  cmd->add_option("--joined-gpu-sessions", o->joined_gpu_sessions,
                  "With --joined: the first N sessions keep every layer on the GPU, the others use --placement "
                  "(a batch mixing tiers)")
      ->capture_default_str();
  cmd->add_option("--kv-dtype", o->kv_dtype,
                  "KV cache element type of the GPU-tier layers: bf16, or int8 (int8 rows with an f32 scale each, "
                  "2 D + 8 bytes per token and head: full and retro, placement gpu or auto)")
      ->check(CLI::IsMember({"bf16", "int8"}))
      ->capture_default_str();
  cmd->add_option("--host-store", o->host_store,
                  "Element type of the host-tier layers' KV store: bf16, int8 (per-row scales, widened on the "
                  "GPU; about half the bytes per miss) or int4 (a scale per 32 values of the row minus its "
                  "cluster's mean; 28% of bf16's bytes)")
      ->check(CLI::IsMember({"bf16", "int8", "int4"}))
      ->capture_default_str();
  cmd->add_option("--query-trace", o->query_trace,
                  "Cluster trace (generate --record-trace): the host-tier layers' retrieval clusters follow it "
                  "instead of the random-weight queries' selection (docs/wave-buffer.md#cluster-traces)");
  cmd->add_flag("--stage-times", o->stage_times,
                "Host-tier layers record events between the stages of every decode step; the JSON gets "
                "wave_stage_ms (apply, select, apply_wait, lookup, gather, attention, ring_wait, step: ms per "
                "step summed over the layers)");
  cmd->add_flag("--prefill-breakdown", o->prefill_breakdown,
                "A real prefill with every layer on the GPU records events around every chunk and layer "
                "attention; the JSON gets prefill_breakdown_ms (attention, layers, chunk_start, chunk_end, "
                "between_chunks, gpu_total: ms summed over the chunks; CudaSession::last_prefill_ms; the joined "
                "mode's one-sequence sessions do not record it)");
  cmd->add_option("--plot", o->plot_dir,
                  "Write PNG charts (tokens/s against batch per method and placement, ms per step: attention and "
                  "the rest) of the --out file to this folder (python3 + matplotlib; docs/install.md#charts)");
  cmd->add_option("--plot-from", o->plot_from,
                  "With --plot: chart these JSON lines files of earlier runs instead of running (no GPU needed)")
      ->delimiter(',');
  cmd->add_option("--plot-title", o->plot_title, "With --plot: the charts' title");
  cmd->callback([o] {
    RETROINFER_CHECK(o->plot_from.empty() || !o->plot_dir.empty(), "bench decode: --plot-from needs --plot DIR");
    RETROINFER_CHECK(o->plot_dir.empty() || !o->plot_from.empty() || !o->out.empty(),
                     "bench decode: --plot charts the --out file (or the --plot-from files): give --out FILE");
    if (o->plot_from.empty()) {
      if (!o->query_trace.empty())
        o->query_schedule = std::make_shared<const ClusterTraceSchedule>(read_cluster_trace(o->query_trace));
      run_bench_decode(*o);
    }
    if (!o->plot_dir.empty()) {
      std::vector<std::string> args = {"decode", "--out", o->plot_dir, "--title", o->plot_title, "--jsonl"};
      for (const auto& f : o->plot_from.empty() ? std::vector<std::string>{o->out} : o->plot_from) args.push_back(f);
      run_chart_script(args);
    }
  });
}
RETROINFER_COMMAND(setup_bench_decode);

}  // namespace
}  // namespace retroinfer::cli
