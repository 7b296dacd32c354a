#!/usr/bin/env bash
# GPU validation of issue 24's cost figure: the training-step time of GPT-2 small
# (gpu/step_bench_fixed.py: 12 layers, AdamW, 100 timed steps of batch 8 x length 512 after 20
# warm-up steps; BENCH=.gpu/shared/step_bench.py for random shapes, which have no repeating step
# so foresight stops predicting and cannot show its cost) bare, under `gpufrag run` with foresight off
# (--foresight-steps 0) and under `gpufrag run` with foresight on (the default, 8 steps ahead),
# alternated bare / off / on, ROUNDS rounds (default 4). Both gpufrag runs use the trace tracker
# (event-level blocks: what foresight predicts from), built once before the rounds.
# Prints per-round ms/step and the medians, with the ratios on/bare and on/off; PASS when
# on/off <= 1.002 (foresight's own cost: 0.2 %). Also the forecasts the "on" runs made (from
# their summaries), so a run that predicted nothing cannot pass as cheap.
# Run from the repository root on the device machine: OUT=DIR bash gpu/validate_foresight_cost.sh
set -u
: "${OUT:?set OUT}"
mkdir -p "$OUT"
B=$PWD/.gpu/bin; S=$PWD/.gpu/shared; W=$(mktemp -d); R=$OUT/cost_results.md; L=$OUT/cost_log.txt
ROUNDS=${ROUNDS:-4}; BENCH=${BENCH:-$PWD/gpu/step_bench_fixed.py}
export XDG_CACHE_HOME=$W/cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $L 2>&1
timeout 120 $B/gpufrag run -q --no-report --no-feed --torch-tracker=build --summary-json $W/build.json -- python3 -c 'import torch; torch.zeros(1, device="cuda")' >> $L 2>&1
for i in $(seq 1 $ROUNDS); do
  python3 $BENCH base 2>>$L | tee -a $W/times.txt
  timeout 300 $B/gpufrag run -q --no-report --no-feed --foresight-steps 0 --record $W/off$i.rec --summary-json $W/off$i.json -- python3 $BENCH off 2>>$L | tee -a $W/times.txt
  timeout 300 $B/gpufrag run -q --no-report --no-feed --record $W/on$i.rec --summary-json $W/on$i.json -- python3 $BENCH on 2>>$L | tee -a $W/times.txt
done
python3 - $W $ROUNDS <<'PY' | tee -a $R
import json, statistics, sys, glob, os
w, rounds = sys.argv[1], int(sys.argv[2])
t = {}
for line in open(f"{w}/times.txt"):
    p = line.split()
    if len(p) >= 4 and p[0] == "MODE":
        t.setdefault(p[1], []).append(float(p[3]))
print("| mode | ms/step per round | median |\n|---|---|---|")
med = {}
for m in ("base", "off", "on"):
    v = t.get(m, [])
    med[m] = statistics.median(v) if v else float("nan")
    print(f"| {m} | {', '.join(f'{x:.2f}' for x in v)} | {med[m]:.2f} |")
import struct
def forecasts(rec):
    # forecast events (kind 28) in a record: 80-byte events after a 16-byte header, text in whole records
    try:
        d = open(rec, "rb").read()
    except OSError:
        return -1
    off, n = 16, 0
    while off + 80 <= len(d):
        kind, tl = struct.unpack_from("<H", d, off + 64)[0], struct.unpack_from("<H", d, off + 78)[0]
        n += kind == 28
        off += 80 + (tl + 79) // 80 * 80
    return n
made = []
for i in range(1, rounds + 1):
    try:
        s = json.load(open(f"{w}/on{i}.json"))
    except Exception:
        made.append(0)
        continue
    notes = [n for n in s.get("notes", []) if n.startswith("foresight")]
    made.append(forecasts(f"{w}/on{i}.rec"))
    print(f"on round {i}: {made[-1]} forecasts, {len(s.get('warnings', []))} warnings; foresight notes: {'; '.join(notes)[:300] or 'none'}; off: {forecasts(f'{w}/off{i}.rec')} forecasts")
on_bare, on_off = med["on"] / med["base"], med["on"] / med["off"]
print(f"ratio on/bare {on_bare:.4f}, on/off {on_off:.4f}, off/bare {med['off'] / med['base']:.4f}")
print(("PASS" if on_off <= 1.002 and len(t.get("on", [])) == rounds and min(made) > 0 else "FAIL") + f" foresight_step_cost on/off {on_off:.4f} (<= 1.002), on/bare {on_bare:.4f}, {rounds} rounds alternated")
PY
tar czf $OUT/cost.tgz -C $W --exclude '*.rec' --exclude cache . 2>/dev/null
