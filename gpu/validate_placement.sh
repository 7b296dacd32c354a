#!/usr/bin/env bash
# GPU validation of the real GPU of each process (issue 12, item 4): a PyTorch process started
# with CUDA_VISIBLE_DEVICES=N sees GPU N as its device 0; `gpufrag run` and `gpufrag agent` must
# file it under node GPU N (the summary's `device`), name it by that GPU's UUID (`hw_id`, compared
# with nvidia-smi's), and judge its OOM with that GPU's free memory (compared with PyTorch's own
# "of which X is free"). Meant for a machine with 2 or more GPUs (kind nvidia-h200-x2); on one GPU
# only the identity mapping is checked, and the results say so.
# Runs on the device machine from the repository root with the release binaries in .gpu/bin and
# the shared workloads in .gpu/shared; writes placement.md, placement_log.txt and a tarball of
# the summaries under $OUT.
set -u
B=$PWD/.gpu/bin; S=$PWD/shared/gpu; [ -d "$S" ] || S=$PWD/.gpu/shared
W=$(mktemp -d); cd "$W"; export OUT_FINAL=$OUT; export OUT=$W
R=$OUT_FINAL/placement.md; L=$OUT_FINAL/placement_log.txt
export CUDA_DEVICE_ORDER=PCI_BUS_ID
nvidia-smi --query-gpu=index,uuid,memory.total,memory.free --format=csv,noheader | tee -a $R
N=$(nvidia-smi --query-gpu=index --format=csv,noheader | tail -1 | tr -d ' ')
[ "$N" = 0 ] && echo "single GPU: only CUDA_VISIBLE_DEVICES=0 (the identity mapping) is checked" | tee -a $R
UUID=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i $N | tr -d ' ')
echo "target: node GPU $N, $UUID" | tee -a $R
LIBCUDA=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
check() { # tag summary.json
python3 - "$1" "$2" "$N" "$UUID" "$W/$1.oom.json" <<'PY' | tee -a $R
import json, re, sys
tag, path, n, uuid, oomf = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
s = json.load(open(path))
msg = json.load(open(oomf))["oom_message"] if __import__("os").path.exists(oomf) else ""
m = re.search(r"of which ([0-9.]+) GiB is free", msg)
torch_free = float(m.group(1)) if m else None
devs = sorted({d["device"] for d in s["devices"]})
print(f"| {tag} | devices in the summary | {devs} | expected [{n}] | {'OK' if devs == [n] else 'WRONG'} |")
for p in s["processes"]:
    if p.get("reserved", 0) > (1 << 30):
        print(f"| {tag} | pid {p['pid']} ({p.get('exe')}) device / hw_id | {p['device']} / {p.get('hw_id')} | {n} / {uuid} | {'OK' if p['device'] == n and p.get('hw_id') == uuid else 'WRONG'} |")
for o in s["ooms"]:
    gib = o["device_free"] / (1 << 30)
    same = torch_free is not None and abs(gib - torch_free) < 0.006
    print(f"| {tag} | OOM device {o['device']} hw_id {o.get('hw_id')} verdict {o['verdict']} | device_free {o['device_free']:,} ({gib:.2f} GiB) | PyTorch: {torch_free} GiB free | {'OK' if same and o['device'] == n else 'DIFFERS'} |")
PY
}
echo "| run | what | gpufrag | expected | |" >> $R
CUDA_VISIBLE_DEVICES=$N timeout 300 $B/gpufrag run --summary-json $W/run_placed.json -- python3 $S/frag_oom.py run_placed >> $L 2>&1
echo "run exit $?" | tee -a $R
check run_placed $W/run_placed.json
# The agent: started first, the job after it, with the job's own CUDA_VISIBLE_DEVICES.
timeout 300 $B/gpufrag agent -q --lib $LIBCUDA --keep-exited --summary-json $W/agent_placed.json >> $L 2>&1 & AP=$!
sleep 5
CUDA_VISIBLE_DEVICES=$N python3 $S/frag_oom.py agent_placed >> $L 2>&1
echo "job exit $?" | tee -a $R
sleep 2; kill -INT $AP; wait $AP; echo "agent exit $?" | tee -a $R
check agent_placed $W/agent_placed.json
tar czf $OUT_FINAL/placement_summaries.tgz *.json 2>/dev/null
