#!/usr/bin/env bash
# GPU validation of `gpufrag run` (LD_PRELOAD shim + Python hook) against real PyTorch, JAX and
# CuPy. Runs on the device machine from the repository root with the release binaries carried in
# .gpu/bin; writes logs and a results table under $OUT.
set -u
B=$PWD/.gpu/bin; G=$PWD/gpu; S=$PWD/shared/gpu; [ -d "$S" ] || S=$PWD/.gpu/shared
W=$(mktemp -d); cd "$W"; export OUT_FINAL=$OUT; export OUT=$W
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a $OUT_FINAL/results.md
python3 -c 'import torch; print("torch", torch.__version__, "oom observer", hasattr(torch._C, "_cuda_attach_out_of_memory_observer"))' | tee -a $OUT_FINAL/results.md
run() { tag=$1; shift; echo "### $tag" >> $OUT_FINAL/log.txt; timeout 300 "$B/gpufrag" run --summary-json $W/$tag.summary.json --record $W/$tag.rec -- "$@" >> $OUT_FINAL/log.txt 2>&1; echo "$tag exit $?" | tee -a $OUT_FINAL/results.md; python3 $G/record_kinds.py $W/$tag.rec | sed "s/^/$tag events: /" | tee -a $OUT_FINAL/results.md; }
run frag_oom python3 $S/frag_oom.py frag
grep -A3 "OOM in pid" $OUT_FINAL/log.txt | head -8 | tee -a $OUT_FINAL/results.md
grep OOM_MESSAGE $OUT_FINAL/log.txt | head -2 | tee -a $OUT_FINAL/results.md
python3 -c "import json;s=json.load(open('$W/frag_oom.summary.json'));[print('frag_oom verdict',o['verdict'],'requested',o['requested'],'device_free',o['device_free'],'stranded',o['stranded'],'largest_free_block',o['largest_free_block'],'op',o['op']) for o in s['ooms']]" | tee -a $OUT_FINAL/results.md
for mode in default expandable async; do
  case $mode in default) conf="";; expandable) conf="expandable_segments:True";; async) conf="backend:cudaMallocAsync";; esac
  # cudaMallocAsync has no snapshot for the hook to take at exit: its blocks are the pool's
  # allocations, and hold_exit.py ends the process when PyTorch's figures are written (see there)
  hold=""; [ $mode = async ] && hold=$G/hold_exit.py
  PYTORCH_CUDA_ALLOC_CONF=$conf run gpt_$mode python3 $hold $G/torch_workload.py gpt_$mode 6
  python3 $G/compare.py $W/gpt_$mode.summary.json $W/gpt_$mode.torch.json gpt_$mode | tee -a $OUT_FINAL/results.md
done
# memory_viz export of a capture made without code changes, read by PyTorch's own tool
timeout 300 "$B/gpufrag" run -q --memviz $W/gpt_mv.pickle --summary-json $W/gpt_mv.summary.json -- python3 $G/torch_workload.py gpt_mv 3 >> $OUT_FINAL/log.txt 2>&1
ls $W/gpt_mv*.pickle | tee -a $OUT_FINAL/results.md
for f in $W/gpt_mv*.pickle; do python3 -m torch.cuda._memory_viz stats $f 2>&1 | head -20 | sed 's/^/memviz stats: /' | tee -a $OUT_FINAL/results.md; "$B/gpufrag" analyze --json $f > $W/gpt_mv.reanalyzed.json 2>>$OUT_FINAL/log.txt; python3 -c "import json;a=json.load(open('$W/gpt_mv.reanalyzed.json'))['devices'][0];print('memviz re-analyzed', {k:a[k] for k in ['reserved','allocated','stranded','largest_free_block','segments']})" | tee -a $OUT_FINAL/results.md; done
python3 $G/compare.py $W/gpt_mv.summary.json $W/gpt_mv.torch.json gpt_mv | tee -a $OUT_FINAL/results.md
run jax python3 $G/jax_alloc.py
run cupy python3 $G/cupy_alloc.py
grep -E "^(JAX|CUPY)" $OUT_FINAL/log.txt | tee -a $OUT_FINAL/results.md
for t in jax cupy; do python3 -c "import json;s=json.load(open('$W/$t.summary.json'));print('$t', [(d['device'],d['reserved'],d['allocated'],d['segments'],d['level']) for d in s['devices']])" | tee -a $OUT_FINAL/results.md; done
tar czf $OUT_FINAL/summaries.tgz *.summary.json *.torch.json frag*.json gpt_async.rec 2>/dev/null
