#!/usr/bin/env bash
# Installs on Debian 12 everything that building gpufrag and running every one of its tests needs,
# beyond Rust itself (1.88 or newer, through rustup): the README's quick start and .ci/run both
# call it. Idempotent (only what is missing is installed; a second run installs nothing); run as
# root, or as a user who may sudo (it calls sudo itself). Prints where the two Python tools went;
# scripts/test.sh finds them there.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
command -v cargo >/dev/null || { echo "setup: cargo is missing: install Rust 1.88 or newer with rustup (https://rustup.rs), then run this again" >&2; exit 1; }

need=()
# The build: a C compiler and make (simcuda, the vendored libbpf), clang (the BPF programs of bpf/), libelf, zlib and
# pkg-config (the vendored libbpf), the kernel's UAPI headers (<linux/bpf.h>, <asm/ptrace.h>).
command -v cc >/dev/null || need+=(gcc libc6-dev)
command -v make >/dev/null || need+=(make)
command -v clang >/dev/null || need+=(clang)
command -v pkg-config >/dev/null || need+=(pkg-config)
for p in libelf-dev zlib1g-dev linux-libc-dev; do dpkg -s "$p" >/dev/null 2>&1 || need+=("$p"); done
# The tests' C fixtures: g++ (the C++ ones), systemtap-sdt-dev (<sys/sdt.h> USDT probes), nm,
# python3 (the Python hook's tests).
command -v c++ >/dev/null || need+=(g++)
command -v nm >/dev/null || need+=(binutils)
command -v python3 >/dev/null || need+=(python3)
# openssl makes the certificates of the OTLP-over-TLS test; procps's kill(1) signals `top` in its
# test (a minimal Debian has neither, nor make above).
command -v openssl >/dev/null || need+=(openssl)
[ -x /usr/bin/kill ] || [ -x /bin/kill ] || need+=(procps)
dpkg -s systemtap-sdt-dev >/dev/null 2>&1 || need+=(systemtap-sdt-dev)
# The views: headless Chromium renders report.html, tmux drives `gpufrag top` and the demo.
command -v chromium >/dev/null || need+=(chromium)
command -v tmux >/dev/null || need+=(tmux)
# man(1) renders the generated man pages in their test (gpufrag man --dir).
command -v man >/dev/null || need+=(man-db)
# Metrics export: a real Prometheus (its promtool checks the alert rules), PyYAML for deploy/,
# python3-venv for the two tools from PyPI below (Debian's Python refuses system-wide pip).
command -v prometheus >/dev/null || need+=(prometheus)
python3 -c 'import yaml' 2>/dev/null || need+=(python3-yaml)
dpkg -s python3-venv >/dev/null 2>&1 || need+=(python3-venv)
# rotel-agent (the OTLP collector of the export tests, from PyPI) links Debian 12's libpython3.11,
# which a minimal system lacks ("libpython3.11.so.1.0: cannot open shared object file").
dpkg -s libpython3.11 >/dev/null 2>&1 || need+=(libpython3.11)
# Deployment: a real container runtime (podman with runc: crun fails on hybrid cgroup layouts)
# and debootstrap for its base image (no image registry is reachable).
command -v podman >/dev/null || need+=(podman)
command -v runc >/dev/null || need+=(runc)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: apt-get install ${need[*]}"
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# rotel-agent, an OTLP collector (PyPI), and kubernetes-validate (PyPI), each in a virtual
# environment under /opt/gpufrag-ci (the tests find them by $ROTEL_AGENT and $KUBERNETES_VALIDATE,
# which scripts/test.sh sets from these paths).
ci=/opt/gpufrag-ci
$SUDO mkdir -p "$ci"
rotel_venv=$ci/rotel
rotel_path() { "$rotel_venv/bin/python" -c 'import os, rotel; print(os.path.join(os.path.dirname(rotel.__file__), "rotel-agent"))' 2>/dev/null; }
if ! [ -x "$(rotel_path)" ]; then
  $SUDO python3 -m venv "$rotel_venv"
  $SUDO "$rotel_venv/bin/pip" install -q rotel
fi
kv_venv=$ci/kubernetes-validate
if ! [ -x "$kv_venv/bin/kubernetes-validate" ]; then
  $SUDO python3 -m venv "$kv_venv"
  $SUDO "$kv_venv/bin/pip" install -q kubernetes-validate
fi
# grpcio and protobuf for the stand-in kubelet pod-resources server of tests/pod_resources.rs
# (tests/pod_resources_support/server.py; the test finds this interpreter, or $PODRES_PYTHON).
pr_venv=$ci/podres
if ! "$pr_venv/bin/python" -c 'import grpc, google.protobuf' 2>/dev/null; then
  $SUDO python3 -m venv "$pr_venv"
  $SUDO "$pr_venv/bin/pip" install -q grpcio protobuf
fi
# kustomize, to build every kustomization under deploy/ (tests/export_deploy.rs): the kustomize
# library as the PyPI package pykustomize ships it (no kustomize binary is packaged for Debian 12
# or reachable as a release download), behind scripts/kustomize.py as bin/kustomize. pykustomize
# declares Python >= 3.14 but runs on Debian 12's 3.11 (a cffi binding of a Go shared library).
kz_venv=$ci/kustomize
if ! "$kz_venv/bin/python" -c 'import pykustomize' 2>/dev/null; then
  $SUDO python3 -m venv "$kz_venv"
  $SUDO "$kz_venv/bin/pip" install -q --ignore-requires-python pykustomize==0.1.4
fi
sed "1s|.*|#!$kz_venv/bin/python|" scripts/kustomize.py | $SUDO tee "$kz_venv/bin/kustomize" >/dev/null
$SUDO chmod 755 "$kz_venv/bin/kustomize"
# The container test's base image (debootstrap once, cached under /var/cache/gpufrag-ci).
$SUDO bash scripts/container-base-image.sh >/dev/null
echo "setup: done (ROTEL_AGENT=$(rotel_path), KUBERNETES_VALIDATE=$kv_venv/bin/kubernetes-validate, KUSTOMIZE=$kz_venv/bin/kustomize)"
