#include "eval/eval_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>

#include "engine/kv_placement_json.h"
#include "eval/scoring.h"
#include "retroinfer/attention_params.h"
#include "retroinfer/error.h"
#include "retroinfer/sampler.h"
#include "retroinfer/text_generate.h"

namespace retroinfer::eval {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string hex_hash(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// Greedy decode on a forked session; `first` is the token the shared prefill logits chose.
SampleOutcome decode_answer(SequenceSession& s, const Tokenizer& tok, int32_t first, int max_new,
                            const std::vector<int32_t>& eos) {
  SampleOutcome o;
  const ModelConfig& c = s.model_config();
  std::vector<float> logits(c.vocab_size);
  std::vector<int32_t> out;
  int64_t exact = 0, context = 0;
  int32_t t = first;
  for (int i = 0;; ++i) {
    if (std::find(eos.begin(), eos.end(), t) != eos.end()) break;
    out.push_back(t);
    if (i + 1 >= max_new || s.position() >= s.max_context()) break;  // budget spent or context full
    s.decode(t, logits);
    ++o.decode_steps;
    exact += s.last_stats().exact_tokens;
    context += s.last_stats().context_tokens;
    t = argmax(logits);
  }
  o.generated_tokens = static_cast<int64_t>(out.size());
  // A model's vocabulary may be padded beyond the tokenizer's (e.g. Qwen2: 151936 rows, 151665 tokens);
  // such ids have no text.
  std::vector<int32_t> text_ids;
  for (int32_t id : out)
    if (id < tok.vocab_size()) text_ids.push_back(id);
  o.output = tok.decode(text_ids, /*skip_special=*/true);
  const double heads = static_cast<double>(o.decode_steps) * c.num_layers * c.num_heads_kv;
  o.exact_tokens_per_head = heads > 0 ? exact / heads : 0.0;
  o.context_tokens_per_head = heads > 0 ? context / heads : 0.0;
  return o;
}

// Time a sample at `ctx` tokens is expected to take, from the slowest sample seen so far at that length;
// none seen yet: the slowest at another length scaled linearly by the length (prefill grows faster than
// linearly, but at these lengths the answer decode and the task generation dominate), else 0.
double expected_sample_s(const std::map<int64_t, double>& slowest, int64_t ctx) {
  const auto it = slowest.find(ctx);
  if (it != slowest.end()) return it->second;
  double e = 0;
  for (const auto& [c, s] : slowest) e = std::max(e, s * static_cast<double>(ctx) / static_cast<double>(c));
  return e;
}

}  // namespace

constexpr std::string_view kKvDtypeField = "kv_dtype";

std::string_view method_base_name(std::string_view method) { return method.substr(0, method.find(':')); }

namespace {
// Calls f(field, value) for each override ":field=value" of the method, in order; throws Error for an item
// that is not field=value.
template <typename F>
void each_override(std::string_view method, F&& f) {
  for (size_t at = method_base_name(method).size(); at < method.size();) {
    const size_t next = std::min(method.find(':', at + 1), method.size());
    const std::string_view item = method.substr(at + 1, next - at - 1);
    const size_t eq = item.find('=');
    RETROINFER_CHECK(eq != std::string_view::npos && eq > 0, "eval: method '", method, "': '", item,
                     "' is not field=value (e.g. retro:retrieval_fraction=0.036)");
    f(item.substr(0, eq), item.substr(eq + 1));
    at = next;
  }
}
}  // namespace

AttentionConfig method_config(std::string_view method, const AttentionConfig& base) {
  AttentionConfig c = base;
  const std::string_view name = method_base_name(method);
  if (name == "retro-noest") {
    c.kind = AttentionKind::kRetro;
    c.estimation = false;
  } else {
    c.kind = parse_attention_kind(name);
  }
  // Overrides "name:field=value:field=value", applied in order over the base (and the -noest setting).
  each_override(method, [&](std::string_view field, std::string_view value) {
    if (field == kKvDtypeField) return;  // the KV storage, method_kv_dtype's
    const AttentionParam* p = find_attention_param(field);
    RETROINFER_CHECK(p != nullptr, "eval: method '", method, "': unknown attention parameter '", field,
                     "' (the AttentionConfig field names: retrieval_fraction, estimation_fraction, window_tokens, ...)");
    set_attention_param(c, *p, value);
  });
  return c;
}

DType method_kv_dtype(std::string_view method, DType base) {
  DType dt = base;
  each_override(method, [&](std::string_view field, std::string_view value) {
    if (field != kKvDtypeField) return;
    dt = parse_dtype(value);
    RETROINFER_CHECK(dt != DType::kF16, "eval: method '", method,
                     "': the KV cache stores f32, bf16, int8 or fp8, not f16");
  });
  return dt;
}

BaselineBudget parse_baseline_budget(std::string_view s) {
  if (s == "nominal") return BaselineBudget::kNominal;
  if (s == "matched") return BaselineBudget::kMatched;
  RETROINFER_FAIL("eval: unknown baseline budget '", s, "': expected matched or nominal");
}

std::string_view baseline_budget_name(BaselineBudget b) {
  return b == BaselineBudget::kMatched ? "matched" : "nominal";
}

bool budgeted_baseline(std::string_view method) {
  const std::string_view m = method_base_name(method);
  return m == "quest" || m == "streaming" || m == "oracle";
}

int64_t matched_budget_tokens(double retro_exact_per_head, const AttentionConfig& c) {
  RETROINFER_CHECK(std::isfinite(retro_exact_per_head) && retro_exact_per_head >= 0.0,
                   "eval: retro's exact-token count must be finite and >= 0 to match the baselines' budget, got ",
                   retro_exact_per_head);
  const int64_t steady = int64_t{c.sink_tokens} + c.window_tokens;
  return std::max<int64_t>(0, std::llround(retro_exact_per_head) - steady);
}

void validate_baseline_budget(BaselineBudget b, const std::vector<std::string>& methods, const AttentionConfig& c,
                              std::string_view who) {
  if (b != BaselineBudget::kMatched) return;
  const bool baselines =
      std::any_of(methods.begin(), methods.end(), [](const std::string& m) { return budgeted_baseline(m); });
  RETROINFER_CHECK(!baselines || std::find(methods.begin(), methods.end(), "retro") != methods.end(), who,
                   ": --baseline-budget matched gives quest / streaming / oracle retro's measured exact-token "
                   "count, so retro must be among the methods; add it or use --baseline-budget nominal");
  RETROINFER_CHECK(c.budget_tokens < 0, who,
                   ": --budget-tokens and --baseline-budget matched contradict each other; use "
                   "--baseline-budget nominal with an explicit budget");
}

std::vector<std::string> matched_order(const std::vector<std::string>& methods) {
  std::vector<std::string> out;
  for (const char* first : {"full", "retro"})
    if (std::find(methods.begin(), methods.end(), first) != methods.end()) out.emplace_back(first);
  for (const auto& m : methods)
    if (std::find(out.begin(), out.end(), m) == out.end()) out.push_back(m);
  return out;
}

void validate(const EvalOptions& o) {
  RETROINFER_CHECK(!o.tasks.empty(), "eval: no tasks");
  RETROINFER_CHECK(!o.contexts.empty(), "eval: no context lengths");
  for (int64_t c : o.contexts) RETROINFER_CHECK(c >= 256, "eval: context length ", c, " is too small (>= 256)");
  RETROINFER_CHECK(o.samples >= 1, "eval: samples must be >= 1, got ", o.samples);
  RETROINFER_CHECK(o.first_sample >= 0, "eval: first sample must be >= 0");
  RETROINFER_CHECK(!o.methods.empty(), "eval: no attention methods");
  for (const auto& m : o.methods) {
    validate(method_config(m, o.attention));
    method_kv_dtype(m, o.kv_dtype);
  }
  validate_baseline_budget(o.baseline_budget, o.methods, o.attention, "eval");
  RETROINFER_CHECK(!o.results_path.empty(), "eval: a results file (JSON lines) is required");
  RETROINFER_CHECK(o.time_budget_s >= 0, "eval: the time budget must be >= 0 seconds (0 = none), got ",
                   o.time_budget_s);
}

std::string result_key(std::string_view task, int64_t context, int index, std::string_view method) {
  std::ostringstream os;
  os << task << '|' << context << '|' << index << '|' << method;
  return os.str();
}

std::vector<nlohmann::json> load_results(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream f(path, std::ios::binary);
  if (!f.good()) return out;
  std::vector<std::string> lines;
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) lines.push_back(line);
  const bool ends_with_newline = [&] {
    std::ifstream g(path, std::ios::binary | std::ios::ate);
    const auto size = static_cast<std::streamoff>(g.tellg());
    if (size <= 0) return true;
    g.seekg(size - 1);
    return g.get() == '\n';
  }();
  for (size_t i = 0; i < lines.size(); ++i) {
    nlohmann::json j = nlohmann::json::parse(lines[i], nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      if (i + 1 == lines.size() && !ends_with_newline) break;  // interrupted mid-write: redo that sample
      RETROINFER_FAIL("eval: line ", i + 1, " of the results file '", path,
                      "' is not valid JSON; fix or delete that line to resume");
    }
    RETROINFER_CHECK(j.contains("task") && j.contains("context") && j.contains("index") && j.contains("method"),
                     "eval: line ", i + 1, " of '", path, "' lacks task/context/index/method");
    out.push_back(std::move(j));
  }
  return out;
}

