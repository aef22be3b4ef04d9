#!/usr/bin/env bash
# Run 17 call 1: per-CTA spans of the exact / estimation CTAs (kSlotSpan), knob sweep, ncu of the exact and
# estimation grids at 128K batch 4 (standalone: ncu serialises kernels).
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
bin/gpu_tests --gtest_filter='CudaDecode*:CudaRetro*:CudaScoreStream*' > $OUT/gpu_tests.log 2>&1; ts "gpu_tests rc=$?"
grep -E "^\[  (PASSED|FAILED)|FAILED  \]" $OUT/gpu_tests.log | head
KB="bin/kernel_bench --only retro --lengths 131072 --batches 1,4,16 --reps 30 --stages 1"
$KB --out $OUT/base1.jsonl 2>$OUT/kb.err; ts base1
$KB --out $OUT/base2.jsonl 2>>$OUT/kb.err; ts base2
RETROINFER_DECODE_STAGES=3 $KB --out $OUT/stages3.jsonl 2>>$OUT/kb.err; ts stages3
bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 30 --stages 1 --paths run10+split64,run10+split,run10+v1 --out $OUT/paths.jsonl 2>>$OUT/kb.err; ts paths
for k in decode_exact estimate_chained; do
  ncu --clock-control none --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis -k regex:$k -c 1 bin/kernel_bench --only retro --lengths 131072 --batches 4 --reps 1 > $OUT/ncu_$k.txt 2>&1; ts "ncu $k"
done
python3 - $OUT <<'P'
import json,sys,glob
for f in sorted(glob.glob(sys.argv[1]+'/*.jsonl')):
    for l in open(f):
        d=json.loads(l)
        if d['method'] in ('retro_graph',): print(f.split('/')[-1], d['n'], d['batch'], d.get('path',''), round(d['ms']*1e3,1))
        if d['method']=='retro_phases':
            p=d['phases_ms']; print('  ', {k:round(v*1e3,1) for k,v in p.items() if not k.startswith('select_') or k in ('select_start','select_end')})
P
cd $OUT && tar czf logs.tgz gpu_tests.log kb.err && rm -f gpu_tests.log kb.err
