#!/usr/bin/env bash
# Run 17 A/B 2: exact-grid variants under the write and the read flush (the phase replay flushes the same way),
# score tmadyn and the selection split under the read flush.
S=$(cd "$(dirname "$0")" && pwd); STAGE=$S source $S/scripts/gpu-env.sh
cd $S
t0=$(date +%s); ts() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
KB="bin/kernel_bench --only retro --reps 30 --stages 1"
P=run10+split64,run10+split64r,run10+split64e,run10+split64eri
for f in write read; do
$KB --lengths 32768,131072 --batches 1,4,16 --flush $f --paths $P --out $OUT/ex_$f.jsonl 2>>$OUT/kb.err; ts "paths $f"
done
RETROINFER_SCORE=tmadyn $KB --lengths 131072 --batches 1,4,16 --flush read --out $OUT/tmadyn_read.jsonl 2>>$OUT/kb.err; ts tmadyn
RETROINFER_SELECT_SPLIT=1 $KB --lengths 131072 --batches 1,4,16 --flush read --out $OUT/split_read.jsonl 2>>$OUT/kb.err; ts split
bin/kernel_bench --only full --lengths 131072 --batches 1,4,16 --reps 30 --flush read --out $OUT/full_read.jsonl 2>>$OUT/kb.err; ts full
python3 scripts/retro_phase_summary.py $OUT/*+*.jsonl $OUT/tmadyn_read.jsonl $OUT/split_read.jsonl > $OUT/summary.txt
grep '"full"' $OUT/full_read.jsonl | cut -c1-120 >> $OUT/summary.txt
cut -c1-300 $OUT/summary.txt
cd $OUT && tar czf paths.tgz *+*.jsonl kb.err && rm -f *+*.jsonl kb.err
