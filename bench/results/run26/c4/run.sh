#!/usr/bin/env bash
# Run 26 call 4: which change broke the q8 retro decode in call 3 (wave parity nmse 0.98): the parity test
# with the int8 spherical updates off, with the radix grouping, and with the default.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
W=$OUT
F='CudaWaveParity.RetroAgainstCpuRetro:CudaKMeansQ8*'
for cfg in "" "RETROINFER_KMEANS_Q8_UPDATE=0" "RETROINFER_KMEANS_GROUP=radix" "RETROINFER_KMEANS_Q8_TILE=m2n2b2"; do
  echo "== $cfg"
  env $cfg timeout 60 bin/gpu_tests --gtest_filter="$F" > $W/t.log 2>&1; echo "rc=$?"
  grep -E "wave parity\] retro|FAILED  \]|Failure" $W/t.log | head -8
done
