#!/usr/bin/env bash
# GPU validation of the agent at the moment of failure (issue 12): `gpufrag agent` started before
# gpu/frag_oom_exit.py (frag_oom.py ending with os._exit right after its OOM) must give the
# verdict fragmentation with PyTorch's numbers: device free = its "of which X GiB is free",
# stranded + releasable = its "X GiB is reserved by PyTorch but unallocated", requested 2.50 GiB.
# Once with the driver named by --lib, once found by itself under --host-root / (only PyTorch's
# libc10_cuda named). Then gpu/validate_ebpf.sh main: attach and agent still to the byte on
# gpt_trace.py. Runs on the device machine from the repository root with the release binaries
# in .gpu/bin; writes agent_oom_results.md, agent_oom_log.txt, agent_oom.tgz (and validate_ebpf's
# three files) under $OUT.
set -u
REPO=$PWD; B=$PWD/.gpu/bin; G=$PWD/gpu
W=$(mktemp -d); R=$OUT/agent_oom_results.md; L=$OUT/agent_oom_log.txt
LIBCUDA=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
C10=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib","libc10_cuda.so"))')
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a $R
echo "libcuda $LIBCUDA c10 $C10" | tee -a $R
one() { tag=$1; shift
  echo "### $tag: agent $*" >> $L
  timeout 120 $B/gpufrag agent -q --keep-exited "$@" --summary-json $W/$tag.agent.json --record $W/$tag.rec --duration 90 >> $L 2>&1 & AG=$!
  sleep 5
  ( cd $W && OUT=$W timeout 120 python3 $G/frag_oom_exit.py $tag >> $L 2>&1 ); echo "$tag frag_oom_exit exit $? (3 = died of its OOM)" | tee -a $R
  sleep 2; kill -INT $AG; wait $AG; echo "$tag agent exit $?" | tee -a $R
  python3 - $W/$tag.agent.json $W/$tag.oom.json $tag <<'PY' | tee -a $R
import json, sys
s = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2])); tag = sys.argv[3]
GiB = 1024**3
mine = [o for o in s["ooms"] if o["pid"] == t["pid"]]
print(f"{tag}: PyTorch: {t['oom_message'][:200]}")
if len(mine) != 1:
    print(f"{tag}: FAIL: {len(mine)} final OOM(s) for pid {t['pid']}: {mine}")
    sys.exit(0)
o = mine[0]
print(f"{tag}: agent OOM verdict {o['verdict']} requested {o['requested']:,} device_free {o['device_free']:,} ({o['device_free_source']}, age {o.get('device_free_age_ns')} ns) stranded {o['stranded']:,} releasable {o['releasable']:,} largest_free_block {o['largest_free_block']:,} op {o['op']} driver_failures_before {o['driver_failures_before']}")
checks = [
    ("verdict", o["verdict"], "fragmentation"),
    ("requested", o["requested"], int(2.5 * GiB)),
    ("device free (GiB, 2 decimals, as PyTorch prints it)", f"{o['device_free'] / GiB:.2f}", f"{t['free_gib']:.2f}"),
    ("stranded + releasable (GiB) vs reserved but unallocated", f"{(o['stranded'] + o['releasable']) / GiB:.2f}", f"{t['reserved_unallocated_gib']:.2f}"),
    ("device free taken from", o["device_free_source"], "process_reading"),
]
for n, got, want in checks:
    print(f"| {tag} | {n} | {want} | {got} | {'equal' if got == want else 'DIFFERS'} |")
print(f"{tag}: exact {s['exact']} anomalies {s['anomalies']} notes: {'; '.join(s['notes'])[:600]}")
PY
}
one lib --lib $LIBCUDA --lib $C10
one host_root --host-root / --lib $C10
( cd $W && tar czf $OUT/agent_oom.tgz *.json 2>/dev/null )
cd $REPO && bash gpu/validate_ebpf.sh main
