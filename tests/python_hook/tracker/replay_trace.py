# Replays a PyTorch snapshot's allocator trace (its busiest device's `device_traces`, in order)
# through the stand-in torch's trackers as PyTorch makes it: each segment_alloc is a real
# cuMemAlloc_v2 on the (simulated) driver first, then its trace entry; block entries are moved
# with their segment; the oom entry
# is the allocator's OOM report (addr = device free, size = the request). The process then ends,
# as one that dies of its OOM. Usage: replay_trace.py SNAPSHOT.pickle
#
# PyTorch picks among equal free blocks by address, so the segments must keep the trace's address
# order: the simulated driver hands out addresses best fit, so each segment's place is held up
# front by a pitched allocation of its size, in the trace's address order (cuMemAllocPitch: a
# kind the caching allocator never uses), freed just before the segment takes it. Traces that
# free a segment are not replayed (the hole it leaves would break the order).
import ctypes
import pickle
import sys

import torch

snap = pickle.load(open(sys.argv[1], "rb"))
trace = max(snap["device_traces"], key=len)
cu = ctypes.CDLL("libcuda.so.1")
cu.cuInit(0)
ctx = ctypes.c_void_p()
cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
cu.cuCtxSetCurrent(ctx)

assert not any(e["action"] == "segment_free" for e in trace), "a trace that frees a segment cannot keep its address order here"
held = {}  # the snapshot's segment address -> the pitched allocation holding its place
for e in sorted((e for e in trace if e["action"] == "segment_alloc"), key=lambda e: e["addr"]):
    p, pitch = ctypes.c_uint64(), ctypes.c_size_t()
    rc = cu.cuMemAllocPitch_v2(ctypes.byref(p), ctypes.byref(pitch), ctypes.c_size_t(e["size"]), ctypes.c_size_t(1), ctypes.c_uint(4))
    assert rc == 0, f"cuMemAllocPitch_v2({e['size']}) = {rc}: give the simulated device more memory (SIMCUDA_MEM)"
    held[e["addr"]] = p.value

torch.cuda._lazy_init()  # PyTorch's C++ side calls this on the first CUDA tensor
c = torch.cuda
segments = {}  # the snapshot's segment address -> (this run's address, size)


def moved(addr):
    for base, (new, size) in segments.items():
        if base <= addr < base + size:
            return new + addr - base
    raise SystemExit(f"the trace's address {addr:#x} lies in no segment it allocated")


BLOCK = {"alloc": c.ALLOC, "free_requested": c.FREE_REQUESTED, "free_completed": c.FREE_COMPLETED}
for e in trace:
    a = e["action"]
    if a == "segment_alloc":
        assert cu.cuMemFree_v2(ctypes.c_uint64(held[e["addr"]])) == 0
        p = ctypes.c_uint64()
        rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(e["size"]))
        assert rc == 0, f"cuMemAlloc_v2({e['size']}) = {rc}: give the simulated device more memory (SIMCUDA_MEM)"
        assert p.value == held[e["addr"]], f"the segment took {p.value:#x}, not its place {held[e['addr']]:#x}"
        segments[e["addr"]] = (p.value, e["size"])
        c._trace(c.SEGMENT_ALLOC, p.value, e["size"], e["stream"])
    elif a in BLOCK:
        c._trace(BLOCK[a], moved(e["addr"]), e["size"], e["stream"])
    elif a == "oom":
        c._trace(c.OOM, e["device_free"], e["size"], e["stream"])
print(f"REPLAYED {len(trace)} entries", flush=True)
