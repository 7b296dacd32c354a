#!/usr/bin/env bash
# Issue 15 on the H200: `gpufrag run` with PyTorch's allocator trace tracker (event-level blocks,
# python/torch_tracker.cpp) against bare and against the snapshot hook (--torch-tracker=off).
# Runs from the repository root on the device machine, release binaries in .gpu/bin, shared
# workloads in .gpu/shared (as validate_run.sh). At most ~8 minutes.
#  1. build: the tracker library built by the hook (--torch-tracker=build) into a fresh cache,
#     its build time (the hook's note) and a cached start (auto) for comparison;
#  3. cost, alternated over ROUNDS (3) rounds: GPT-2 small training holding 100 k extra live
#     blocks (gpu/scale_step.py bare 100000) and plain GPT-2 small (step_bench.py bare):
#     bare / `gpufrag run` (tracker, cached) / `gpufrag run --torch-tracker=off` (snapshots);
#  2. exactness with the tracker (before the cost rounds, so the time limit cannot cut it): frag_oom.py (OOM verdict and figures vs memory_stats() and the
#     workload's snapshot) and torch_workload.py (validate_run.sh's compare.py table), each with
#     --record, and `gpufrag whatif --json` on each record (faithful, peak reserved vs PyTorch's).
# Writes $OUT/results.md (every figure, the ratio table) and $OUT/tracker.tgz (logs, JSON, records).
set -u
B=$PWD/.gpu/bin; G=$PWD/gpu; S=$PWD/shared/gpu; [ -d "$S" ] || S=$PWD/.gpu/shared
ROUNDS=${ROUNDS:-3}; export STEPS=${STEPS:-30} WARM=${WARM:-10}
W=$(mktemp -d); OUT_FINAL=$OUT; R=$OUT/results.md; L=$W/log.txt
export XDG_CACHE_HOME=$W/cache
T0=$(date +%s); left() { echo $(( 470 - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a $R
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' | tee -a $R
c++ --version | head -1 | tee -a $R
note() { python3 -c "import json,sys;s=json.load(open(sys.argv[1]));print(' || '.join(n for n in s['notes'] if 'PyTorch blocks' in n or 'tracker' in n)[:600], '| exact', s['exact'], '| dropped', s.get('dropped'))" "$1" 2>&1; }
# 1. build time
t=$(date +%s.%N)
timeout 300 $B/gpufrag run -q --no-report --no-feed --torch-tracker=build --summary-json $W/build.json -- python3 -c 'import torch; x = torch.zeros(1, device="cuda"); print("ok")' >> $L 2>&1
echo "RESULT build wall_s=$(python3 -c "import time;print(round(time.time()-$t,1))") note: $(note $W/build.json)" | tee -a $R
ls -l $XDG_CACHE_HOME/gpufrag >> $L 2>&1
t=$(date +%s.%N)
timeout 300 $B/gpufrag run -q --no-report --no-feed --summary-json $W/cached.json -- python3 -c 'import torch; x = torch.zeros(1, device="cuda"); print("ok")' >> $L 2>&1
echo "RESULT cached wall_s=$(python3 -c "import time;print(round(time.time()-$t,1))") note: $(note $W/cached.json)" | tee -a $R
t=$(date +%s.%N)
timeout 300 python3 -c 'import torch; x = torch.zeros(1, device="cuda"); print("ok")' >> $L 2>&1
echo "RESULT bare_start wall_s=$(python3 -c "import time;print(round(time.time()-$t,1))")" | tee -a $R
# 2. exactness (first: it must not be cut by the time limit) with the tracker
cd $W; export OUT=$W
if [ -z "${ONLY_COST:-}" ] && [ $(left) -gt 60 ]; then
  timeout 120 $B/gpufrag run --no-report --no-feed --summary-json $W/frag.summary.json --record $W/frag.rec -- python3 $S/frag_oom.py frag >> $L 2>&1
  echo "RESULT frag_oom summary: $(note $W/frag.summary.json)" | tee -a $R
  grep -A3 "OOM in pid" $L | tail -4 | tee -a $R
  python3 - $W <<'PY' | tee -a $R
import json, pickle, sys
w = sys.argv[1]
s = json.load(open(f"{w}/frag.summary.json")); st = json.load(open(f"{w}/frag.stats.json")); snap = pickle.load(open(f"{w}/frag.pickle", "rb"))
lfb = max([b["size"] for g in snap["segments"] for b in g["blocks"] if b["state"] == "inactive"], default=0)
p = max(s["processes"], key=lambda p: p["reserved"])
for name, want, got in [("reserved", st["reserved_bytes.all.current"], p.get("framework_reserved")), ("allocated", st["allocated_bytes.all.current"], p.get("allocated")),
                        ("stranded (inactive_split)", st["inactive_split_bytes.all.current"], p.get("stranded")), ("segments", len(snap["segments"]), p.get("framework_segments")),
                        ("largest free block", lfb, p.get("largest_free_block"))]:
    print(f"| frag_oom tracker | {name} | {want:,} | {got:,} | {'equal' if want == got else 'DIFFERS by %+d' % (got - want)} |")
for o in s["ooms"]:
    print("frag_oom verdict", o["verdict"], "requested", o["requested"], "device_free", o["device_free"], "stranded", o["stranded"], "largest_free_block", o["largest_free_block"], "op", o.get("op"))
PY
fi
if [ -z "${ONLY_COST:-}" ] && [ $(left) -gt 40 ]; then
  timeout 120 $B/gpufrag run -q --no-report --no-feed --summary-json $W/gpt.summary.json --record $W/gpt.rec -- python3 $G/torch_workload.py gpt 6 >> $L 2>&1
  echo "RESULT torch_workload summary: $(note $W/gpt.summary.json)" | tee -a $R
  python3 $G/compare.py $W/gpt.summary.json $W/gpt.torch.json gpt_tracker | tee -a $R
fi
for t in frag gpt; do
  [ -f $W/$t.rec ] || continue
  python3 $G/record_kinds.py $W/$t.rec | sed "s/^/RESULT $t record events: /" | tee -a $R
  timeout 60 $B/gpufrag whatif --json $W/$t.rec > $W/$t.whatif.json 2>> $L; echo "RESULT $t whatif rc=$?" | tee -a $R
  python3 - $W $t <<'PY' | tee -a $R
import json, sys
w, t = sys.argv[1:]
try:
    j = json.load(open(f"{w}/{t}.whatif.json"))
except Exception as e:
    print(f"RESULT {t} whatif unreadable: {e}"); sys.exit()
want = None
try:
    want = json.load(open(f"{w}/{t}.torch.json")).get("peak_reserved") if t == "gpt" else json.load(open(f"{w}/{t}.stats.json"))["reserved_bytes.all.peak"]
except Exception:
    pass
print(f"RESULT {t} whatif faithful={j.get('faithful')} divergence={j['check'].get('divergence')} ops_compared={j['check'].get('ops_compared')} blocks_compared={j['check'].get('blocks_compared')} "
      f"trace_peak_reserved={j['trace'].get('peak_reserved')} torch_peak_reserved={want} requests={j['trace'].get('requests')} first_row={ {k: j['scenarios'][0].get(k) for k in ('peak_reserved', 'oom', 'num_ooms')} }")
PY
done
# 3. cost
one() { # round, workload, mode
  local r=$1 wl=$2 mode=$3 pre=() cmd
  case $wl in scale) cmd=(python3 $G/scale_step.py bare 100000);; gpt2) cmd=(python3 $S/step_bench.py bare);; esac
  case $mode in tracker) pre=($B/gpufrag run -q --no-report --no-feed --summary-json $W/${wl}_${mode}_$r.json --);;
                snapshots) pre=($B/gpufrag run -q --no-report --no-feed --torch-tracker=off --summary-json $W/${wl}_${mode}_$r.json --);; esac
  echo "### round $r $wl $mode" >> $L
  timeout 150 "${pre[@]}" "${cmd[@]}" > $W/one.out 2>&1; local rc=$?
  cat $W/one.out >> $L
  local ms=$(grep -oE 'ms_per_step[= ]+[0-9.]+' $W/one.out | grep -oE '[0-9.]+$')
  echo "RESULT round=$r workload=$wl mode=$mode ms_per_step=${ms:-none} rc=$rc" | tee -a $R
  [ $mode = bare ] || echo "RESULT round=$r workload=$wl mode=$mode summary: $(note $W/${wl}_${mode}_$r.json)" | tee -a $R
}
# FIRST_ROUND numbers the rounds of a further call; ONLY_COST=1 skips the exactness part (2.).
for r in $(seq ${FIRST_ROUND:-1} $(( ${FIRST_ROUND:-1} + ROUNDS - 1 ))); do
  for wl in scale gpt2; do
    for mode in bare tracker snapshots; do
      [ $(left) -gt 120 ] || { echo "RESULT skipped round=$r workload=$wl mode=$mode (time)" | tee -a $R; continue; }
      one $r $wl $mode
    done
  done
