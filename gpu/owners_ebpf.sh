#!/usr/bin/env bash
# GPU validation of non-framework memory by owner under eBPF (issue 25, item 3): gpu/owners_step.py
# (a GPT-2-like step: cuBLAS matmuls, a single-rank NCCL communicator with an all_reduce) once
# under `gpufrag run` (the shim's callers) and once under `gpufrag agent` started before it, with
# no --lib (the agent finds libcuda, libc10_cuda and libcudart itself: libcudart's allocation
# functions are probed so that a runtime allocation is owned by the runtime call's caller).
# PASS when: the agent's processes[].owners equal run's, owner by owner, to the byte; the agent
# probed a libcudart (its note "owners: uprobes on N runtime allocation functions of ..."); and
# the agent's owners sum to its process's driver bytes. Prints both tables and each difference.
# Runs on the device machine from the repository root with the release binaries in .gpu/bin
# (about 2 minutes); writes owners_ebpf_results.md, owners_ebpf_log.txt and the two summaries
# under $OUT.
set -u
B=$PWD/.gpu/bin; G=$PWD/gpu
R=$OUT/owners_ebpf_results.md; L=$OUT/owners_ebpf_log.txt
W=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a $R
echo "### run" >> $L
( mkdir -p $W/run && OUT=$W/run timeout 300 $B/gpufrag run --quiet --no-report --no-feed --summary-json $OUT/owners_run.json -- python3 $G/owners_step.py >> $L 2>&1 )
echo "run exit $?" | tee -a $R
echo "### agent" >> $L
timeout 400 $B/gpufrag agent -q --keep-exited --summary-json $OUT/owners_agent.json --duration 300 >> $L 2>&1 & AG=$!
sleep 5
( mkdir -p $W/agent && OUT=$W/agent timeout 300 python3 $G/owners_step.py >> $L 2>&1 ); echo "step under the agent exit $?" | tee -a $R
sleep 2; kill -INT $AG; wait $AG; echo "agent exit $?" | tee -a $R
python3 - "$OUT/owners_run.json" "$W/run/owners_step.json" "$OUT/owners_agent.json" "$W/agent/owners_step.json" <<'PY' | tee -a $R
import json, sys
def mine(summary, step):
    s = json.load(open(summary)); t = json.load(open(step))
    ps = [p for p in s["processes"] if p["pid"] == t["pid"]]
    return s, t, (ps[0] if len(ps) == 1 else None)
rs, rt, rp = mine(sys.argv[1], sys.argv[2])
as_, at, ap = mine(sys.argv[3], sys.argv[4])
if rp is None or ap is None:
    print(f"FAIL: process entries run {rp is not None} agent {ap is not None}"); sys.exit(0)
ro, ao = rp.get("owners", {}), ap.get("owners", {})
notes = [n for n in as_.get("notes", []) if n.startswith("owners:")]
print("agent's libcudart notes:", notes or "none")
print(f"torch {rt['torch']} nccl {rt['nccl']}; reserved run {rt['reserved']:,} agent {at['reserved']:,}; NVML used run {rt['nvml_used']} agent {at['nvml_used']}")
print("| owner | run | agent | |\n|---|---|---|---|")
for k in sorted(set(ro) | set(ao)):
    a, b = ro.get(k, 0), ao.get(k, 0)
    print(f"| {k} | {a:,} | {b:,} | {'=' if a == b else f'diff {b - a:+,}'} |")
rows = [
    ("agent owners == run owners", ao == ro),
    ("a libcudart probed by the agent", any("runtime allocation functions" in n for n in notes)),
    ("agent owners sum == its driver bytes", sum(ao.values()) == ap["reserved"]),
    ("agent owners.framework == memory_reserved()", ao.get("framework", 0) == at["reserved"]),
]
for n, ok in rows:
    print(f"- {n}: {'PASS' if ok else 'FAIL'}")
print("OWNERS_EBPF " + ("PASS" if all(ok for _, ok in rows) else "FAIL"))
PY
