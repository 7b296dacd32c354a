#!/usr/bin/env bash
# Checks that the tests' build rebuilds nothing of the quick start's: every crate that
# `cargo build --release --workspace` compiles must resolve to the same features once the
# dev-dependencies are in (`cargo test`), else cargo compiles it, and all that depends on it,
# a second time. Prints each crate whose features differ and fails; Cargo.toml says how to fix.
set -euo pipefail
cd "$(dirname "$0")/.."
units() { cargo tree --workspace --locked -f "{p} {f}" --prefix none "$@" | grep -E '^[^ ]+ v[0-9]' \
  | sed 's/ (\*)//; s/ (proc-macro)//; s/ ([^)]*)//' | sort -u; }
build=$(units -e normal,build)
tests=$(units -e normal,build,dev)
drift=$(comm -23 <(echo "$build") <(echo "$tests"))
if [ -n "$drift" ]; then
  echo "check-features: these crates of the quick start's build change features under the tests' build (they and their dependents rebuild):"
  echo "$drift" | sed 's/^/  /'
  echo "declare the features the dev-dependencies add in Cargo.toml's [dependencies] (see the comment there)"
  exit 1
fi
echo "check-features: the tests' build shares all $(echo "$build" | wc -l) units of the quick start's build"
