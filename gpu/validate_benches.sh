#!/usr/bin/env bash
# The two speed benchmarks on the H200 host: the shim's added cost per call
# (preload/benches/shim_overhead.rs) and the eBPF probes' cost per alloc+free pair against bare
# uprobes (benches/ebpf_probe.rs). Their binaries are built here (no Rust on the device) by
# gpu/stage_benches.sh into .gpu/bench/release, laid out as target/release is, with the shim and
# simcuda beside them. ebpf_probe compiles tests/ebpf_fixtures/cuda_prog.c of this checkout.
set -u
R=$OUT/bench_results.md
export GPUFRAG_BENCH_CUDA_PROG=$PWD/tests/ebpf_fixtures/cuda_prog.c
D=$PWD/.gpu/bench/release
lscpu | grep -E "^(Model name|CPU\(s\))" | tee -a $R; uname -r | tee -a $R
echo "## shim_overhead" | tee -a $R
GPUFRAG_BENCH_THREADS=${BENCH_THREADS:-1,2,8} GPUFRAG_BENCH_DRIVERS=${BENCH_DRIVERS:-simcuda,fake,ring} timeout 280 $D/deps/shim_overhead 2>&1 | tee -a $R
echo "## ebpf_probe" | tee -a $R
GPUFRAG_BENCH_VERBOSE=1 timeout 200 $D/deps/ebpf_probe --bench 2>&1 | tee -a $R
