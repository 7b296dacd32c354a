#!/usr/bin/env bash
# Installs what building gpufrag needs on Debian 12 beyond Rust: a C compiler (simcuda's tests,
# libbpf), clang (the BPF programs), libelf/zlib/pkg-config (the vendored libbpf) and the kernel's
# UAPI headers. Idempotent; run as root (or through sudo).
set -euo pipefail
need=()
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v clang >/dev/null || need+=(clang)
command -v pkg-config >/dev/null || need+=(pkg-config)
for p in libelf-dev zlib1g-dev linux-libc-dev; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
fi
