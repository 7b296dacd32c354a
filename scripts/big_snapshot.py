#!/usr/bin/env python3
"""Builds a long PyTorch memory snapshot from a shorter one, for benchmarks (docs/benchmarks.md).

The trace ring of SRC is played REPS times, each repetition's addresses shifted by REPS x 2^40
and its clock moved past the previous one; the final segments are every repetition's final
segments (each leaves its own behind), and the ring keeps the last ENTRIES entries, as
`_record_memory_history(max_entries=ENTRIES)` would. Each entry is a dict of its own; a
repetition's frame lists are new lists of the same frame dicts (PyTorch shares frames the same
way), so the pickle has the shape of a real long snapshot. Pickled with protocol 4, as
`torch.cuda.memory._dump_snapshot` does.

usage: big_snapshot.py SRC.pickle[.gz] OUT.pickle [ENTRIES=253000]
"""
import gzip
import math
import pickle
import sys


def main():
    src, out = sys.argv[1], sys.argv[2]
    want = int(sys.argv[3]) if len(sys.argv) > 3 else 253_000
    with open(src, "rb") as f:
        gz = f.read(2) == b"\x1f\x8b"
    with (gzip.open if gz else open)(src, "rb") as f:
        snap = pickle.load(f)
    (trace,) = [t for t in snap["device_traces"] if t]
    reps = math.ceil(want / len(trace))
    span = trace[-1]["time_us"] - trace[0]["time_us"] + 1
    ring, segments = [], []
    for r in range(reps):
        shift, dt, lists = r << 40, r * span, {}
        for e in trace:
            e = dict(e)
            e["addr"] += shift
            e["time_us"] += dt
            fr = e.get("frames")
            if fr is not None:
                e["frames"] = lists.setdefault(id(fr), list(fr))
            ring.append(e)
        for s in snap["segments"]:
            s = dict(s)
            s["address"] += shift
            s["blocks"] = [dict(b, address=b["address"] + shift) for b in s["blocks"]]
            segments.append(s)
    big = dict(snap, segments=segments, device_traces=[ring[-want:]])
    with open(out, "wb") as f:
        pickle.dump(big, f, protocol=4)
    print(f"{out}: {len(ring[-want:])} entries, {len(segments)} segments, {reps} repetitions")


if __name__ == "__main__":
    main()