std::set<std::string> result_keys(const std::vector<nlohmann::json>& lines) {
  std::set<std::string> k;
  for (const auto& j : lines)
    k.insert(result_key(j.at("task").get<std::string>(), j.at("context").get<int64_t>(), j.at("index").get<int>(),
                        j.at("method").get<std::string>()));
  return k;
}

nlohmann::json result_line(const TaskSample& s, std::string_view method, const SampleOutcome& o, double prefill_s) {
  return {{"task", s.task},
          {"context", s.target_tokens},
          {"index", s.index},
          {"method", std::string(method)},
          {"depth", s.depth},
          {"prompt_tokens", s.prompt_tokens},
          {"prompt_hash", hex_hash(s.prompt)},
          {"references", s.references},
          {"output", o.output},
          {"score_all", string_match_all(o.output, s.references)},
          {"score_part", string_match_part(o.output, s.references)},
          {"generated_tokens", o.generated_tokens},
          {"exact_tokens_per_head", o.exact_tokens_per_head},
          {"context_tokens_per_head", o.context_tokens_per_head},
          {"prefill_s", prefill_s},
          {"method_s", o.seconds}};
}

PromptWrapper chat_prompt_wrapper(const Tokenizer& tok) {
  if (tok.chat_format() == ChatFormat::kNone) {
    return [](std::string_view user, std::string_view prefix) {
      return std::string(user) + "\n\n" + std::string(prefix);
    };
  }
  return [&tok](std::string_view user, std::string_view prefix) {
    const std::vector<ChatMessage> msgs{{"user", std::string(user)}};
    return tok.apply_chat_template(msgs, true) + std::string(prefix);
  };
}

