#!/usr/bin/env bash
S=$(cd "$(dirname "$0")" && pwd)
$S/read_probe | tee $OUT/read_probe.txt
