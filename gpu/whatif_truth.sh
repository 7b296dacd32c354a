#!/usr/bin/env bash
# Ground truth for `gpufrag whatif` on a GPU machine: three deterministic PyTorch workloads of
# different kinds (gpu/whatif_workload.py: train, kvcache, frag), each run once per allocator
# setting in a fresh process with the allocator history on, first without a memory limit, then
# under limits (set_per_process_memory_fraction) chosen from the unlimited runs so that some
# settings OOM and others do not. Runs from the repository root; needs only PyTorch.
# Writes $OUT/whatif_truth.tgz (every run's snapshot pickle.gz and JSON, limits.txt, runs.txt)
# and $OUT/whatif_truth.md (the table). A few minutes on one H200.
# usage: OUT=DIR gpu/whatif_truth.sh [WORKLOADS...]   (default: train kvcache frag)
set -u
G=$PWD/gpu; W=$(mktemp -d); OUT_FINAL=$OUT; export G W OUT=$W
WORKLOADS=${*:-train kvcache frag}
# "-" stands for PyTorch's defaults (an empty PYTORCH_CUDA_ALLOC_CONF); the index is the tag's sN
SETTINGS="- expandable_segments:True max_split_size_mb:256 max_split_size_mb:64 roundup_power2_divisions:4
  garbage_collection_threshold:0.8 max_split_size_mb:128,garbage_collection_threshold:0.6
  expandable_segments:True,roundup_power2_divisions:4"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $W/device.txt
# a job line: WORKLOAD TAG LIMIT_BYTES|none CONF
jobs() { for w in $1; do i=0; for c in $SETTINGS; do echo "$w ${w}_s${i}_$2 $3 $c"; i=$((i+1)); done; done; }
one='c=$4; [ "$c" = - ] && c=; PYTORCH_CUDA_ALLOC_CONF=$c timeout 120 python3 "$G/whatif_workload.py" $1 $2 $3 > "$W/$2.log" 2>&1; echo "$2 rc $?" >> "$W/runs.txt"'
start=$(date +%s)
# 1. no limit, two at a time (an unlimited run can take tens of GB)
jobs "$WORKLOADS" nolimit none | xargs -P 2 -L 1 bash -c "$one" _
# a run without a limit must not OOM for want of device memory its neighbour took: rerun it alone
for t in $(python3 $G/whatif_truth_summary.py oomed-nolimit $W); do
  jobs "${t%%_s*}" nolimit none | grep " $t " | xargs -L 1 bash -c "$one" _; done
# 2. limits chosen from what the unlimited runs measured (bytes, 2 MiB multiples), four at a time
python3 $G/whatif_truth_summary.py limits $W $WORKLOADS > $W/limits.txt; cat $W/limits.txt
while read -r w name lim; do jobs "$w" "$name" "$lim"; done < $W/limits.txt | xargs -P 4 -L 1 bash -c "$one" _
echo "seconds $(( $(date +%s) - start ))" >> $W/runs.txt
python3 $G/whatif_truth_summary.py table $W > $OUT_FINAL/whatif_truth.md
cp $W/runs.txt $OUT_FINAL/whatif_runs.txt
(cd $W && tar czf $OUT_FINAL/whatif_truth.tgz *.pickle.gz *.json *.txt *.log)
ls -l $OUT_FINAL; tail -3 $W/runs.txt
