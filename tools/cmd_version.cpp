// `retroinfer version`: prints the version and the build's backends.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "command.h"

namespace {
void setup_version(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "Print the version and the backends this build has");
  cmd->callback([] {
#ifdef RETROINFER_WITH_CUDA
    std::printf("retroinfer 0.1.0 (backends: cpu, cuda)\n");
#else
    std::printf("retroinfer 0.1.0 (backends: cpu)\n");
#endif
  });
}
RETROINFER_COMMAND(setup_version);
}  // namespace
