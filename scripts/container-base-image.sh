#!/usr/bin/env bash
# Builds the base image of the container test (tests/deploy_containers.rs) without an image
# registry: `debootstrap --variant=minbase bookworm` into a directory, packed once into a tarball
# kept under /var/cache/gpufrag-ci (minutes the first time, reused afterwards), then imported
# into podman as localhost/gpufrag-base:bookworm when podman does not have it yet.
# Usage: scripts/container-base-image.sh [MIRROR]   (runs as root)
set -euo pipefail
mirror="${1:-http://deb.debian.org/debian}"
cache=/var/cache/gpufrag-ci
tarball="$cache/bookworm-minbase.tar"
image=localhost/gpufrag-base:bookworm
mkdir -p "$cache"
if ! [ -s "$tarball" ]; then
  root="$(mktemp -d "$cache/rootfs.XXXXXX")"
  trap 'rm -rf "$root"' EXIT
  debootstrap --variant=minbase bookworm "$root" "$mirror" >"$cache/debootstrap.log" 2>&1 \
    || { tail -20 "$cache/debootstrap.log"; exit 1; }
  # Nothing of the package caches is needed inside the image.
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  tar -C "$root" -cf "$tarball.part" .
  mv "$tarball.part" "$tarball"
fi
if ! podman image exists "$image"; then
  podman import "$tarball" "$image" >/dev/null
fi
echo "$image"
