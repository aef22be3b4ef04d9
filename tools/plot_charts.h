// PNG charts for --plot: runs the chart script (python/retroinfer/plots.py, matplotlib) with python3.
#pragma once

#include <string>
#include <vector>

namespace retroinfer::cli {

// Runs `python3 plots.py <args...>`, the script found beside this executable: <bin>/../share/retroinfer/plots.py
// (build tree, cmake --install) or <bin>/../plots.py (the pip package, whose console script puts its own
// interpreter first on PATH). Throws Error when the script is not found, python3 cannot start, matplotlib is
// missing (with what to install) or the script fails.
void run_chart_script(const std::vector<std::string>& args);

}  // namespace retroinfer::cli
