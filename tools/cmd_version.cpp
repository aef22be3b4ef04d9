// `retroinfer version`: prints the version (RETROINFER_VERSION: project(VERSION) of CMakeLists.txt) and the
// build's backends.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "command.h"

namespace {
void setup_version(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "Print the version and the backends this build has");
  cmd->callback([] {
#ifdef RETROINFER_WITH_CUDA
    std::printf("retroinfer %s (backends: cpu, cuda)\n", RETROINFER_VERSION);
#else
    std::printf("retroinfer %s (backends: cpu)\n", RETROINFER_VERSION);
#endif
  });
}
RETROINFER_COMMAND(setup_version);
}  // namespace
