#!/usr/bin/env bash
# Runs every test of the workspace in the release profile, the one the README's quick start built
# (so nothing rebuilds), with the tools scripts/setup.sh installed, and ends with the skipped
# tests: their count and names (tests/tool_support logs each skip). A skip fails the run; under
# CI=true the skipping test itself fails. Extra arguments go to `cargo test` (e.g. `--test NAME`).
set -uo pipefail
cd "$(dirname "$0")/.."
ci=/opt/gpufrag-ci
rotel=$(ls "$ci"/rotel/lib/python3*/site-packages/rotel/rotel-agent 2>/dev/null | head -1)
[ -n "${ROTEL_AGENT:-}" ] || [ -z "$rotel" ] || export ROTEL_AGENT="$rotel"
[ -n "${KUBERNETES_VALIDATE:-}" ] || ! [ -x "$ci/kubernetes-validate/bin/kubernetes-validate" ] \
  || export KUBERNETES_VALIDATE="$ci/kubernetes-validate/bin/kubernetes-validate"
target=$(cargo metadata --format-version 1 --no-deps 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
export GPUFRAG_SKIP_LOG="${GPUFRAG_SKIP_LOG:-$target/tmp/gpufrag-skipped}"
rm -rf "$GPUFRAG_SKIP_LOG"
start=$(date +%s)
cargo test --workspace --release "$@"
rc=$?
skipped=()
if [ -d "$GPUFRAG_SKIP_LOG" ]; then
  while IFS= read -r f; do skipped+=("$(cat "$f")"); done < <(find "$GPUFRAG_SKIP_LOG" -type f | sort)
fi
echo
echo "tests: exit $rc after $(( $(date +%s) - start )) s; ${#skipped[@]} skipped"
for s in "${skipped[@]}"; do echo "  SKIPPED $s"; done
if [ $rc -eq 0 ] && [ ${#skipped[@]} -gt 0 ]; then
  echo "a skipped test is not a pass: install what it names (bash scripts/setup.sh) and run again"
  rc=1
fi
exit $rc
