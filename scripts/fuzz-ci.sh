#!/usr/bin/env bash
# Runs every fuzz target of fuzz/ for a bounded time (FUZZ_SECONDS each, default 25: about two
# minutes for the five, plus the build), from the seed corpus kept in fuzz/corpus/TARGET/ (read
# only: new inputs go to a scratch directory, so the repository's corpus does not grow).
# Installs cargo-fuzz when it is missing; a nightly toolchain must be present (.ci/run installs
# both). Prints executions and executions per second per target. Fails on the first crash, hang
# (over 10 s for one input) or input that takes more than 2 GiB, printing the path of the input
# that did it (fuzz/artifacts/TARGET/...): minimise it with `cargo +nightly fuzz tmin TARGET FILE`,
# keep it in fuzz/regressions/ under a name saying what it provoked and add a test to
# tests/fuzz_regressions.rs.
#
#   bash scripts/fuzz-ci.sh                      # every target, FUZZ_SECONDS=25
#   FUZZ_SECONDS=300 bash scripts/fuzz-ci.sh record
set -euo pipefail
cd "$(dirname "$0")/.."
secs="${FUZZ_SECONDS:-25}"
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(snapshot snapshot_gz record feed python_frames)
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
t0=$(date +%s)
cargo +nightly fuzz build -s none
echo "fuzz build: $(( $(date +%s) - t0 )) s"
# cargo-fuzz builds into $CARGO_TARGET_DIR when it is set (as cargo does), else fuzz/target.
case "${CARGO_TARGET_DIR:-}" in
  "") target_dir=fuzz/target ;;
  /*) target_dir=$CARGO_TARGET_DIR ;;
  *) target_dir=$PWD/$CARGO_TARGET_DIR ;;
esac
bins="$target_dir/$(rustc +nightly -vV | sed -n 's/^host: //p')/release"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for t in "${targets[@]}"; do
  [ -d "fuzz/corpus/$t" ] || { echo "fuzz target $t has no corpus in fuzz/corpus/$t"; exit 1; }
  mkdir -p "$work/$t" "fuzz/artifacts/$t"
  rc=0
  # The binary cargo-fuzz built, run directly: `cargo fuzz run` would check the build again.
  "$bins/$t" "$work/$t" "fuzz/corpus/$t" \
    -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10 -max_len=262144 -print_final_stats=1 \
    -artifact_prefix="fuzz/artifacts/$t/" >"$work/$t.log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$work/$t.log" | tail -1)
  rss=$(sed -n 's/^stat::peak_rss_mb: *//p' "$work/$t.log" | tail -1)
  if [ "$rc" -ne 0 ]; then
    tail -40 "$work/$t.log"
    input=$(sed -n 's/.*Test unit written to \(.*\)$/\1/p' "$work/$t.log" | tail -1)
    echo "fuzz target $t FAILED (exit $rc) after ${execs:-?} executions; the input: ${input:-see the log above}"
    exit "$rc"
  fi
  if [ -z "$execs" ]; then
    tail -40 "$work/$t.log"
    echo "fuzz target $t printed no statistics: it did not run"
    exit 1
  fi
  echo "fuzz target $t: $execs executions in ${secs} s, $rate exec/s, peak RSS ${rss} MB, no crash"
done