done
# Ratios: each run against the bare run of its round and workload, then the median.
python3 - "$R" <<'PY' | tee -a $R
import re, sys, statistics
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"RESULT round=(\d+) workload=(\w+) mode=(\w+) ms_per_step=([\d.]+)", line)
    if m:
        rows[(int(m[1]), m[2], m[3])] = float(m[4])
print("\n| workload | mode | ms per step (per round) | vs bare, per round | median |\n|---|---|---|---|---|")
for wl in ("scale", "gpt2"):
    for mode in ("bare", "tracker", "snapshots"):
        rs = sorted(r for (r, w, mo) in rows if w == wl and mo == mode)
        if not rs:
            continue
        ms = [rows[(r, wl, mode)] for r in rs]
        ratios = [100 * (rows[(r, wl, mode)] / rows[(r, wl, "bare")] - 1) for r in rs if (r, wl, "bare") in rows]
        med = f"{statistics.median(ratios):+.3f} %" if ratios else ""
        print(f"| {wl} | {mode} | {' / '.join(f'{x:.2f}' for x in ms)} | {' '.join(f'{x:+.3f}' for x in ratios)} % | {med} |")
PY
echo "total $(( $(date +%s) - T0 )) s" | tee -a $R
(cd $W && tar czf $OUT_FINAL/tracker.tgz *.json *.rec log.txt cache/gpufrag/*.log 2>/dev/null) 
