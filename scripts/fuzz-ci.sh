#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for a bounded time (FUZZ_SECONDS each, default 25: about two
# and a half minutes for the five), from a copy of its seed corpus so that the repository's corpus
# does not grow. Installs cargo-fuzz when it is missing (a nightly toolchain must be present).
# Prints executions and exec/s per target; exits non-zero on the first crash, leaving the input
# in fuzz/artifacts/TARGET/ (minimise it with `cargo +nightly fuzz tmin TARGET FILE`, keep it in
# fuzz/regressions/ and add a test to tests/fuzz_regressions.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${FUZZ_SECONDS:-25}"
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
cargo +nightly fuzz build -s none
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for t in snapshot snapshot_gz record feed python_frames; do
  mkdir -p "$work/$t"
  rc=0
  cargo +nightly fuzz run -s none "$t" "$work/$t" "fuzz/corpus/$t" -- \
    -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len=262144 -print_final_stats=1 \
    >"$work/$t.log" 2>&1 || rc=$?
  echo "$t: $(grep -E 'stat::number_of_executed_units|stat::average_exec_per_sec' "$work/$t.log" | tr '\n' ' ')"
  if [ "$rc" -ne 0 ]; then
    tail -40 "$work/$t.log"
    exit "$rc"
  fi
done
