#!/usr/bin/env bash
# GPU validation of issue 24 item 1 (foresight live): `gpufrag run` (the trace tracker's
# event-level blocks) of the workloads of gpu/foresight_workload.py on the H200, PyTorch 2.11.
#  - train_grow (a sequence length growing by 256 each step) and decode_grow (a KV cache growing
#    by torch.cat), each on a device a balloon tensor fills to leave ~3 GiB, until PyTorch raises
#    OutOfMemoryError at step N: PASS when the first warning came before step N began, and the
#    last warning's predicted peak is within 1 % of PyTorch's own figures (memory_stats()'s
#    reserved bytes right after the failure + the segment its OOM observer says it tried to
#    allocate; the OOM message is printed beside); the lead time (the OOM's time less the first
#    warning's, CLOCK_MONOTONIC both) in seconds.
#  - periodic, shapes, infer, generate, conv: runs that finish; PASS when they were forecast
#    (a forecast event in the record, or a note saying why not) and no warning came.
# Run from the repository root on the device machine: OUT=DIR bash gpu/validate_foresight.sh
# (binaries in .gpu/bin). Prints PASS/FAIL lines, also written to $OUT/results.md; logs,
# summaries and the workloads' figures in $OUT/foresight_log.txt and $OUT/foresight.tgz.
# About 2 minutes (the tracker's build, once, is most of it).
set -u
: "${OUT:?set OUT}"
mkdir -p "$OUT"
B=$PWD/.gpu/bin; G=$PWD/gpu; W=$(mktemp -d); R=$OUT/results.md; L=$OUT/foresight_log.txt
export XDG_CACHE_HOME=$W/cache
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> $L 2>&1
python3 -c 'import torch; print("torch", torch.__version__)' >> $L 2>&1
# the tracker library, built once into the cache every run below loads
timeout 120 $B/gpufrag run -q --no-report --no-feed --torch-tracker=build --summary-json $W/build.json -- python3 -c 'import torch; torch.zeros(1, device="cuda")' >> $L 2>&1
echo "tracker build exit $? after $(( $(date +%s) - T0 )) s" >> $L
for mode in train_grow decode_grow periodic shapes infer generate conv; do
  timeout 60 $B/gpufrag run --no-report --no-feed --summary-json $W/$mode.summary.json --record $W/$mode.rec -- python3 $G/foresight_workload.py $mode $W/$mode.own.json >> $L 2>&1
  echo "$mode exit $?" >> $L
  $B/gpufrag analyze --json $W/$mode.rec > $W/$mode.analyze.json 2>> $L
  python3 - $mode $W/$mode.summary.json $W/$mode.own.json $W/$mode.analyze.json $W/$mode.rec <<'PY' | tee -a $R
import json, struct, sys
mode, sp, op, ap, rec = sys.argv[1:6]
try:
    s = json.load(open(sp)); own = json.load(open(op))
except Exception as e:
    print(f"FAIL foresight_{mode} no summary or workload figures: {e}"); sys.exit()
try:
    a = json.load(open(ap))
except Exception:
    a = {}
warns = s.get("warnings", [])
replay = "record replays the warnings" if a.get("warnings") == warns else f"record replays {len(a.get('warnings', []))} warnings vs {len(warns)} live"
notes = [n for n in s.get("notes", []) if n.startswith("foresight:")]
# forecast events in the record (kind 28; 80-byte events after a 16-byte header, text in whole records)
d = open(rec, "rb").read(); off, forecasts = 16, 0
while off + 80 <= len(d):
    kind, tl = struct.unpack_from("<H", d, off + 64)[0], struct.unpack_from("<H", d, off + 78)[0]
    forecasts += kind == 28
    off += 80 + (tl + 79) // 80 * 80
o = own.get("oom")
if mode.endswith("_grow"):
    if not o:
        print(f"FAIL foresight_{mode} the workload did not OOM ({len(own['steps'])} steps); {len(warns)} warnings"); sys.exit()
    n = o["step"]; start = own["steps"][n]
    truth = o["reserved"] + (o["alloc"] or 0)
    if not warns:
        print(f"FAIL foresight_{mode} OOM at step {n}, no warning; {forecasts} forecasts; {'; '.join(notes)[:300]}; message: {o['message']}"); sys.exit()
    first, last = warns[0], [w for w in warns if w["ts_ns"] < o["t_ns"]][-1] if any(w["ts_ns"] < o["t_ns"] for w in warns) else warns[-1]
    err = abs(last["predicted_peak"] - truth) / truth
    ok = first["ts_ns"] < start and err <= 0.01 and a.get("warnings") == warns
    print(f"{'PASS' if ok else 'FAIL'} foresight_{mode} OOM at step {n}: first warning {first['steps_ahead']} step(s) ahead, {(start - first['ts_ns']) / 1e9:.3f} s before step {n} began, lead {(o['t_ns'] - first['ts_ns']) / 1e9:.3f} s; last warning predicted peak {last['predicted_peak']} vs PyTorch {o['reserved']} reserved + {o['alloc']} tried = {truth} ({100 * err:.3f} %); available {last['available']}; {len(warns)} warnings, {forecasts} forecasts; {replay}; fix: {last['fix'][:160]}; message: {o['message'][:200]}")
else:
    ok = own.get("done") and not warns and (forecasts > 0 or notes)
    why = f"{forecasts} forecasts" if forecasts else "; ".join(notes)[:300]
    print(f"{'PASS' if ok else 'FAIL'} foresight_{mode} finished {len(own['steps'])} steps: {len(warns)} warnings ({why}){'' if not warns else '; first: ' + json.dumps(warns[0])[:300]}")
PY
done
echo "total $(( $(date +%s) - T0 )) s" | tee -a $R
( cd $W && tar czf $OUT/foresight.tgz *.json 2>/dev/null )
