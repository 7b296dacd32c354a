#!/usr/bin/env bash
# Diagnosis of the agent's PyTorch block figures (issue 22 item 3, issue 26 item 3): the same
# seeded resnet50 training (validate_truth.sh's resnet.py, 12 steps, roundup_power2_divisions:4)
# under `run` with the tracker (PyTorch's own block sizes) and under `agent` with libc10_cuda
# named, each with its record and PyTorch's memory_stats(); then validate_firstcall.sh's
# torch_first.py under the agent with no --lib; then how libc10_cuda's malloc is called (inlined
# into allocate or not) and where the memory-fraction setter is. The records come back for
# offline comparison. Run from the repository root as `OUT=DIR bash gpu/diag_agent_blocks.sh`.
set -u
B=$PWD/.gpu/bin; mkdir -p "$OUT"; W=$(mktemp -d); L=$OUT/diag_log.txt
LIBCUDA=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
TL=$(python3 -c 'import torch,os;print(os.path.join(os.path.dirname(torch.__file__),"lib"))')
C10=$TL/libc10_cuda.so
sed -n "/^cat > \$W\/resnet.py <<'PY'/,/^PY/p" gpu/validate_truth.sh | sed '1d;$d' > $W/resnet.py
sed -n "/^cat > \$W\/torch_first.py <<'PY'/,/^PY/p" gpu/validate_firstcall.sh | sed '1d;$d' > $W/torch_first.py
export PYTORCH_CUDA_ALLOC_CONF=roundup_power2_divisions:4
[ "${DIAG_RUN:-1}" = 1 ] && timeout 120 $B/gpufrag run --no-report --no-feed --summary-json $OUT/resnet.run.json --record $OUT/resnet.run.rec -- python3 $W/resnet.py $OUT/resnet.run.torch.json 12 > $OUT/resnet.run.out 2>&1
echo "run rc $?" >> $L
timeout 150 $B/gpufrag agent -q --keep-exited --lib $LIBCUDA --lib $C10 --summary-json $OUT/resnet.agent.json --record $OUT/resnet.agent.rec --duration 120 > $OUT/resnet.agent.out 2>&1 & AG=$!
sleep 4; python3 $W/resnet.py $OUT/resnet.agent.torch.json 12 >> $L 2>&1; sleep 1; kill -INT $AG; wait $AG
unset PYTORCH_CUDA_ALLOC_CONF
# validate_truth.sh's fraction.py under the agent: the OOM's allowed bytes against PyTorch's.
sed -n "/^cat > \$W\/fraction.py <<'PY'/,/^PY/p" gpu/validate_truth.sh | sed '1d;$d' > $W/fraction.py
timeout 150 $B/gpufrag agent -q --keep-exited --lib $LIBCUDA --lib $C10 --summary-json $OUT/fraction.agent.json --duration 120 > $OUT/fraction.agent.out 2>&1 & AG=$!
sleep 4; python3 $W/fraction.py $OUT/fraction.torch.json >> $L 2>&1; sleep 1; kill -INT $AG; wait $AG
python3 - $OUT <<'PY' | tee $OUT/judged.txt
import json, sys
o = sys.argv[1]
def load(f):
    try: return json.load(open(f"{o}/{f}"))
    except Exception as e: return {"error": str(e)}
for tag in ["resnet", "first"]:
    s, t = load(f"{tag}.agent.json"), load(f"{tag}.agent.torch.json" if tag == "resnet" else "first.torch.json")
    p = [p for p in s.get("processes", []) if p.get("pid") == t.get("pid")]
    if not p: print(f"FAIL agent_{tag} no process ({t})"); continue
    p = p[0]; ok = p["allocated"] == t["allocated"] and p["framework_reserved"] == t["reserved"]
    print(f"{'PASS' if ok else 'FAIL'} agent_{tag} allocated torch={t['allocated']:,} agent={p['allocated']:,} ({p['allocated']-t['allocated']:+,}) reserved torch={t['reserved']:,} agent={p['framework_reserved']:,}")
s, t = load("fraction.agent.json"), load("fraction.torch.json")
oo = [x for x in s.get("ooms", []) if x.get("pid") == t.get("pid")]
got = oo[0].get("allowed") if oo else None
print(f"{'PASS' if oo and got == t.get('allowed') and oo[0]['verdict'] == 'allowed_limit' else 'FAIL'} fraction_allowed_agent torch={t.get('allowed')} agent={got} verdict={oo[0]['verdict'] if oo else None}")
PY
timeout 150 $B/gpufrag agent -q --keep-exited --summary-json $OUT/first.agent.json --record $OUT/first.agent.rec --duration 120 > $OUT/first.agent.out 2>&1 & AG=$!
sleep 4; python3 $W/torch_first.py $OUT/first.torch.json >> $L 2>&1; sleep 1; kill -INT $AG; wait $AG
{
  echo "## symbols"; for f in $C10 $TL/libtorch_python.so $TL/libc10.so; do
    echo "### $f"; readelf -S -W $f | grep -E 'symtab|dynsym|stapsdt' ; nm -D --defined-only $f 2>/dev/null | grep -iE 'MemoryFraction|NativeCachingAllocator6malloc|local_raw_delete|raw_alloc|raw_delete|reportOutOfMemory' | head -20
    nm --defined-only $f 2>/dev/null | grep -iE 'MemoryFraction' | head -10
  done
  echo "## calls to malloc inside NativeCachingAllocator::allocate"
  A=$(nm -D --defined-only $C10 | grep -E 'NativeCachingAllocator8allocateEm$' | awk '{print $1}')
  M=$(nm -D --defined-only $C10 | grep -E 'NativeCachingAllocator6mallocEPPvamP11CUstream_st$' | awk '{print $1}')
  echo "allocate at $A, malloc at $M"
  nm -D --defined-only $C10 | grep -E 'NativeCachingAllocator' | head -40
  [ -n "$A" ] && objdump -d --no-show-raw-insn --start-address=0x$A --stop-address=$(printf '0x%x' $((0x$A + 1600))) $C10 | grep -E 'call' | head -40
} > $OUT/symbols.txt 2>&1
python3 -c 'import torch; print(torch.__version__)' >> $OUT/symbols.txt
( cd $OUT && tar czf diag.tgz *.json *.out *.txt *.rec 2>/dev/null )
