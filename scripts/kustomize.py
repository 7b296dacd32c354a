#!/usr/bin/env python3
"""`kustomize build DIR` (and `kustomize version`) on the kustomize library that the PyPI package
pykustomize ships (sigs.k8s.io/kustomize/api, built as a shared library): no kustomize release
binary can be downloaded where gpufrag's CI runs, and Debian 12 packages no kustomize.
scripts/setup.sh installs pykustomize in /opt/gpufrag-ci/kustomize and this file as its
bin/kustomize. Prints the built YAML on stdout like `kustomize build`; an error goes to stderr
with exit status 1."""
import asyncio
import sys

import pykustomize


def main(argv):
    if len(argv) == 2 and argv[1] == "version":
        print(pykustomize.native_version())
        return 0
    if len(argv) != 3 or argv[1] != "build":
        print("usage: kustomize build DIR | kustomize version", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(pykustomize.build(argv[2]))
    except pykustomize.KustomizeError as e:
        print(f"kustomize build {argv[2]}: {e}", file=sys.stderr)
        return 1
    sys.stdout.write(result.yaml)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
