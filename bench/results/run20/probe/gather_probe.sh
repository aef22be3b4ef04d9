#!/usr/bin/env bash
S=$(cd "$(dirname "$0")" && pwd)
$S/gather_probe | tee $OUT/gather_probe.txt
