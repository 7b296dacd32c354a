#!/usr/bin/env bash
# Issue 15 on the H200: what a training step pays for PyTorch's blocks, per capture method.
# Runs from the repository root on the device machine, with the release binaries in .gpu/bin
# and the shared workloads in .gpu/shared (as validate_run.sh). Under 8 minutes in all.
#
# For GPT-2 small training (a) while holding 100 k extra small tensors (100 k live blocks) and
# (b) plain, alternated over ROUNDS rounds (default 3): bare; `gpufrag run` (today's snapshot
# hook, one snapshot a second); and in-process, without gpufrag, each candidate for
# event-level blocks without root: PyTorch's allocator trace tracker (C++ extension built here),
# `_record_memory_history(context=None)`, adaptively spaced snapshots (0.2 % budget). Then the
# snapshot's own cost at 1 k / 11 k / 100 k blocks and the tracker's cost per allocation.
# Writes $OUT/results.md (every RESULT line and the ratio table), $OUT/log.txt, $OUT/scale.tgz.
set -u
B=$PWD/.gpu/bin; G=$PWD/gpu
ROUNDS=${ROUNDS:-3}; export STEPS=${STEPS:-40} WARM=${WARM:-10}
W=$(mktemp -d); export TORCH_EXTENSIONS_DIR=$W/ext
R=$OUT/results.md; L=$OUT/log.txt
T0=$(date +%s)
left() { echo $(( 470 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a $R
python3 -c 'import torch; print("torch", torch.__version__)' | tee -a $R
one() { # tag, then the command; keeps the RESULT lines, tagged
  local tag=$1; shift
  echo "### $tag: $*" >> $L
  timeout 150 "$@" > $W/one.out 2>&1; local rc=$?
  cat $W/one.out >> $L
  grep '^RESULT' $W/one.out | sed "s/^RESULT/RESULT $tag/" | tee -a $R
  [ $rc = 0 ] || echo "RESULT $tag failed rc=$rc" | tee -a $R
}
# The extension first (cached for every later run), and what the installed header says.
one compile python3 $G/scale_step.py compile
grep -A60 '^HEADER' $L | head -80 > $W/header.txt
# Without the extension, no tracker runs (each would spend a minute failing to build it again).
TRACKER=tracker; grep -q 'probe=compile' $R || { TRACKER=""; echo "RESULT tracker unavailable: the extension did not build (log.txt)" | tee -a $R; }
for r in $(seq 1 $ROUNDS); do
  for held in 100000 0; do
    modes="bare run $TRACKER history adaptive"; [ $held = 0 ] && modes="bare run $TRACKER"
    for mode in $modes; do
      [ $(left) -gt 60 ] || { echo "RESULT skipped round=$r held=$held mode=$mode (time)" | tee -a $R; continue; }
      if [ $mode = run ]; then
        SCALE_MODE_NAME=run one "round=$r" "$B/gpufrag" run -q --no-report --no-feed --summary-json $W/run_${held}_$r.json -- python3 $G/scale_step.py bare $held
      else
        one "round=$r" python3 $G/scale_step.py $mode $held
      fi
    done
  done
done
[ $(left) -gt 40 ] && one snapcost python3 $G/scale_step.py snapcost
# Ratios: each mode against the bare run of the same round and held count, then the median.
python3 - "$R" <<'PY' | tee -a $R
import re, sys, statistics
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"RESULT round=(\d+) mode=(\w+) held=(\d+) .*ms_per_step=([\d.]+)", line)
    if m:
        rows[(int(m[1]), m[2], int(m[3]))] = float(m[4])
print("\n| held blocks | mode | ms per step (per round) | vs bare, per round | median |\n|---|---|---|---|---|")
for held in (100000, 0):
    for mode in ("bare", "run", "tracker", "history", "adaptive"):
        rs = sorted(r for (r, mo, h) in rows if mo == mode and h == held)
        if not rs:
            continue
        ms = [rows[(r, mode, held)] for r in rs]
        ratios = [100 * (rows[(r, mode, held)] / rows[(r, "bare", held)] - 1) for r in rs if (r, "bare", held) in rows]
        med = f"{statistics.median(ratios):+.2f} %" if ratios else ""
        print(f"| {held} | {mode} | {' / '.join(f'{x:.2f}' for x in ms)} | {' '.join(f'{x:+.2f}' for x in ratios)} % | {med} |")
PY
cp $W/header.txt $OUT/ 2>/dev/null
(cd $W && tar czf $OUT/scale.tgz *.json header.txt 2>/dev/null)
echo "total $(( $(date +%s) - T0 )) s" | tee -a $R
