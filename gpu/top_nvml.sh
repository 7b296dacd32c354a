#!/usr/bin/env bash
# GPU check of top's NVML columns (issue 27 item 4): a PyTorch process (gpu/top_nvml_step.py,
# 8 GiB held, matmuls running) under `gpufrag run`; meanwhile `gpufrag top --once` at 120 and 80
# columns, and nvidia-smi at the same moment. PASS when: the device row names the GPU as
# nvidia-smi does (or its shortened form), shows a utilization percentage, and the process's
# "nvml used" equals nvidia-smi's used_memory for that pid (GiB, 2 decimals), at both widths.
# Runs on the device machine from the repository root (binaries in .gpu/bin), about 40 s; writes
# top_nvml_results.md and top_nvml_log.txt under $OUT.
set -u
B=$PWD/.gpu/bin; G=$PWD/gpu
R=$OUT/top_nvml_results.md; L=$OUT/top_nvml_log.txt
export XDG_RUNTIME_DIR=$(mktemp -d); chmod 700 "$XDG_RUNTIME_DIR"
W=$(mktemp -d)
( OUT=$W DURATION=25 timeout 120 $B/gpufrag run --quiet --no-report -- python3 $G/top_nvml_step.py >> $L 2>&1 ) & RUN=$!
for i in $(seq 1 60); do [ -s $W/top_nvml_pid ] && break; sleep 0.5; done
sleep 10
pid=$(cat $W/top_nvml_pid)
$B/gpufrag top --once --width 120 > $W/top120.txt 2>> $L
$B/gpufrag top --once --width 80 > $W/top80.txt 2>> $L
nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > $W/smi_apps.txt
nvidia-smi --query-gpu=name,utilization.gpu --format=csv,noheader,nounits > $W/smi_gpu.txt
wait $RUN; echo "run exit $?" | tee -a $R
{ echo "### top --once --width 120"; cat $W/top120.txt; echo "### top --once --width 80"; cat $W/top80.txt
  echo "### nvidia-smi"; cat $W/smi_apps.txt $W/smi_gpu.txt; } | tee -a $L >> $R
python3 - "$pid" $W/top120.txt $W/top80.txt $W/smi_apps.txt $W/smi_gpu.txt <<'PY' | tee -a $R
import re, sys
pid, t120, t80, apps, gpu = sys.argv[1], open(sys.argv[2]).read(), open(sys.argv[3]).read(), open(sys.argv[4]).read(), open(sys.argv[5]).read()
used_mib = {l.split(",")[0].strip(): int(l.split(",")[1]) for l in apps.strip().splitlines() if "," in l}
name, util = [x.strip() for x in gpu.strip().splitlines()[0].split(",")]
want = f"{used_mib.get(pid, -1) / 1024:.2f} GiB"
print(f"nvidia-smi: {name}, utilization {util} %, pid {pid} uses {used_mib.get(pid)} MiB = {want}")
rows = []
for width, text in (("120", t120), ("80", t80)):
    prow = [l for l in text.splitlines() if re.search(rf"\bpid {pid}\b", l)]
    dev = [l for l in text.splitlines() if "gpu 0" in l and "pid " not in l]
    short = name.replace("NVIDIA ", "").split()[0]
    rows.append((f"{width} cols: device row names the GPU ({short})", bool(dev) and short in dev[0]))
    rows.append((f"{width} cols: device row has a utilization %", bool(dev) and re.search(r"\b\d+ ?%", dev[0]) is not None))
    rows.append((f"{width} cols: pid row shows nvml used {want}", bool(prow) and want in prow[0]))
    rows.append((f"{width} cols: no line wider than {width}", all(len(l) <= int(width) for l in text.splitlines())))
for n, ok in rows:
    print(f"- {n}: {'PASS' if ok else 'FAIL'}")
print("TOP_NVML " + ("PASS" if all(ok for _, ok in rows) else "FAIL"))
PY
