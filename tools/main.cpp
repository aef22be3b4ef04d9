// retroinfer: the command-line interface. Subcommands live in cmd_*.cpp and register themselves.
#include <CLI/CLI.hpp>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "command.h"
#include "retroinfer/error.h"
#include "retroinfer/model.h"

namespace retroinfer::cli {
std::vector<CommandSetup>& command_registry() {
  static std::vector<CommandSetup> r;
  return r;
}

CLI::App* bench_command(CLI::App& app) {
  try {
    return app.get_subcommand("bench");
  } catch (const CLI::OptionNotFound&) {
    auto* b = app.add_subcommand("bench", "Benchmarks");
    b->require_subcommand(1);
    return b;
  }
}
}  // namespace retroinfer::cli

int main(int argc, char** argv) {
  // OpenBLAS chose its generic kernels on a CPU it does not know (better_blas_core, model.h): start again with
  // the ones this CPU runs, once (OPENBLAS_CORETYPE is then set); a failed exec goes on as is.
  if (const char* core = retroinfer::better_blas_core()) {
    setenv("OPENBLAS_CORETYPE", core, 1);
    execv("/proc/self/exe", argv);
  }
  CLI::App app{"retroinfer: long-context LLM inference with the KV cache as a vector store"};
  app.require_subcommand(1);
  for (auto& setup : retroinfer::cli::command_registry()) setup(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const retroinfer::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
