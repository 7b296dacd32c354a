#!/usr/bin/env bash
# GPU validation of issue 16: XLA's BFC allocator (JAX) and CuPy's pool, block level, against the
# frameworks' own statistics. Runs on the device machine from the repository root with the release
# binaries carried in .gpu/bin; writes logs and a results table under $OUT (frameworks_results.md,
# frameworks_log.txt, frameworks.tar.gz with every summary and record).
#   bash gpu/validate_frameworks.sh [all|symbols|attach|agent|run|cupy|overhead]
# What to compare: every `| ... | want | got | equal |` row; want = memory_stats() (or CuPy's pool),
# got = gpufrag's summary. If the BFC symbols are not found in the plugin, the script still prints
# what nm sees and gpufrag's coverage notes, so the next session can fix the lookup.
set -u
B=$PWD/.gpu/bin; G=$PWD/gpu
W=$(mktemp -d); OUTF=$OUT; R=$OUTF/frameworks_results.md; L=$OUTF/frameworks_log.txt
WHAT=${1:-all}
want() { [ "$WHAT" = all ] || [ "$WHAT" = "$1" ]; }
LIBCUDA=$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')
PLUGIN=$(python3 -c 'import jax_plugins.xla_cuda13 as p, os; print(os.path.join(os.path.dirname(p.__file__), "xla_cuda_plugin.so"))' 2>>$L)
echo "libcuda $LIBCUDA plugin $PLUGIN" | tee -a $R
python3 -c 'import jax, jaxlib, cupy; print("jax", jax.__version__, "jaxlib", jaxlib.__version__, "cupy", cupy.__version__)' 2>&1 | tee -a $R

if want symbols || want attach || want agent; then
  echo "## BFC symbols in the plugin" | tee -a $R
  nm -C "$PLUGIN" 2>>$L | grep -c 'tsl::BFCAllocator::' | sed 's/^/.symtab BFCAllocator symbols: /' | tee -a $R
  nm -C -D "$PLUGIN" 2>>$L | grep -c 'tsl::BFCAllocator::' | sed 's/^/.dynsym BFCAllocator symbols: /' | tee -a $R
  nm -C "$PLUGIN" 2>>$L | grep -E 'tsl::BFCAllocator::(AllocateRaw|DeallocateRaw)' | tee -a $R
fi

