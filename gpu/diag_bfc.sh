#!/usr/bin/env bash
# Diagnosis of the XLA BFC block map under attach/agent (issue 16) and facts for issues 13 and 15:
# records of attach and agent runs on JAX, the per-step event count of the overhead bench, PyTorch
# 2.11's allocator header (TraceEntry, OOM observer) and the symbols an OOM probe would use.
#   OUT=DIR bash gpu/diag_bfc.sh   (on the device machine, binaries in .gpu/bin)
set -u
B=$PWD/.gpu/bin; G=$PWD/gpu; W=$(mktemp -d); D=$OUT/d; mkdir -p $D
LIBCUDA=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
PLUGIN=$(python3 -c 'import jax_plugins.xla_cuda13 as p, os; print(os.path.join(os.path.dirname(p.__file__), "xla_cuda_plugin.so"))')
nm -C "$PLUGIN" | grep 'tsl::BFCAllocator::' > $D/bfc_syms.txt
launch() { python3 -c "import os,sys,time
while not os.path.exists('$W/go'): time.sleep(0.01)
os.execvp(sys.argv[1], sys.argv[1:])" "$@" > $D/$tag.log 2>&1 & }
for prog in "train 12" frag; do
  tag=attach_${prog%% *}; rm -f $W/go
  launch python3 $G/jax_bfc.py $prog; LP=$!
  sleep 0.5
  timeout 200 $B/gpufrag attach $LP -q --lib $LIBCUDA --lib "$PLUGIN" --summary-json $D/$tag.json --record $D/$tag.rec > $D/$tag.attach.txt 2>&1 & AP=$!
  sleep 3; touch $W/go; wait $LP; echo "prog exit $?" >> $D/$tag.attach.txt; wait $AP; echo "attach exit $?" >> $D/$tag.attach.txt
done
# the overhead bench under the agent, with a record to count events per step
python3 $G/jax_bfc.py bench 200 > $D/bench_bare.log 2>&1
timeout 120 $B/gpufrag agent -q --lib $LIBCUDA --duration 60 --summary-json $D/bench_agent.json --record $D/bench_agent.rec > $D/bench_agent.txt 2>&1 & AG=$!
sleep 4; python3 $G/jax_bfc.py bench 200 > $D/bench_agent.log 2>&1; kill -INT $AG; wait $AG
python3 $G/jax_bfc.py bench 200 > $D/bench_bare2.log 2>&1
TI=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/include
cp $TI/c10/cuda/CUDACachingAllocator.h $TI/c10/core/CachingDeviceAllocator.h $D/ 2>/dev/null
cp $TI/c10/cuda/CUDAAllocatorConfig.h $D/ 2>/dev/null
TL=$(python3 -c 'import torch,os;print(os.path.dirname(torch.__file__))')/lib
( nm -D -C $TL/libc10.so | grep -i 'OutOfMemoryError' ; echo ---; nm -D -C $TL/libc10_cuda.so | grep -iE 'setMemoryFraction|attachAllocatorTraceTracker|attachOutOfMemoryObserver|OutOfMemory' ; echo ---; nm -C $TL/libc10_cuda.so | grep -ciE 'DeviceCachingAllocator' ; nm -C $TL/libc10_cuda.so | grep -iE 'setMemoryFraction|::malloc\(' | head; echo ---; ldconfig -p | grep stdc++; nm -D $(ldconfig -p | awk '/libstdc\+\+.so.6 /{print $NF; exit}') | grep cxa_throw ) > $D/torch_syms.txt 2>&1
( echo --- usdt; readelf -n $TL/libc10_cuda.so | grep -A4 stapsdt | head -60; echo --- profiler; nm -D -C $TL/libc10.so | grep -iE 'reportOutOfMemory|reportMemoryUsage'; echo --- ztI; nm -D $TL/libc10.so | grep -E '_ZTIN3c1017OutOfMemoryErrorE|_ZTIN3c105ErrorE' ) >> $D/torch_syms.txt 2>&1
python3 -c 'import torch; print(torch.__version__); import torch.cuda.memory as m; print([n for n in dir(torch._C) if "observer" in n.lower() or "tracker" in n.lower()])' >> $D/torch_syms.txt 2>&1
cd $OUT && tar czf diag.tgz d && rm -rf d
