#!/usr/bin/env bash
# Run 18 call 11 (main, 13d5b9c): the exact-grid variants (est first: split64e / eri; half-staged estimation
# CTAs: split64rh / rih) with 2 and with 3 cp.async stages per warp (RETROINFER_DECODE_STAGES=3: the exact phase
# ends 3.5 us earlier at 128K batch 4 in call 10, but one estimation CTA fits beside two exact ones), per flush.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
W=/tmp/ab11; rm -rf $W; mkdir -p $W
P=run10c+split64r,run10c+split64e,run10c+split64eri,run10c+split64rh,run10c+split64rih
kb() {  # name, extra args, env...
  local name=$1 extra=$2; shift 2
  env "$@" timeout 200 bin/kernel_bench --only retro --lengths 32768,131072 --batches 1,4,16 --reps 30 --stages 1 \
    --paths $P $extra --out $W/$name.jsonl 2>$W/$name.err; ts "$name rc=$?"
}
kb s2r "--flush read"
kb s3r "--flush read" RETROINFER_DECODE_STAGES=3
kb s2w ""
kb s3w "" RETROINFER_DECODE_STAGES=3
for f in $W/*.run10c*.jsonl; do python3 scripts/retro_phase_summary.py $f | sed "s|^|$(basename $f .jsonl) |" | cut -c1-500; done > $W/summary.txt
awk '{print $1, $3, $4, $5}' $W/summary.txt | grep "131072" 
grep "n=131072 b=4" $W/summary.txt | cut -c1-420
cp $W/summary.txt $OUT/
cd $W && tar czf $OUT/ab11.tgz *
