#!/usr/bin/env bash
# Builds the benchmark binaries here and lays them out under .gpu/bench/release as
# target/release is (deps/<bench>, the shim, simcuda), stripped, for gpu/validate_benches.sh.
set -eu
cargo build --release --workspace
out=$(cargo bench -p gpufrag-preload --bench shim_overhead --no-run --message-format=json 2>/dev/null; cargo bench -p gpufrag --bench ebpf_probe --no-run --message-format=json 2>/dev/null)
T=${CARGO_TARGET_DIR:-target}/release
D=.gpu/bench/release; rm -rf $D; mkdir -p $D/deps $D/simcuda
for b in shim_overhead ebpf_probe; do
  exe=$(printf '%s\n' "$out" | python3 -c "import sys,json
for l in sys.stdin:
    try: m=json.loads(l)
    except ValueError: continue
    if m.get('reason')=='compiler-artifact' and m['target']['name']=='$b' and m.get('executable'): print(m['executable'])" | tail -1)
  strip -o $D/deps/$b "$exe"
done
strip -o $D/libgpufrag_preload.so $T/libgpufrag_preload.so
strip -o $D/simcuda-workload $T/simcuda-workload
for f in $T/simcuda/*; do strip -o $D/simcuda/$(basename $f) $f; done
du -sh .gpu/bench
