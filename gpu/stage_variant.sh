#!/usr/bin/env bash
# Lays out one build of the shim for gpu/ab_shim.sh: the newest shim_overhead bench binary, the
# shim, simcuda and its workload of TARGET_DIR/release (default target/), stripped, under
# .gpu/NAME/release as target/release is. Build first:
#   cargo build --release -p gpufrag-preload -p simcuda-workload
#   cargo bench -p gpufrag-preload --bench shim_overhead --no-run
# To compare shims alone, copy one harness binary into every variant (docs/benchmarks.md).
# Usage: bash gpu/stage_variant.sh NAME [TARGET_DIR]
set -eu
name=$1; T=${2:-target}/release
D=.gpu/$name/release; rm -rf $D; mkdir -p $D/deps $D/simcuda
exe=$(ls -t $T/deps/shim_overhead-* | grep -v '\.d$' | head -1)
strip -o $D/deps/shim_overhead $exe
strip -o $D/libgpufrag_preload.so $T/libgpufrag_preload.so
strip -o $D/simcuda-workload $T/simcuda-workload
for f in $T/simcuda/*; do strip -o $D/simcuda/$(basename $f) $f; done
du -sh $D
