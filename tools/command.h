// Subcommand registry of the `retroinfer` CLI: each cmd_*.cpp registers itself with
// RETROINFER_COMMAND(function), where function(CLI::App& app) adds one subcommand to app.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace retroinfer::cli {

using CommandSetup = std::function<void(CLI::App&)>;
std::vector<CommandSetup>& command_registry();
inline int register_command(CommandSetup f) {
  command_registry().push_back(std::move(f));
  return 0;
}
// The `bench` group (created by whichever cmd_bench*.cpp registers first; its modes are subcommands).
CLI::App* bench_command(CLI::App& app);
// The benchmarks' prompt text: the file at `path`, or (empty path) the King James Bible of Debian's bible-kjv.
// Throws Error when neither gives text.
std::string bench_text(const std::string& path);

}  // namespace retroinfer::cli

#define RETROINFER_COMMAND(fn) \
  static const int retroinfer_command_##fn = ::retroinfer::cli::register_command(fn)
