// `retroinfer bench serve`: a load generator against a running OpenAI-compatible server (this one or any
// other). It runs scripts/bench_serve.py (Python's standard library: one thread per client with blocking
// sockets, simple and enough for hundreds of clients; matplotlib for --plot) with the arguments as given;
// `retroinfer bench serve --help` lists them. See docs/server.md.
#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include "command.h"
#include "retroinfer/error.h"

namespace retroinfer::cli {
namespace {

[[noreturn]] void run_bench_serve(const std::vector<std::string>& args) {
  const std::string script = RETROINFER_BENCH_SERVE_SCRIPT;
  RETROINFER_CHECK(std::filesystem::exists(script), "bench serve: the load generator '", script,
                   "' is missing; run it from a source checkout (scripts/bench_serve.py)");
  std::vector<std::string> argv_s = {"python3", script};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& s : argv_s) argv.push_back(s.data());
  argv.push_back(nullptr);
  execvp("python3", argv.data());
  throw Error("bench serve: cannot run python3: " + std::string(std::strerror(errno)) +
              "; install python3 (scripts/setup.sh)");
}

void setup_bench_serve(CLI::App& app) {
  auto* cmd = bench_command(app)->add_subcommand(
      "serve", "Load generator for an OpenAI-compatible server: throughput, TTFT and inter-token latency "
               "percentiles (scripts/bench_serve.py; --help lists its options)");
  // Every argument, --help included, belongs to the script.
  cmd->set_help_flag();
  cmd->allow_extras();
  cmd->prefix_command();
  cmd->callback([cmd] { run_bench_serve(cmd->remaining()); });
}
RETROINFER_COMMAND(setup_bench_serve);

}  // namespace
}  // namespace retroinfer::cli
