#!/usr/bin/env bash
# GPU validation of issue 24's cost figure: the training-step time of GPT-2 small
# (.gpu/shared/step_bench.py: 12 layers, AdamW, 60 timed steps of random batch 4..16 x length
# 64..1024 after 20 warm-up steps) bare, under `gpufrag run` with foresight off
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
ROUNDS=${ROUNDS:-4}
export XDG_CACHE_HOME=$W/cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> $L 2>&1
timeout 120 $B/gpufrag run -q --no-report --no-feed --torch-tracker=build --summary-json $W/build.json -- python3 -c 'import torch; torch.zeros(1, device="cuda")' >> $L 2>&1
for i in $(seq 1 $ROUNDS); do
  python3 $S/step_bench.py base 2>>$L | tee -a $W/times.txt
  timeout 300 $B/gpufrag run -q --no-report --no-feed --foresight-steps 0 --summary-json $W/off$i.json -- python3 $S/step_bench.py off 2>>$L | tee -a $W/times.txt
  timeout 300 $B/gpufrag run -q --no-report --no-feed --summary-json $W/on$i.json -- python3 $S/step_bench.py on 2>>$L | tee -a $W/times.txt
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
fc, warns, blocks = 0, 0, ""
for i in range(1, rounds + 1):
    try:
        s = json.load(open(f"{w}/on{i}.json"))
    except Exception:
        continue
    warns += len(s.get("warnings", []))
    notes = [n for n in s.get("notes", []) if n.startswith("foresight")]
    blocks = s.get("capture", {}).get("blocks", blocks) if isinstance(s.get("capture"), dict) else blocks
    fc = fc or (0 if any("no prediction" in n for n in notes) else 1)
    print(f"on round {i}: {len(s.get('warnings', []))} warnings; foresight notes: {'; '.join(notes)[:300] or 'none'}")
on_bare, on_off = med["on"] / med["base"], med["on"] / med["off"]
print(f"ratio on/bare {on_bare:.4f}, on/off {on_off:.4f}, off/bare {med['off'] / med['base']:.4f}")
print(("PASS" if on_off <= 1.002 and len(t.get("on", [])) == rounds else "FAIL") + f" foresight_step_cost on/off {on_off:.4f} (<= 1.002), on/bare {on_bare:.4f}, {rounds} rounds alternated")
PY
cp $W/*.json $OUT/ 2>/dev/null; tar czf $OUT/cost.tgz -C $W . 2>/dev/null
