#!/usr/bin/env bash
# The README's two commands, verbatim, on a fresh Debian 12 system that has only a clone of this
# repository: a privileged podman container of the debootstrap base image the container test
# builds (scripts/container-base-image.sh), with this machine's Rust toolchain mounted read-only
# (rustup's servers may be out of reach; the image has no Rust) and crates.io's cache mounted so
# that nothing is downloaded twice. Prints each command's time and the tests' skip summary, and
# writes them to $OUT/fresh-debian.md. A full build on 2 cores: about an hour.
# Usage: OUT=DIR bash scripts/fresh-debian-check.sh   (runs as root)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-/tmp/gpufrag-fresh-debian}"; mkdir -p "$out"
image=$(bash scripts/container-base-image.sh)
clone=$(mktemp -d /var/tmp/gpufrag-fresh.XXXXXX)
git clone -q --no-local "$PWD" "$clone/gpufrag"
# The two commands of README.md's quick start, cut out of it word for word.
mapfile -t cmds < <(python3 - README.md <<'PY'
import re, sys
text = open(sys.argv[1]).read()
quick = text[text.index("## Quick start"):]
quick = quick[:quick.index("\n## ", 3)]
for block in re.findall(r"```\n(.*?)\n```", quick, re.S)[:2]:
    print(block.strip())
PY
)
[ ${#cmds[@]} -eq 2 ] || { echo "fresh-debian-check: README's quick start should hold two commands, found ${#cmds[@]}" >&2; exit 1; }
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}; cargo_home=${CARGO_HOME:-$HOME/.cargo}
run() {
  podman run --rm --privileged --network host \
    -v "$clone/gpufrag:/src" -w /src \
    -v "$rustup_home:/opt/rustup:ro" -v "$cargo_home/bin:/opt/cargo/bin:ro" -v "$cargo_home/registry:/opt/cargo/registry" \
    -e RUSTUP_HOME=/opt/rustup -e CARGO_HOME=/opt/cargo -e PATH=/opt/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    "$image" bash -c "$1"
}
# Both commands run in one container, one after the other, so the second finds what the first
# installed (as on a real machine).
set +e
run "set -o pipefail; s=\$(date +%s); ( ${cmds[0]} ) 2>&1 | tail -40; r1=\$?; m=\$(date +%s); ( ${cmds[1]} ) 2>&1 | tail -60; r2=\$?; e=\$(date +%s); echo \"TIMES main=\$((m-s))s rc=\$r1 tests=\$((e-m))s rc=\$r2\"; [ \$r1 = 0 ] && [ \$r2 = 0 ]" | tee "$out/fresh-debian.log"
rc=${PIPESTATUS[0]}
set -e
{
  echo "# README's two commands in a fresh Debian 12 container"
  echo
  grep '^TIMES' "$out/fresh-debian.log" || echo "no times: the run did not finish"
  grep -E '^tests: exit|SKIPPED' "$out/fresh-debian.log" || true
} > "$out/fresh-debian.md"
cat "$out/fresh-debian.md"
rm -rf "$clone"
exit "$rc"
