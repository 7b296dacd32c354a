#!/usr/bin/env bash
# A/B of shim builds on the H200 host, in one device call (calls land on different machines:
# only rows of one call compare). Each .gpu/<variant>/release holds the same shim_overhead
# harness with a different libgpufrag_preload.so beside it (staged here, see docs/benchmarks.md).
# Usage: VARIANTS="v0 v1 v2" ROUNDS=3 bash gpu/ab_shim.sh
set -u
R=$OUT/ab_results.md
lscpu | grep -E "^(Model name|CPU\(s\)|Thread|Core|Socket)" | tee -a $R
for r in $(seq 1 ${ROUNDS:-2}); do
  for v in ${VARIANTS:-v0 v1}; do
    echo "## round $r, $v" | tee -a $R
    GPUFRAG_BENCH_THREADS=${BENCH_THREADS:-1,8} GPUFRAG_BENCH_DRIVERS=fake timeout 200 .gpu/$v/release/deps/shim_overhead 2>&1 | tee -a $R
  done
done
