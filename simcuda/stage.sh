#!/usr/bin/env bash
# stage.sh: copy the simcuda stand-ins out of a cargo profile directory under the names programs
# look for (libcuda.so.1, libcudart.so.13/.12, libnvidia-ml.so.1, plus the unversioned names), so
# that `LD_LIBRARY_PATH=OUT_DIR` runs any CUDA program against them.
#
# usage: simcuda/stage.sh [PROFILE_DIR [OUT_DIR]]
#   PROFILE_DIR  cargo's output directory for a profile (default: target/debug of this repository)
#   OUT_DIR      where the copies go (default: PROFILE_DIR/simcuda, replacing the build's symlinks)
# Build first: `cargo build -p simcuda-workload` builds the three libraries and the workload.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
profile=${1:-$root/target/debug}
out=${2:-$profile/simcuda}

stage() { # stage FILE NAME...
    local src=$profile/deps/$1
    shift
    if [ ! -f "$src" ]; then
        echo "stage.sh: $src is missing: run 'cargo build -p simcuda-workload' (add --release for target/release)" >&2
        exit 1
    fi
    for name in "$@"; do
        rm -f "$out/$name"
        cp "$src" "$out/$name"
    done
}

mkdir -p "$out"
stage libcuda.so libcuda.so.1 libcuda.so
stage libcudart.so libcudart.so.13 libcudart.so.12 libcudart.so
stage libnvml.so libnvidia-ml.so.1 libnvidia-ml.so
if [ -f "$profile/simcuda-workload" ] && [ "$out" != "$profile/simcuda" ]; then
    cp "$profile/simcuda-workload" "$out/simcuda-workload"
fi
echo "$out"
