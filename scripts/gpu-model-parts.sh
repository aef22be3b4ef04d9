#!/usr/bin/env bash
# Moves a model file to the GPU machine in numbered parts: a device call carries at most 64 MiB, so a larger
# file travels over consecutive calls while the machine stays warm, each call leaving its part outside the
# checkout, and a last step joins the parts and checks the size and sha256.
#
# Here (splits FILE into parts of PART_MB MiB, default 27, as DIR/<name>.partNN, and writes DIR/<name>.sum
# with the size and sha256 of the whole file):
#   scripts/gpu-model-parts.sh split FILE DIR [NAME]
# There, in each call that carries parts (copies them to PARTS_DIR, default /tmp/model-parts):
#   scripts/gpu-model-parts.sh keep PART...
# There, once every part has arrived (joins PARTS_DIR/<name>.part* into DEST and checks it against the
# .sum file, which travels with the last part; exit 1 and no DEST on a mismatch):
#   scripts/gpu-model-parts.sh join NAME DEST
set -euo pipefail
cmd=${1:-}
parts_dir=${PARTS_DIR:-/tmp/model-parts}
case $cmd in
  split)
    file=${2:?FILE}
    dir=${3:?DIR}
    name=${4:-$(basename "$file")}
    mkdir -p "$dir"
    rm -f "$dir/$name".part* "$dir/$name.sum"
    split -b "$(( ${PART_MB:-27} * 1024 * 1024 ))" -d -a 2 "$file" "$dir/$name.part"
    echo "$(stat -c %s "$file") $(sha256sum "$file" | awk '{print $1}')" > "$dir/$name.sum"
    ls "$dir/$name".part* | wc -l | xargs echo "gpu-model-parts: $name in parts:"
    ;;
  keep)
    shift
    mkdir -p "$parts_dir"
    for p in "$@"; do cp "$p" "$parts_dir/"; done
    echo "gpu-model-parts: kept $# part(s); $parts_dir holds $(ls "$parts_dir" | wc -l) file(s), $(du -sh "$parts_dir" | cut -f1)"
    ;;
  join)
    name=${2:?NAME}
    dest=${3:?DEST}
    sum=$parts_dir/$name.sum
    [[ -f $sum ]] || { echo "gpu-model-parts: no $sum (the .sum file travels with the parts)" >&2; exit 1; }
    read -r size sha < "$sum"
    mkdir -p "$(dirname "$dest")"
    cat "$parts_dir/$name".part* > "$dest.tmp"
    got_size=$(stat -c %s "$dest.tmp")
    got_sha=$(sha256sum "$dest.tmp" | awk '{print $1}')
    if [[ $got_size != "$size" || $got_sha != "$sha" ]]; then
      echo "gpu-model-parts: $name: got $got_size bytes sha256 $got_sha, expected $size bytes $sha" >&2
      rm -f "$dest.tmp"
      exit 1
    fi
    mv "$dest.tmp" "$dest"
    echo "gpu-model-parts: $dest ($size bytes, sha256 ok)"
    ;;
  *)
    echo "usage: gpu-model-parts.sh split FILE DIR [NAME] | keep PART... | join NAME DEST" >&2
    exit 2
    ;;
esac
