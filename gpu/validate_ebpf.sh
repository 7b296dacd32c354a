#!/usr/bin/env bash
# GPU validation of the eBPF path (`gpufrag attach`, `gpufrag agent`) against real PyTorch, JAX
# and CuPy. Runs on the device machine from the repository root with the release binaries
# carried in .gpu/bin; writes logs and a results table under $OUT.
set -u
B=$PWD/.gpu/bin; G=$PWD/gpu; S=$PWD/.gpu/shared
W=$(mktemp -d); cd "$W"; export OUT_FINAL=$OUT; export OUT=$W
R=$OUT_FINAL/ebpf_results.md; L=$OUT_FINAL/ebpf_log.txt
LIBCUDA=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
C10=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib","libc10_cuda.so"))')
echo "libcuda $LIBCUDA c10 $C10" | tee -a $R
if [ "${1:-main}" = main ] || [ "${1:-main}" = attach ]; then
# 1. attach from the start: a launcher waits for a go file, then execs the script.
launch() { python3 -c "import os,sys,time
while not os.path.exists('$W/go'): time.sleep(0.01)
os.execvp(sys.argv[1], sys.argv[1:])" "$@" >> $L 2>&1 & }
# hold_exit.py ends the process right after the script has written its figures (see there).
rm -f $W/go; launch python3 $G/hold_exit.py $S/gpt_trace.py gtrace 3 python; LP=$!
sleep 0.5
timeout 300 $B/gpufrag attach $LP -q --lib $LIBCUDA --lib $C10 --summary-json $W/attach_gpt.json --record $W/attach_gpt.rec >> $L 2>&1 & AP=$!
sleep 3; touch $W/go; wait $LP; echo "gpt_trace exit $?" | tee -a $R; sleep 1; wait $AP; echo "attach exit $?" | tee -a $R
python3 $G/record_kinds.py $W/attach_gpt.rec | sed 's/^/attach gpt events: /' | tee -a $R
python3 - <<PY | tee -a $R
import json, pickle
s = json.load(open("$W/attach_gpt.json")); st = json.load(open("$W/gtrace.stats.json")); snap = pickle.load(open("$W/gtrace.pickle", "rb"))
p = max(s["processes"], key=lambda p: p["reserved"])
lfb = max([b["size"] for g in snap["segments"] for b in g["blocks"] if b["state"] == "inactive"], default=0)
rows = [("reserved (cache)", st["reserved_bytes.all.current"], p["framework_reserved"]), ("allocated", st["allocated_bytes.all.current"], p["allocated"]),
        ("stranded", st["inactive_split_bytes.all.current"], p["stranded"]), ("segments", len(snap["segments"]), p["framework_segments"]), ("largest free block", lfb, p["largest_free_block"])]
for n, w, g in rows: print(f"| attach gpt_trace | {n} | {w:,} | {g:,} | {'equal' if w == g else 'DIFFERS by %+d' % (g - w)} |")
print("| attach gpt_trace | exact / level / notes |", s["exact"], p["level"], "|", "; ".join(s["notes"])[:400], "|")
PY
[ "${1:-main}" = attach ] && exit 0
# 2. the agent, node-wide, while several workloads run one after another
timeout 400 $B/gpufrag agent -q --keep-exited --lib $LIBCUDA --lib $C10 --summary-json $W/agent.json --record $W/agent.rec --duration 240 >> $L 2>&1 & AG=$!
sleep 4
python3 $S/frag_oom.py frag >> $L 2>&1; echo "frag_oom under agent: $(grep -c OOM_MESSAGE $L) OOM message(s)" | tee -a $R
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 $G/hold_exit.py $G/torch_workload.py ag_exp 2 >> $L 2>&1
PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync python3 $G/hold_exit.py $G/torch_workload.py ag_async 2 >> $L 2>&1
python3 $G/jax_alloc.py >> $L 2>&1
python3 $G/cupy_alloc.py >> $L 2>&1
sleep 1; kill -INT $AG; wait $AG; echo "agent exit $?" | tee -a $R
python3 $G/record_kinds.py $W/agent.rec | sed 's/^/agent events: /' | tee -a $R
python3 - <<PY | tee -a $R
import json
s = json.load(open("$W/agent.json"))
for o in s["ooms"]: print("agent OOM pid", o["pid"], o["verdict"], "requested", o["requested"], "device_free", o["device_free"], "stranded", o["stranded"], "largest_free_block", o["largest_free_block"])
for p in s["processes"]: print("agent process", p["pid"], {k: p.get(k) for k in ["reserved", "framework_reserved", "allocated", "stranded", "segments", "level", "allocs", "frees"]})
print("agent anomalies", s["anomalies"], "failed calls", [(c["pid"], c["op"], c["rc"]) for c in s.get("failed_calls", [])])
PY
for t in ag_exp ag_async; do python3 $G/compare.py $W/agent.json $W/$t.torch.json agent_$t | tee -a $R; done
fi
if [ "${1:-main}" = bench ]; then
# 3. step_bench: agent (segments and blocks) vs bare, alternating, 3 runs each
for i in 1 2 3; do
  python3 $S/step_bench.py base 2>/dev/null | tee -a $R
  timeout 200 $B/gpufrag agent -q --lib $LIBCUDA --lib $C10 --duration 120 >> $L 2>&1 & AG=$!; sleep 3
  python3 $S/step_bench.py agent 2>/dev/null | tee -a $R
  kill -INT $AG; wait $AG
done
fi
tar czf $OUT_FINAL/ebpf.tgz *.json 2>/dev/null
