#include "plot_charts.h"

#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "retroinfer/error.h"

extern char** environ;

namespace retroinfer::cli {

namespace {

namespace fs = std::filesystem;

// Exit status of plots.py when matplotlib is missing (EXIT_NO_MATPLOTLIB there).
constexpr int kExitNoMatplotlib = 3;

fs::path chart_script() {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  RETROINFER_CHECK(!ec, "--plot: cannot find this executable's folder (/proc/self/exe: ", ec.message(), ")");
  const fs::path bin = exe.parent_path();
  const fs::path candidates[] = {bin / ".." / "share" / "retroinfer" / "plots.py", bin / ".." / "plots.py"};
  for (const fs::path& p : candidates)
    if (fs::is_regular_file(p, ec)) return p.lexically_normal();
  RETROINFER_FAIL("--plot: the chart script plots.py is not beside this executable (looked for ",
                  candidates[0].lexically_normal().string(), " and ", candidates[1].lexically_normal().string(),
                  "); rebuild or reinstall retroinfer, or run python/retroinfer/plots.py by hand");
}

}  // namespace

void run_chart_script(const std::vector<std::string>& args) {
  std::vector<std::string> argv_s = {"python3", chart_script().string()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  // What this process printed comes before the script's lines.
  std::fflush(stdout);
  std::fflush(stderr);
  pid_t pid = 0;
  const int rc = ::posix_spawnp(&pid, "python3", nullptr, nullptr, argv.data(), environ);
  RETROINFER_CHECK(rc == 0, "--plot: cannot start python3 (", std::strerror(rc),
                   "): the charts need python3 with matplotlib on PATH (scripts/setup.sh installs it)");
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0)
    RETROINFER_CHECK(errno == EINTR, "--plot: waiting for python3 failed (", std::strerror(errno), ")");
  RETROINFER_CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == kExitNoMatplotlib),
                   "--plot: matplotlib is missing for the python3 on PATH: run scripts/setup.sh, or "
                   "python3 -m pip install matplotlib==3.10.7");
  RETROINFER_CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "--plot: the chart script failed (",
                   WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status)) : std::string("killed"),
                   "; its message is above)");
}

}  // namespace retroinfer::cli