# Compares a summary's XLA process with BFCSTATS lines of a log: rows of the results table.
compare() { # $1 label, $2 summary.json, $3 program log
python3 - "$@" <<'PY' | tee -a $R
import json, sys
label, summ, log = sys.argv[1:4]
stats = {}
for line in open(log, errors="replace"):
    if line.startswith("BFCSTATS "):
        _, when, js = line.split(" ", 2); stats[when] = json.loads(js)
try:
    s = json.load(open(summ))
except Exception as e:
    print(f"| {label} | no summary: {e} |"); sys.exit(0)
print(f"| {label} | notes | {'; '.join(s.get('notes', []))[:900]} |")
xla = [p for p in s["processes"] if p.get("framework") == "xla"]
if not xla:
    print(f"| {label} | no process with framework xla: {[ (p['pid'], p.get('framework'), p['level']) for p in s['processes']]} |")
for when in ("end", "before_oom"):
    if when in stats and xla:
        st, p = stats[when], max(xla, key=lambda p: p["reserved"])
        for n, w, g in [("bytes_in_use", st["bytes_in_use"], p["allocated"]), ("largest_free_block_bytes", st["largest_free_block_bytes"], p["largest_free_block"]),
                        ("pool_bytes", st["pool_bytes"], p["framework_reserved"])]:
            print(f"| {label} {when} | {n} | {w:,} | {g:,} | {'equal' if w == g else 'DIFFERS by %+d' % (g - w)} |")
ooms = [o for o in s.get("ooms", []) if o.get("framework") == "xla"]
if "oom" in stats:
    st = stats["oom"]
    if not ooms:
        print(f"| {label} oom | no XLA OOM in the summary: {[(o['op'], o.get('framework'), o['requested']) for o in s.get('ooms', [])]} |")
    for o in ooms[:1]:
        free = st["pool_bytes"] - st["bytes_in_use"]
        for n, w, g in [("requested (11.85 GiB)", int(11.85 * (1 << 30)) // 4 * 4, o["requested"]), ("largest_free_block_bytes", st["largest_free_block_bytes"], o["largest_free_block"]),
                        ("pool free (pool_bytes - bytes_in_use)", free, o["stranded"] + o["releasable"]), ("bytes_in_use", st["bytes_in_use"], o["allocated"])]:
            print(f"| {label} oom | {n} | {w:,} | {g:,} | {'equal' if w == g else 'DIFFERS by %+d' % (g - w)} |")
        print(f"| {label} oom | verdict | fragmentation | {o['verdict']} | {o['fix'][:200]} |")
for r in s.get("framework_stats", []):
    print(f"| {label} | framework_stats {r['framework']} {r['when']} | {r['source']} | {json.dumps(r['stats'])[:300]} |")
PY
}

launch() { # waits for $W/go, then execs the command (attach from the start)
  python3 -c "import os,sys,time
while not os.path.exists('$W/go'): time.sleep(0.01)
os.execvp(sys.argv[1], sys.argv[1:])" "$@" >> $W/prog.log 2>&1 & }

if want attach; then
  echo "## attach" | tee -a $R
  for prog in "train 60" frag; do
    tag=attach_${prog%% *}; rm -f $W/go $W/prog.log
    launch python3 $G/jax_bfc.py $prog; LP=$!
    sleep 0.5
    timeout 400 $B/gpufrag attach $LP -q --lib $LIBCUDA --lib "$PLUGIN" --summary-json $W/$tag.json --record $W/$tag.rec >> $L 2>&1 & AP=$!
    sleep 3; touch $W/go; wait $LP; echo "$tag program exit $?" | tee -a $R; sleep 1; wait $AP; echo "$tag attach exit $?" | tee -a $R
    cp $W/prog.log $W/$tag.log; cat $W/prog.log >> $L; grep -E "OOM_MESSAGE|FILLED" $W/prog.log | tee -a $R
    compare "$tag" $W/$tag.json $W/$tag.log
  done
fi

if want agent; then
  echo "## agent" | tee -a $R
  timeout 400 $B/gpufrag agent -q --keep-exited --lib $LIBCUDA --summary-json $W/agent.json --record $W/agent.rec --duration 150 >> $L 2>&1 & AG=$!
  sleep 5
  python3 $G/jax_bfc.py train 60 > $W/agent_train.log 2>&1; python3 $G/jax_bfc.py frag > $W/agent_frag.log 2>&1
  cat $W/agent_train.log $W/agent_frag.log >> $L; cat $W/agent_train.log $W/agent_frag.log > $W/agent_both.log
  kill -INT $AG 2>/dev/null; wait $AG; echo "agent exit $?" | tee -a $R
  compare agent $W/agent.json $W/agent_both.log
fi

if want run; then
  echo "## run (Python hook: memory_stats at the end and at the OOM)" | tee -a $R
  for prog in "train 60" frag; do
    tag=run_${prog%% *}
    timeout 300 $B/gpufrag run -q --no-report --no-feed --summary-json $W/$tag.json --record $W/$tag.rec -- python3 $G/jax_bfc.py $prog > $W/$tag.log 2>&1
    echo "$tag exit $?" | tee -a $R; cat $W/$tag.log >> $L
    compare "$tag" $W/$tag.json $W/$tag.log
  done
fi

if want cupy; then
  echo "## CuPy under run (MemoryHook chunks vs the pool's used/total/free)" | tee -a $R
  for arg in end oom; do
    timeout 300 $B/gpufrag run -q --no-report --no-feed --summary-json $W/cupy_$arg.json --record $W/cupy_$arg.rec -- python3 $G/cupy_pool.py $arg > $W/cupy_$arg.log 2>&1
    echo "cupy $arg exit $?" | tee -a $R; cat $W/cupy_$arg.log >> $L
    python3 - $W/cupy_$arg.json $W/cupy_$arg.log $arg <<'PY' | tee -a $R
import json, sys
s = json.load(open(sys.argv[1])); arg = sys.argv[3]
pool = [json.loads(l.split(" ", 1)[1]) for l in open(sys.argv[2]) if l.startswith("POOL ")][0]
print("| cupy", arg, "| notes |", "; ".join(s["notes"])[:600], "|")
# the figures at the failure (oom) or the pool's at the end, from the stats the hook read at exit
reads = {r["when"]: r["stats"] for r in s.get("framework_stats", []) if r["framework"] == "cupy"}
for when, st in reads.items():
    for k in ("used_bytes", "total_bytes", "free_bytes"):
        print(f"| cupy {arg} | hook read {when} {k} | {pool[k]:,} (printed) | {st[k]:,} | {'equal' if pool[k] == st[k] else 'differs (read at another moment)'} |")
ooms = [o for o in s["ooms"] if o.get("framework") == "cupy"]
if ooms:
    o = ooms[0]
    for n, w, g in [("used_bytes", pool["used_bytes"], o["allocated"]), ("total_bytes", pool["total_bytes"], o["reserved"]), ("free_bytes", pool["free_bytes"], o["stranded"] + o["releasable"])]:
        print(f"| cupy oom | {n} at the OOM | {w:,} | {g:,} | {'equal' if w == g else 'DIFFERS by %+d' % (g - w)} |")
    print("| cupy oom | verdict |", o["verdict"], "|", o["fix"][:200], "|")
p = [p for p in s["processes"] if p.get("framework") == "cupy"]
print("| cupy", arg, "| process framework / level |", [(q["framework"], q["level"]) for q in p], "|")
PY
  done
fi

if want overhead; then
  echo "## overhead: a JAX training step, bare vs under the agent (with the BFC probes), alternated" | tee -a $R
  for round in 1 2 3 4 5; do
    bare=$(python3 $G/jax_bfc.py bench 300 2>>$L | awk '/STEP_MS/{print $2}')
    timeout 200 $B/gpufrag agent -q --lib $LIBCUDA --duration 90 --summary-json $W/ovh_$round.json >> $L 2>&1 & AG=$!
    sleep 4
    traced=$(python3 $G/jax_bfc.py bench 300 2>>$L | awk '/STEP_MS/{print $2}')
    kill -INT $AG 2>/dev/null; wait $AG
    echo "| round $round | bare $bare ms | agent $traced ms | ratio $(python3 -c "print('%.4f' % ($traced/$bare))" 2>/dev/null) |" | tee -a $R
    grep -o 'XLA BFC[^"]*' $W/ovh_$round.json | head -1 | tee -a $R
  done
fi
cd $W && tar czf $OUTF/frameworks.tar.gz *.json *.log 2>/dev/null; true
