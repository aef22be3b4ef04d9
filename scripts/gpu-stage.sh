#!/usr/bin/env bash
# Stages a CUDA build for the GPU machine: stripped binaries, the shared libraries that machine lacks
# (xz-compressed: ~2x smaller than gzip on these), and the GPU scripts, into one folder to pass as `carry` (the transfer limit is 64 MiB).
#
#   bash scripts/gpu-stage.sh [build dir (default build/cuda-release)] [stage dir (default .gpu-stage/run)]
#
# On the GPU machine: bash <stage>/run.sh (written by the caller) or any script under <stage>/scripts.
# cuBLAS is not staged: the GPU machine's CUDA 13 toolkit (or torch's nvidia wheels) provides it; the
# scripts find libcublas.so.13 there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/cuda-release}
stage=${2:-$root/.gpu-stage/run}
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib" "$stage/scripts"
# BINARIES (default: all of them) names the binaries to stage.
for b in ${BINARIES:-retroinfer gpu_tests kernel_bench prefill_bench wave_buffer_bench model_ops_bench joined_decode_bench}; do
  if [ -x "$build/bin/$b" ]; then
    strip -o "$stage/bin/$b" "$build/bin/$b"
    xz -${XZ_LEVEL:-9} -T2 "$stage/bin/$b"
  fi
done
# Runtime libraries of this machine that the GPU machine's image lacks (OpenBLAS, OpenMP, ICU, PCRE2; the HTTP
# server's Boost.Beast/Asio is header-only).
# Each library as the staged CLI resolves it (its RUNPATH picks Debian's OpenMP build of OpenBLAS; ldconfig's
# default is the pthread build, whose own thread pool fights OpenMP's: on the GPU machine's 16 cores that made
# CPU prefill 3-10x slower), else ldconfig's.
cli=$build/bin/retroinfer
for l in libopenblas.so.0 libgomp.so.1 libgfortran.so.5 libquadmath.so.0 libicuuc.so.72 libicudata.so.72 \
         libpcre2-8.so.0; do
  p=$( { [ -x "$cli" ] && ldd "$cli"; } 2>/dev/null | awk -v n="$l" '$1 == n && $3 ~ /^\// && !found {print $3; found = 1}')
  [ -n "$p" ] || p=$(ldconfig -p | awk -v n="$l" '$1 == n && !found {print $NF; found = 1}')  # reads all input: no SIGPIPE under pipefail
  [ -n "$p" ] && xz -9 -T2 -c "$(readlink -f "$p")" > "$stage/lib/$l.xz"
done
cp "$root"/scripts/*.sh "$root"/scripts/*.py "$stage/scripts/" 2>/dev/null || true
cp "$root"/bench/*.sh "$stage/scripts/" 2>/dev/null || true
du -sh "$stage"
