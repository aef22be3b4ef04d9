// `retroinfer eval`: long-context accuracy of the decode-attention methods on the model runner of --device
// (cpu or cuda).
//   eval tasks   RULER-style synthetic tasks (src/eval/tasks.h), resumable JSON lines + markdown table
//   eval ppl     teacher-forced fidelity on real text (src/eval/ppl_fidelity.h)
//   eval report  the summary and table of an existing results file; --plot: PNG charts (plot_charts.h)
//   eval needle  where retro's zones put a needle's tokens against the oracle top-k (cpu; needle_probe.h)
//   eval inputs  the haystack, word list and ppl text as files (for a machine without bible-kjv/wamerican)
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unistd.h>

#include "command.h"
#include "eval/eval_report.h"
#include "eval/eval_runner.h"
#include "eval/needle_probe.h"
#include "eval/ppl_fidelity.h"
#include "eval/tasks.h"
#include "model_cli.h"
#include "plot_charts.h"
#include "retroinfer/error.h"

namespace retroinfer::cli {
namespace {

struct EvalCliOptions {
  ModelCliOptions model;
  std::string tasks = "all";
  std::vector<int64_t> contexts = {4096, 8192};
  int samples = 50;
  int first_sample = 0;
  std::vector<std::string> methods = {"full", "retro", "quest", "streaming", "oracle"};
  uint64_t seed = 42;
  std::vector<std::string> bible_ranges = {"Genesis1:1-50:26", "Exodus1:1-40:38"};
  std::string haystack_file, word_list = "/usr/share/dict/words";
  std::string results, summary_json, table_md, stats_json;
  double time_budget = 0.0;  // seconds, 0 = none
  std::string baseline_budget = "matched";  // quest / streaming / oracle: matched to retro's reads, or nominal
  std::vector<std::string> report_results;
  std::vector<std::string> report_ppl;  // eval report --ppl: eval ppl JSONs for the perplexity chart
  std::string plot_dir, plot_title;     // eval report --plot, --plot-title
  // ppl
  int64_t prefix = 2048;
  int forced = 64;
  int windows = 1;
  std::vector<std::string> ppl_ranges = {"Isaiah1:1-66:24"};
  std::string text_file, ppl_json;
  // needle
  std::string needle_task = "niah_single_3";
  int64_t needle_context = 2048;
  std::vector<int> needle_samples = {0, 1, 2};
  std::vector<std::string> needle_variants = {"c16", "c8"};
  int needle_max_steps = 40;
  std::string needle_json;
};

void progress(std::string_view s) {
  std::fprintf(stderr, "%.*s\n", static_cast<int>(s.size()), s.data());
  std::fflush(stderr);
}

std::string read_file(const std::string& path, const char* what) {
  std::ifstream f(path, std::ios::binary);
  RETROINFER_CHECK(f.good(), "eval: cannot read ", what, " '", path, "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary);
  RETROINFER_CHECK(f.good(), "eval: cannot write '", path, "'");
  f << text;
}

void write_report(const std::vector<std::string>& results, const std::string& json_path, const std::string& md_path) {
  // Several files (parallel jobs of scripts/run_accuracy.sh): a (task, context, index, method) present in
  // more than one (a rerun with another split) counts once.
  std::vector<nlohmann::json> lines;
  std::set<std::string> seen;
  for (const auto& r : results) {
    for (auto& j : eval::load_results(r)) {
      const std::string key = eval::result_key(j.at("task").get<std::string>(), j.at("context").get<int64_t>(),
                                               j.at("index").get<int>(), j.at("method").get<std::string>());
      if (seen.insert(key).second) lines.push_back(std::move(j));
    }
  }
  RETROINFER_CHECK(!lines.empty(), "eval report: no result lines in the results file(s)");
  const nlohmann::json summary = eval::summarize(lines);
  const std::string md = eval::markdown_table(summary);
  std::fputs(md.c_str(), stdout);
  if (!json_path.empty()) write_file(json_path, summary.dump(2) + "\n");
  if (!md_path.empty()) write_file(md_path, md);
}

// eval report: the summary and table of --results, and with --plot the charts of it and of --ppl.
void run_report(const EvalCliOptions& o) {
  RETROINFER_CHECK(!o.report_results.empty() || (!o.plot_dir.empty() && !o.report_ppl.empty()),
                   "eval report: give --results FILE (or --plot DIR with --ppl FILES)");
  RETROINFER_CHECK(o.report_ppl.empty() || !o.plot_dir.empty(), "eval report: --ppl is charted by --plot DIR");
  std::string summary = o.summary_json;
  std::filesystem::path scratch;  // the summary for the chart script when --summary is not given
  if (!o.report_results.empty()) {
    if (summary.empty() && !o.plot_dir.empty()) {
      scratch = std::filesystem::temp_directory_path() / ("retroinfer-eval-summary-" + std::to_string(::getpid()) + ".json");
      summary = scratch.string();
    }
    write_report(o.report_results, summary, o.table_md);
  }
  if (o.plot_dir.empty()) return;
  std::vector<std::string> args = {"eval", "--out", o.plot_dir, "--title", o.plot_title};
  if (!o.report_results.empty()) args.insert(args.end(), {"--summary", summary});
  if (!o.report_ppl.empty()) {
    args.push_back("--ppl");
    args.insert(args.end(), o.report_ppl.begin(), o.report_ppl.end());
  }
  try {
    run_chart_script(args);
  } catch (...) {
    if (!scratch.empty()) std::filesystem::remove(scratch);
    throw;
  }
  if (!scratch.empty()) std::filesystem::remove(scratch);
}

// The tasks' haystack (`bible` ranges or --haystack-file) and word list.
eval::TaskResources task_resources(const EvalCliOptions& o) {
  eval::TaskResources res;
  const std::string hay = o.haystack_file.empty() ? eval::load_bible_text(o.bible_ranges)
                                                  : read_file(o.haystack_file, "--haystack-file");
  res.essay_words = eval::split_words(hay);
  res.words = eval::load_word_list(o.word_list);
  return res;
}

void run_tasks(const EvalCliOptions& o) {
  eval::EvalOptions eo;
  eo.tasks = eval::parse_task_list(o.tasks);
  eo.contexts = o.contexts;
  eo.samples = o.samples;
  eo.first_sample = o.first_sample;
  eo.methods = o.methods;
  const SessionOptions so = make_session_options(o.model, AttentionKind::kFull);
  eo.attention = so.attention;
  eo.kv_dtype = so.kv_dtype;
  eo.prefill_chunk = so.prefill_chunk;
  eo.kv_placement = so.kv_placement;
  eo.results_path = o.results;
  eo.progress = progress;
  eo.time_budget_s = o.time_budget;
  eo.baseline_budget = eval::parse_baseline_budget(o.baseline_budget);
  eval::validate(eo);
  cli_device(o.model);  // fail on an unusable device before reading the haystack and the model

  eval::TaskResources res = task_resources(o);
  LoadedModel m = load_model(o.model);
  eo.attention = make_session_options(o.model, AttentionKind::kFull, m.model->config().head_dim).attention;
  progress("eval: model " + m.model->path() + " loaded in " + std::to_string(m.load_seconds) + " s on " +
           m.engine->description() + "; haystack " + std::to_string(res.essay_words.size()) + " words, word list " +
           std::to_string(res.words.size()) + " words; " + std::to_string(num_threads()) + " threads");
  eval::TaskOptions to;
  to.seed = o.seed;
  const eval::TaskGenerator gen(std::move(res), eval::token_counter(*m.tokenizer),
                                eval::chat_prompt_wrapper(*m.tokenizer), to);
  eval::EvalRunStats st;
  const int64_t n = eval::run_eval(*m.engine, *m.tokenizer, gen, eo, &st);
  progress("eval: " + std::to_string(n) + " result lines written to " + o.results + " (" +
           std::to_string(st.samples_run) + " samples run, " + std::to_string(st.samples_skipped) +
           " already done, " + std::to_string(st.samples_left) + " not started" +
           (st.budget_spent ? ": time budget spent)" : ")"));
  if (!o.stats_json.empty()) {
    const nlohmann::json j = {{"device", std::string(device_name(m.engine->device()))},
                              {"device_description", m.engine->description()},
                              {"results", o.results},
                              {"first_sample", o.first_sample},
                              {"samples", o.samples},
                              {"contexts", o.contexts},
                              {"lines_written", st.lines_written},
                              {"samples_run", st.samples_run},
                              {"samples_skipped", st.samples_skipped},
                              {"samples_left", st.samples_left},
                              {"budget_spent", st.budget_spent},
                              {"time_budget_s", o.time_budget},
                              {"seconds", st.seconds},
                              {"load_s", m.load_seconds}};
    write_file(o.stats_json, j.dump(2) + "\n");
  }
  write_report({o.results}, o.summary_json, o.table_md);
}

void run_ppl(const EvalCliOptions& o) {
  eval::PplOptions po;
  po.prefix_tokens = o.prefix;
  po.forced_tokens = o.forced;
  po.windows = o.windows;
  po.methods = o.methods;
  const SessionOptions so = make_session_options(o.model, AttentionKind::kFull);
  po.attention = so.attention;
  po.kv_dtype = so.kv_dtype;
  po.prefill_chunk = so.prefill_chunk;
  po.kv_placement = so.kv_placement;
  po.progress = progress;
  po.time_budget_s = o.time_budget;
  po.baseline_budget = eval::parse_baseline_budget(o.baseline_budget);
  eval::validate(po);
  cli_device(o.model);
  const std::string text = o.text_file.empty() ? eval::load_bible_text(o.ppl_ranges) : read_file(o.text_file, "--text-file");
  LoadedModel m = load_model(o.model);
  po.attention = make_session_options(o.model, AttentionKind::kFull, m.model->config().head_dim).attention;
  std::vector<int32_t> ids = m.tokenizer->encode(text, false, false);
  progress("eval ppl: text of " + std::to_string(ids.size()) + " tokens; " + m.engine->description());
  const eval::PplReport r = eval::run_ppl_fidelity(*m.engine, ids, po);
  std::fputs(eval::markdown_table(r).c_str(), stdout);
  if (!o.ppl_json.empty()) write_file(o.ppl_json, eval::to_json(r).dump(2) + "\n");
}

void run_needle(const EvalCliOptions& o) {
  const SessionOptions so = make_session_options(o.model, AttentionKind::kRetro);
  RETROINFER_CHECK(cli_device(o.model) == Device::kCpu, "eval needle: CPU runner only (it reads every layer's ",
                   "KV cache); drop --device");
  eval::NeedleProbeOptions no;
  no.task = o.needle_task;
  no.context = o.needle_context;
  no.samples = o.needle_samples;
  no.attention = so.attention;
  no.variants = o.needle_variants;
  no.kv_dtype = so.kv_dtype;
  no.prefill_chunk = so.prefill_chunk;
  no.max_steps = o.needle_max_steps;
  no.progress = progress;
  eval::TaskResources res = task_resources(o);
  LoadedModel m = load_model(o.model);
  no.attention = make_session_options(o.model, AttentionKind::kRetro, m.model->config().head_dim).attention;
  eval::TaskOptions to;
  to.seed = o.seed;
  const eval::TaskGenerator gen(std::move(res), eval::token_counter(*m.tokenizer),
                                eval::chat_prompt_wrapper(*m.tokenizer), to);
  const nlohmann::json j = eval::run_needle_probe(*m.model, *m.tokenizer, gen, no);
  const std::string text = j.dump(2) + "\n";
  if (o.needle_json.empty()) std::fputs(text.c_str(), stdout);
  else write_file(o.needle_json, text);
}

// The texts `eval tasks` and `eval ppl` read by default, as files that --haystack-file, --word-list and
// --text-file take back unchanged (so the prompts, and their hashes, are the same as with the defaults).
void write_inputs(const EvalCliOptions& o, const std::string& dir, const std::vector<std::string>& ppl_ranges) {
  std::filesystem::create_directories(dir);
  const std::string hay = eval::load_bible_text(o.bible_ranges);
  write_file(dir + "/haystack.txt", hay);
  std::string words;
  for (const auto& w : eval::load_word_list(o.word_list)) words += w + "\n";
  write_file(dir + "/words.txt", words);
  const std::string ppl = eval::load_bible_text(ppl_ranges);
  write_file(dir + "/ppl_text.txt", ppl);
  progress("eval inputs: " + dir + "/haystack.txt (" + std::to_string(hay.size()) + " bytes), words.txt (" +
           std::to_string(words.size()) + " bytes), ppl_text.txt (" + std::to_string(ppl.size()) + " bytes)");
}

void add_common(CLI::App* cmd, EvalCliOptions& o) {
  add_model_options(cmd, o.model);
  cmd->add_option("--methods", o.methods,
                  "Attention methods: full retro quest streaming oracle retro-noest, each optionally with overrides of "
                  "attention fields, e.g. retro:retrieval_fraction=0.036:window_tokens=128, or of the KV cache's storage, "
                  "e.g. full:kv_dtype=fp8 (its own prefill; the reference stays full at --kv-dtype)")
      ->delimiter(',')->capture_default_str();
  cmd->add_option("--baseline-budget", o.baseline_budget,
                  "quest / streaming / oracle exact tokens: matched (as many as retro read on the same input) or "
                  "nominal (round(retrieval fraction x indexed tokens), or --budget-tokens)")
      ->check(CLI::IsMember({"matched", "nominal"}))
      ->capture_default_str();
}

void setup_eval(CLI::App& app) {
  auto o = std::make_shared<EvalCliOptions>();
  auto* eval_cmd = app.add_subcommand("eval", "Long-context accuracy of the attention methods (--device cpu|cuda)");
  eval_cmd->require_subcommand(1);

  auto* t = eval_cmd->add_subcommand("tasks", "RULER-style synthetic tasks; resumable JSON lines + markdown table");
  add_common(t, *o);
  t->add_option("--tasks", o->tasks, "Comma-separated task names or 'all'")->capture_default_str();
  t->add_option("--contexts", o->contexts, "Target prompt lengths in tokens")->delimiter(',')->capture_default_str();
  t->add_option("--samples", o->samples, "Samples per task and length")->capture_default_str();
  t->add_option("--first-sample", o->first_sample, "First sample index")->capture_default_str();
  t->add_option("--seed", o->seed, "Task generator seed")->capture_default_str();
  t->add_option("--bible", o->bible_ranges, "Essay haystack: `bible` ranges (bible-kjv)")->capture_default_str();
  t->add_option("--haystack-file", o->haystack_file, "Essay haystack from a text file instead of `bible`");
  t->add_option("--word-list", o->word_list, "Word list for keys and values")->capture_default_str();
  t->add_option("--results", o->results, "Results file (JSON lines; appended, resumed)")->required();
  t->add_option("--summary", o->summary_json, "Write the summary JSON here");
  t->add_option("--table", o->table_md, "Write the markdown table here");
  t->add_option("--time-budget", o->time_budget,
                "Seconds: start no sample that would end past this (0 = none); rerun to continue")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  t->add_option("--stats", o->stats_json, "Write this run's counts (samples run / left, budget spent) as JSON here");
  t->callback([o] { run_tasks(*o); });

  auto* p = eval_cmd->add_subcommand("ppl", "Teacher-forced perplexity / KL / top-1 / attention error vs full");
  add_common(p, *o);
  p->add_option("--prefix", o->prefix, "Prefix tokens P (prefilled once)")->capture_default_str();
  p->add_option("--forced", o->forced, "Forced tokens T (decoded one by one)")->capture_default_str();
  p->add_option("--windows", o->windows, "Text windows of P + T + 1 tokens")->capture_default_str();
  p->add_option("--bible", o->ppl_ranges, "Text: `bible` ranges (bible-kjv)")->capture_default_str();
  p->add_option("--text-file", o->text_file, "Text from a file instead of `bible`");
  p->add_option("--json", o->ppl_json, "Write the report JSON here");
  p->add_option("--time-budget", o->time_budget, "Seconds: start no window that would end past this (0 = none)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  p->callback([o] { run_ppl(*o); });

  auto* nd = eval_cmd->add_subcommand("needle", "Where retro's zones put a needle's tokens vs the oracle top-k (cpu)");
  add_model_options(nd, o->model);
  nd->add_option("--task", o->needle_task, "A niah task")->capture_default_str();
  nd->add_option("--context", o->needle_context, "Target prompt tokens")->capture_default_str();
  nd->add_option("--sample", o->needle_samples, "Sample indices")->delimiter(',')->capture_default_str();
  nd->add_option("--variants", o->needle_variants,
                 "retro variants, ':'-joined items c<tokens per cluster> r<retrieval> e<estimation> noest i<iters> "
                 "g<global iters> o<outliers>, e.g. c16,c8,c16:r0.036")
      ->delimiter(',')->capture_default_str();
  nd->add_option("--max-steps", o->needle_max_steps, "Cap on full's greedy answer")->capture_default_str();
  nd->add_option("--seed", o->seed, "Task generator seed")->capture_default_str();
  nd->add_option("--bible", o->bible_ranges, "Essay haystack: `bible` ranges (bible-kjv)")->capture_default_str();
  nd->add_option("--haystack-file", o->haystack_file, "Essay haystack from a text file instead of `bible`");
  nd->add_option("--word-list", o->word_list, "Word list for keys and values")->capture_default_str();
  nd->add_option("--json", o->needle_json, "Write the JSON here (else stdout)");
  nd->callback([o] { run_needle(*o); });

  auto* in = eval_cmd->add_subcommand("inputs", "Write the default haystack, word list and ppl text to files");
  auto inputs_dir = std::make_shared<std::string>();
  in->add_option("--out", *inputs_dir, "Folder for haystack.txt, words.txt, ppl_text.txt")->required();
  in->add_option("--bible", o->bible_ranges, "Haystack: `bible` ranges")->capture_default_str();
  // scripts/run_accuracy.sh's ppl text: Isaiah + Jeremiah (not used as a haystack).
  auto ppl_ranges = std::make_shared<std::vector<std::string>>(
      std::vector<std::string>{"Isaiah1:1-66:24", "Jeremiah1:1-52:34"});
  in->add_option("--ppl-bible", *ppl_ranges, "ppl text: `bible` ranges")->capture_default_str();
  in->add_option("--word-list", o->word_list, "Word list to filter")->capture_default_str();
  in->callback([o, inputs_dir, ppl_ranges] { write_inputs(*o, *inputs_dir, *ppl_ranges); });

  auto* r = eval_cmd->add_subcommand("report", "Summary and markdown table of a results file; --plot: PNG charts");
  r->add_option("--results", o->report_results, "Results files (JSON lines)");
  r->add_option("--summary", o->summary_json, "Write the summary JSON here");
  r->add_option("--table", o->table_md, "Write the markdown table here");
  r->add_option("--ppl", o->report_ppl, "With --plot: `eval ppl --json` reports (one per prefix length) to chart");
  r->add_option("--plot", o->plot_dir,
                "Write PNG charts to this folder: task score against context per method (--results), perplexity "
                "change against context (--ppl); python3 + matplotlib (docs/install.md#charts)");
  r->add_option("--plot-title", o->plot_title, "With --plot: the charts' title (e.g. the model)");
  r->callback([o] { run_report(*o); });
}
RETROINFER_COMMAND(setup_eval);

}  // namespace
}  // namespace retroinfer::cli