TokenCounter token_counter(const Tokenizer& tok) {
  return [&tok](std::string_view p) { return static_cast<int64_t>(tok.encode(p, false, true).size()); };
}

namespace {

// What a results file already holds: the lines done, each sample's prompt hash and retro's exact-token count
// (the matched baselines' budget). Checks the file was made on this device and cuts off a truncated last line
// left by an interrupted run.
struct ResumeState {
  std::set<std::string> done;                      // result keys (task|context|index|method) already written
  std::map<std::string, std::string> old_hash;     // task|context|index -> prompt hash
  std::map<std::string, double> old_retro_exact;   // task|context|index -> retro's exact tokens per head
};

ResumeState load_resume_state(const EvalOptions& opt, const std::string& device,
                              const std::function<void(const std::string&)>& say) {
  const std::vector<nlohmann::json> old = load_results(opt.results_path);
  ResumeState rs;
  rs.done = result_keys(old);
  for (size_t i = 0; i < old.size(); ++i) {
    const nlohmann::json& j = old[i];
    if (j.at("method") == "retro" && j.contains("exact_tokens_per_head"))
      rs.old_retro_exact[result_key(j.at("task").get<std::string>(), j.at("context").get<int64_t>(),
                                 j.at("index").get<int>(), "")] = j.at("exact_tokens_per_head").get<double>();
    if (j.contains("prompt_hash"))
      rs.old_hash[result_key(j.at("task").get<std::string>(), j.at("context").get<int64_t>(), j.at("index").get<int>(), "")] =
          j.at("prompt_hash").get<std::string>();
    // Lines written before the device field existed came from the CPU runner.
    const std::string d = j.contains("device") ? j.at("device").get<std::string>() : "cpu";
    RETROINFER_CHECK(d == device, "eval: line ", i + 1, " of '", opt.results_path, "' was made on device ", d,
                     ", this run uses ", device, "; use a new results file for each device");
  }
  if (!old.empty()) say("resuming: " + std::to_string(old.size()) + " result lines already in " + opt.results_path);
  // A truncated last line from an interrupted run (load_results skipped it): cut it off so that the file
  // stays one JSON object per line.
  {
    std::ifstream g(opt.results_path, std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(g)), std::istreambuf_iterator<char>());
    if (!text.empty() && text.back() != '\n') {
      const size_t keep = text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1;
      g.close();
      std::filesystem::resize_file(opt.results_path, keep);
      say("dropped an incomplete last line of " + opt.results_path + " (interrupted write)");
    }
  }
  return rs;
}

}  // namespace

