#!/usr/bin/env bash
# GPU validation of the allowed-limit verdict (issue 13): a program capped with
# torch.cuda.set_per_process_memory_fraction (16 GiB of the card) asks for 20 GiB; PyTorch refuses
# it without any driver call. Under `gpufrag run` (the Python hook's OOM observer) the verdict
# must be allowed_limit with the OOM entry's `allowed` equal to PyTorch's own allowed bytes
# (fraction × cudaMemGetInfo total); under `gpufrag agent` started first (the uprobe on
# c10::reportOutOfMemoryToProfiler in libc10.so) allowed_limit with requested = 20 GiB and
# reserved = PyTorch's reserved_bytes at the failure. The same program without a cap asking for
# more than the card (a driver OOM) must NOT be allowed_limit under either. Runs on the device
# machine from the repository root with the release binaries in .gpu/bin (about 2 minutes);
# writes limits_results.md, limits_log.txt and limits.tgz under $OUT.
set -u
B=$PWD/.gpu/bin; G=$PWD/gpu
W=$(mktemp -d); R=$OUT/limits_results.md; L=$OUT/limits_log.txt
LIBCUDA=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
C10=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib","libc10_cuda.so"))')
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a $R
echo "libcuda $LIBCUDA c10 $C10" | tee -a $R
nm -D --defined-only "$(dirname $C10)/libc10.so" | grep reportOutOfMemoryToProfiler | tee -a $R
check() { # check TAG SUMMARY CAPTURE
  python3 - "$2" "$W/$1.capped.json" "$1" "$3" <<'PY' | tee -a $R
import json, sys
s = json.load(open(sys.argv[1])); t = json.load(open(sys.argv[2])); tag, cap = sys.argv[3], sys.argv[4]
print(f"{tag}: PyTorch {t['torch']}: cudaMemGetInfo total {t['cudaMemGetInfo_total']:,}, get_device_properties total_memory {t['get_device_properties_total_memory']:,}, fraction {t['fraction']}, read back {t['get_per_process_memory_fraction']}, allowed (fraction x total) {t['allowed_expected']}")
print(f"{tag}: PyTorch's message: {(t['oom_message'] or 'none')[:400]}")
print(f"{tag}: memory_stats at the failure: {t['memory_stats']}")
mine = [o for o in s["ooms"] if o["pid"] == t["pid"]]
if len(mine) != 1:
    print(f"{tag}: FAIL: {len(mine)} OOM(s) for pid {t['pid']}: {json.dumps(s['ooms'])[:1500]}"); sys.exit(0)
o = mine[0]
print(f"{tag}: {cap} OOM: verdict {o['verdict']} requested {o['requested']:,} reserved {o['reserved']:,} allowed {o.get('allowed')} device_free {o['device_free']:,} ({o['device_free_source']}) op {o['op']} driver_failures_before {o['driver_failures_before']}")
print(f"{tag}: explanation: {o['explanation']}")
print(f"{tag}: fix: {o['fix']}")
capped = t["fraction"] is not None
rows = [("verdict", o["verdict"], "allowed_limit" if capped else "not allowed_limit")]
if capped and cap == "run":
    rows.append(("allowed bytes", o.get("allowed"), t["allowed_expected"]))
    rows.append(("requested (PyTorch's allocation size)", o["requested"], t["requested"]))
if capped and cap == "agent":
    rows.append(("requested (rounded)", o["requested"], t["requested"]))
    rows.append(("reserved vs PyTorch's reserved_bytes", o["reserved"], t["memory_stats"]["reserved_bytes.all.current"]))
for n, got, want in rows:
    ok = (got != "allowed_limit") if want == "not allowed_limit" else (got == want)
    print(f"| {tag} | {cap} | {n} | {want} | {got} | {'equal' if ok else 'DIFFERS'} |")
PY
}
run_one() { tag=$1; shift
  echo "### run $tag" >> $L
  ( cd $W && OUT=$W timeout 120 $B/gpufrag run --no-report --summary-json $W/$tag.run.json -- python3 $G/capped.py $tag "$@" >> $L 2>&1 ); echo "$tag run exit $?" | tee -a $R
  check $tag $W/$tag.run.json run
}
agent_one() { tag=$1; shift
  echo "### agent $tag" >> $L
  timeout 120 $B/gpufrag agent -q --keep-exited --lib $LIBCUDA --lib $C10 --summary-json $W/$tag.agent.json --duration 90 >> $L 2>&1 & AG=$!
  sleep 5
  ( cd $W && OUT=$W timeout 100 python3 $G/capped.py $tag "$@" >> $L 2>&1 ); echo "$tag program exit $?" | tee -a $R
  sleep 2; kill -INT $AG; wait $AG; echo "$tag agent exit $?" | tee -a $R
  check $tag $W/$tag.agent.json agent
}
run_one run_capped 16 20
agent_one agent_capped 16 20
run_one run_uncapped 0 400
agent_one agent_uncapped 0 400
python3 -c "import json;print('agent notes:', [n for n in json.load(open('$W/agent_capped.agent.json'))['notes'] if 'OOM' in n])" | tee -a $R
( cd $W && tar czf $OUT/limits.tgz *.json 2>/dev/null )
