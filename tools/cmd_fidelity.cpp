// `retroinfer fidelity`: attention-output error and mass recall of every decode-attention method against
// full attention on synthetic long-context data, at an equal exact-token budget (src/eval/fidelity.h).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "attention_cli.h"
#include "command.h"
#include "eval/fidelity.h"
#include "retroinfer/error.h"

namespace {

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t b = 0;
  while (b <= s.size()) {
    const size_t e = std::min(s.find(',', b), s.size());
    if (e > b) out.push_back(s.substr(b, e - b));
    b = e + 1;
  }
  return out;
}

// "8192", "32k", "128K" -> tokens (k = 1024).
int64_t parse_tokens(const std::string& s) {
  size_t pos = 0;
  long long v = 0;
  try {
    v = std::stoll(s, &pos);
  } catch (const std::exception&) {
    RETROINFER_FAIL("fidelity: bad context length '", s, "': expected a number such as 8192 or 32k");
  }
  const std::string rest = s.substr(pos);
  if (rest == "k" || rest == "K") v *= 1024;
  else RETROINFER_CHECK(rest.empty(), "fidelity: bad context length '", s, "': expected a number such as 8192 or 32k");
  return v;
}

struct Args {
  std::string contexts = "8192,32768,131072";
  std::string methods = "full,retro,quest,streaming,oracle";
  std::string dtype = "bf16";
  std::string json;
  std::string data;
  bool no_estimation_variant = false;
  retroinfer::cli::AttentionCliValues attention;  // over opt.attention
  retroinfer::eval::FidelityOptions opt;
};

void run(const Args& a) {
  retroinfer::eval::FidelityOptions o = a.opt;
  o.contexts.clear();
  for (const auto& c : split(a.contexts)) o.contexts.push_back(parse_tokens(c));
  o.methods = split(a.methods);
  o.dtype = retroinfer::parse_dtype(a.dtype);
  o.estimation_variant = !a.no_estimation_variant;
  retroinfer::cli::apply_attention_options(a.attention, o.attention);
  for (const auto& kv : split(a.data)) {
    const size_t eq = kv.find('=');
    RETROINFER_CHECK(eq != std::string::npos && eq > 0, "fidelity: bad --data item '", kv,
                     "': expected knob=value, e.g. needle_span=16");
    double v = 0.0;
    try {
      v = std::stod(kv.substr(eq + 1));
    } catch (const std::exception&) {
      RETROINFER_FAIL("fidelity: bad value in --data item '", kv, "': expected a number");
    }
    retroinfer::eval::set_synthetic_knob(o.synthetic, kv.substr(0, eq), v);
  }
  o.progress = [](std::string_view s) { std::fprintf(stderr, "[fidelity] %.*s\n", int(s.size()), s.data()); };
  std::unique_ptr<std::ofstream> js;
  if (!a.json.empty()) {  // open first: a bad path fails before minutes of work
    js = std::make_unique<std::ofstream>(a.json, std::ios::app);
    RETROINFER_CHECK(js->good(), "fidelity: cannot open --json file '", a.json, "' for appending");
  }
  const auto report = retroinfer::eval::run_fidelity(o);
  std::fputs(retroinfer::eval::format_fidelity(report).c_str(), stdout);
  if (js) {
    *js << retroinfer::eval::fidelity_json_lines(report);
    RETROINFER_CHECK(js->good(), "fidelity: writing '", a.json, "' failed");
  }
}

void setup_fidelity(CLI::App& app) {
  auto args = std::make_shared<Args>();
  auto* cmd = app.add_subcommand(
      "fidelity", "Attention-output error and mass recall of each attention method vs full attention on synthetic "
                  "long-context data, at an equal exact-token budget");
  cmd->add_option("--contexts", args->contexts, "Comma-separated prompt lengths (k = 1024)")->capture_default_str();
  cmd->add_option("--methods", args->methods, "Comma-separated: full, retro, quest, streaming, oracle, retro-noest")
      ->capture_default_str();
  cmd->add_option("--steps", args->opt.steps, "Decode steps per context")->capture_default_str();
  cmd->add_option("--heads-q", args->opt.num_heads_q, "Query heads of the layer")->capture_default_str();
  cmd->add_option("--heads-kv", args->opt.num_heads_kv, "KV heads of the layer")->capture_default_str();
  cmd->add_option("--head-dim", args->opt.head_dim, "Head dimension")->capture_default_str();
  cmd->add_option("--kv-heads-evaluated", args->opt.kv_heads_evaluated,
                  "KV heads generated and evaluated (each with its GQA query heads); the rest of the layer is "
                  "not simulated")
      ->capture_default_str();
  cmd->add_option("--seed", args->opt.seed, "Seed of the synthetic data")->capture_default_str();
  cmd->add_option("--dtype", args->dtype, "KV storage: f32 or bf16")->capture_default_str();
  retroinfer::cli::add_attention_options(cmd, args->attention);
  cmd->add_option("--data", args->data,
                  "Synthetic-data knobs to change, comma-separated knob=value (field names of SyntheticConfig in "
                  "src/eval/synthetic.h, e.g. needle_span=16,num_needles=0)");
  cmd->add_option("--json", args->json, "Append one JSON line per (context, method) to this file");
  cmd->add_flag("--no-estimation-variant", args->no_estimation_variant,
                "Do not add retro-noest (retro with the estimation zone off) next to retro");
  cmd->callback([args] { run(*args); });
}
RETROINFER_COMMAND(setup_fidelity);

}  // namespace
