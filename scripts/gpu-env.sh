# Sourced on the GPU machine by the GPU scripts: unpacks a staged build (scripts/gpu-stage.sh) and sets
# PATH / LD_LIBRARY_PATH so its binaries find OpenBLAS / OpenMP (staged) and cuBLAS (the machine's CUDA 13
# toolkit or torch's nvidia wheels).
#   STAGE=<stage dir> source scripts/gpu-env.sh
STAGE=${STAGE:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
unpack() {  # .xz (python's lzma where xz is missing) or .gz, in place
  case $1 in
    *.xz) xz -d -f "$1" 2>/dev/null || python3 -c 'import lzma,sys,os; p=sys.argv[1]; open(p[:-3],"wb").write(lzma.open(p).read()); os.remove(p)' "$1" ;;
    *.gz) gunzip -f "$1" ;;
  esac
}
for z in "$STAGE"/bin/*.xz "$STAGE"/bin/*.gz "$STAGE"/lib/*.xz "$STAGE"/lib/*.gz; do
  [ -e "$z" ] && unpack "$z"
done
chmod +x "$STAGE"/bin/* 2>/dev/null || true
cublas_dir=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [ -e "$d/libcublas.so.13" ] && { cublas_dir=$d; break; }
done
if [ -z "$cublas_dir" ]; then
  f=$(find / -xdev -name 'libcublas.so.13*' 2>/dev/null | head -1)
  [ -n "$f" ] && cublas_dir=$(dirname "$f")
fi
lt=$(find "$(dirname "${cublas_dir:-/nonexistent}")" -maxdepth 3 -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$STAGE/lib${cublas_dir:+:$cublas_dir}${lt:+:$(dirname "$lt")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="$STAGE/bin:$PATH"
echo "gpu-env: stage $STAGE, cuBLAS from ${cublas_dir:-<not found>}"