int64_t run_eval(const EngineModel& model, const Tokenizer& tok, const TaskGenerator& gen, const EvalOptions& opt,
                 EvalRunStats* stats) {
  validate(opt);
  const auto t_run = std::chrono::steady_clock::now();
  const auto say = [&](const std::string& s) {
    if (opt.progress) opt.progress(s);
  };
  const std::string device(device_name(model.device()));
  ResumeState rs = load_resume_state(opt, device, say);
  std::set<std::string>& done = rs.done;
  const bool matched = opt.baseline_budget == BaselineBudget::kMatched;
  const std::vector<std::string> methods = matched ? matched_order(opt.methods) : opt.methods;
  std::ofstream out(opt.results_path, std::ios::app | std::ios::binary);
  RETROINFER_CHECK(out.good(), "eval: cannot append to '", opt.results_path, "'");
  const std::vector<int32_t> eos = end_of_generation_ids(model.config(), &tok);
  const int64_t total = static_cast<int64_t>(opt.contexts.size() * opt.tasks.size()) * opt.samples;
  EvalRunStats st;
  int64_t visited = 0;
  std::map<int64_t, double> slowest;  // context -> the longest sample (generation + prefill + methods), s
  for (int i = opt.first_sample; i < opt.first_sample + opt.samples; ++i) {
    for (int64_t ctx : opt.contexts) {
      for (const auto& task : opt.tasks) {
        ++visited;
        std::vector<std::string> todo;
        for (const auto& m : methods)
          if (!done.count(result_key(task, ctx, i, m))) todo.push_back(m);
        if (todo.empty()) {
          ++st.samples_skipped;
          continue;
        }
        if (opt.time_budget_s > 0 && !st.budget_spent &&
            seconds_since(t_run) + expected_sample_s(slowest, ctx) > opt.time_budget_s)
          st.budget_spent = true;
        if (st.budget_spent) {
          ++st.samples_left;
          continue;
        }
        const auto t_sample = std::chrono::steady_clock::now();
        const TaskSample s = gen.make(task, ctx, i);
        const auto h = rs.old_hash.find(result_key(task, ctx, i, ""));
        RETROINFER_CHECK(h == rs.old_hash.end() || h->second == hex_hash(s.prompt), "eval: sample ", task, " ", ctx,
                         " #", i, " differs from the one in '", opt.results_path,
                         "' (another seed, tokenizer or version?); use a new results file");
        const std::vector<int32_t> ids = tok.encode(s.prompt, false, true);
        const double gen_s = seconds_since(t_sample);  // task generation (tokenizer counts) + encoding
        SessionOptions so;
        so.attention = method_config("full", opt.attention);
        so.kv_dtype = opt.kv_dtype;
        so.prefill_chunk = opt.prefill_chunk;
        so.exact_attention_stats = true;  // the reports' exact-token column and the matched budgets
        // The answer may not fit beyond a prompt near the model's limit (8K prompts of an 8K model): the
        // session holds at most the model's positions and decode_answer stops when it is full.
        const int64_t wanted = static_cast<int64_t>(ids.size()) + s.max_new_tokens;
        const int64_t model_limit = model_max_context(model.config());
        so.max_context = model_limit > 0 ? std::min(wanted, model_limit) : wanted;
        so.kv_placement = method_kv_placement(opt.kv_placement, AttentionKind::kFull);
        // The shared prefill (full attention, every layer on the GPU or the CPU), made when the first method
        // that forks it needs it: retro with a host or split placement prefills its own session instead.
        std::unique_ptr<SequenceSession> base;
        double prefill_s = 0.0;
        int32_t first = -1;
        const auto timed_prefill = [&](SequenceSession& session, double& seconds) {
          const auto t0 = std::chrono::steady_clock::now();
          const int32_t next = argmax(session.prefill(ids));
          seconds = seconds_since(t0);
          return next;
        };
        std::string line_scores;
        // Matched budgets: retro's exact-token count on this sample (run just before, or resumed).
        const auto old_retro = rs.old_retro_exact.find(result_key(task, ctx, i, ""));
        double retro_exact = old_retro != rs.old_retro_exact.end() ? old_retro->second : -1.0;
        for (const auto& m : todo) {
          const auto t1 = std::chrono::steady_clock::now();
          AttentionConfig cfg = method_config(m, opt.attention);
          if (matched && budgeted_baseline(m)) {
            RETROINFER_CHECK(retro_exact >= 0.0, "eval: no retro result for ", task, " ", ctx, " #", i,
                             " to match the baselines' budget to (resumed file without retro lines?)");
            cfg.budget_tokens = matched_budget_tokens(retro_exact, cfg);
          }
          const DType kv_dtype = method_kv_dtype(m, opt.kv_dtype);
          std::unique_ptr<SequenceSession> f;
          int32_t f_first = first;
          double f_prefill_s = prefill_s;
          if (prefills_alone(opt.kv_placement, cfg.kind) || kv_dtype != opt.kv_dtype) {
            // Its own prefill: a host-tier session cannot fork the GPU prefill, nor a KV cache of another dtype.
            SessionOptions own = so;
            own.attention = cfg;
            own.kv_dtype = kv_dtype;
            own.kv_placement = method_kv_placement(opt.kv_placement, cfg.kind);
            f = make_session(model, own);
            f_first = timed_prefill(*f, f_prefill_s);
          } else {
            if (!base) {
              base = make_session(model, so);
              first = f_first = timed_prefill(*base, prefill_s);
              f_prefill_s = prefill_s;
            }
            f = base->fork_session(cfg);
          }
          SampleOutcome o = decode_answer(*f, tok, f_first, s.max_new_tokens, eos);
          const std::optional<KvPlacementReport> placement = f->kv_placement_report();
          if (m == "retro") retro_exact = o.exact_tokens_per_head;
          f.reset();  // the fork's memory (a copy of the prompt's KV) is freed before the next method
          o.seconds = seconds_since(t1);
          nlohmann::json j = result_line(s, m, o, f_prefill_s);
          add_kv_placement_json(j, placement);
          j["device"] = device;
          j["kv_dtype"] = std::string(dtype_name(kv_dtype));
          j["gen_s"] = gen_s;
          if (budgeted_baseline(m)) {
            j["budget_mode"] = std::string(baseline_budget_name(opt.baseline_budget));
            if (cfg.budget_tokens >= 0) j["budget_tokens"] = cfg.budget_tokens;
          }
          out << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';  // partial UTF-8 -> U+FFFD
          out.flush();
          RETROINFER_CHECK(out.good(), "eval: writing '", opt.results_path, "' failed");
          done.insert(result_key(task, ctx, i, m));
          ++st.lines_written;
          char buf[96];
          std::snprintf(buf, sizeof buf, " %s=%.0f", m.c_str(), 100.0 * j.at("score_all").get<double>());
          line_scores += buf;
        }
        ++st.samples_run;
        const double sample_s = seconds_since(t_sample);
        slowest[ctx] = std::max(slowest.count(ctx) ? slowest[ctx] : 0.0, sample_s);
        const double elapsed = seconds_since(t_run);
        // Estimated time left: the mean time of the samples run so far times the samples still to visit
        // (some of those may turn out to be done already: an upper estimate on a resumed run).
        const double eta = elapsed / static_cast<double>(st.samples_run) * static_cast<double>(total - visited);
        char head[320];
        std::snprintf(head, sizeof head,
                      "[%lld/%lld %.0fs, eta %.0fs] %s ctx %lld #%d (%lld tok, depth %.2f): sample %.2fs (generate "
                      "%.2fs, prefill %.2fs) |",
                      static_cast<long long>(visited), static_cast<long long>(total), elapsed, eta, task.c_str(),
                      static_cast<long long>(ctx), i, static_cast<long long>(ids.size()), s.depth, sample_s, gen_s,
                      prefill_s);
        say(head + line_scores);
      }
    }
  }
  st.seconds = seconds_since(t_run);
  if (st.budget_spent) {
    char buf[256];
    std::snprintf(buf, sizeof buf,
                  "eval: time budget of %.0f s spent after %.0f s: %lld samples run, %lld not started (rerun with "
                  "the same results file to continue)",
                  opt.time_budget_s, st.seconds, static_cast<long long>(st.samples_run),
                  static_cast<long long>(st.samples_left));
    say(buf);
  }
  if (stats) *stats = st;
  return st.lines_written;
}

int64_t run_eval(const Model& model, const Tokenizer& tok, const TaskGenerator& gen, const EvalOptions& opt,
                 EvalRunStats* stats) {
  const EngineModel cpu(model);
  return run_eval(cpu, tok, gen, opt, stats);
}

}  // namespace retroinfer::eval
