#!/usr/bin/env bash
# The README's two commands, verbatim, on a fresh Debian 12 system that has only a clone of this
# repository: a privileged podman container of the debootstrap base image the container test
# builds (scripts/container-base-image.sh), in the host's process namespace, with this machine's Rust toolchain mounted read-only
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
# A network that inspects TLS with its own authority (as this repository's build machines do) needs
# that authority inside the container too: the host's bundle is passed to apt's, pip's and cargo's
# clients. A machine on an open network needs none of it; nothing else of the host is passed.
ca=()
if [ -r /etc/ssl/certs/ca-certificates.crt ]; then
  ca=(-v /etc/ssl/certs/ca-certificates.crt:/opt/host-ca.crt:ro -e PIP_CERT=/opt/host-ca.crt
      -e SSL_CERT_FILE=/opt/host-ca.crt -e REQUESTS_CA_BUNDLE=/opt/host-ca.crt -e CARGO_HTTP_CAINFO=/opt/host-ca.crt)
fi
run() {
  # The host's process namespace (`--pid host`), as the DaemonSet's `hostPID: true`: the eBPF
  # probes report pids of the kernel's initial namespace, which /proc names only there (in a
  # private one every traced process reads as gone, and its container is unknown).
  # The host's hard open-files limit bounds the container's (podman's default exceeds it on some
  # hosts); a larger process limit is refused there too (root in the privileged container is not bound
  # by it: CAP_SYS_RESOURCE).
  podman --runtime runc run --rm --privileged --pid host --network host \
    --ulimit "nofile=$(ulimit -Hn):$(ulimit -Hn)" --ulimit nproc=1000:1000 \
    -v "$clone/gpufrag:/src" -w /src -v "$clone/containers:/var/lib/containers" \
    -v "$rustup_home:/opt/rustup:ro" -v "$cargo_home/bin:/opt/cargo/bin:ro" -v "$cargo_home/registry:/opt/cargo/registry" \
    "${ca[@]}" \
    -e RUSTUP_HOME=/opt/rustup -e CARGO_HOME=/opt/cargo -e PATH=/opt/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    "$image" bash -c "$1"
}
# The tests' own containers (podman inside this one) keep their storage on a folder of the host:
# podman's overlay driver refuses a graph root on the container's overlayfs.
mkdir -p "$clone/containers"
# Both commands run in one container, one after the other, so the second finds what the first
# installed (as on a real machine).
set +e
run "set -o pipefail; s=\$(date +%s); ( ${cmds[0]} ) 2>&1 | tail -40; r1=\$?; m=\$(date +%s); ( ${cmds[1]} ) > /src/tests.log 2>&1; r2=\$?; tail -60 /src/tests.log; e=\$(date +%s); echo \"TIMES main=\$((m-s))s rc=\$r1 tests=\$((e-m))s rc=\$r2\"; [ \$r1 = 0 ] && [ \$r2 = 0 ]" | tee "$out/fresh-debian.log"
rc=${PIPESTATUS[0]}
set -e
{
  echo "# README's two commands in a fresh Debian 12 container"
  echo
  grep '^TIMES' "$out/fresh-debian.log" || echo "no times: the run did not finish"
  grep -E '^tests: exit|SKIPPED' "$out/fresh-debian.log" || true
} > "$out/fresh-debian.md"
cat "$out/fresh-debian.md"
# The tests' whole output (the log above keeps its last 60 lines): a failure's own lines.
cp "$clone/gpufrag/tests.log" "$out/tests.log" 2>/dev/null || true
rm -rf "$clone"
exit "$rc"
