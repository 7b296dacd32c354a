# A training loop on the stand-in torch whose activation grows by a fixed amount each step (a
# sequence length that rises), its allocator's trace entries written in PyTorch's order by a
# small model of the caching allocator's large pool for these sizes (every request a multiple of
# 2 MiB and at least 10 MiB, so a block is its whole segment: kRoundLarge, no split): a request
# takes the smallest cached free segment that holds it, else cudaMalloc; a failed cudaMalloc
# frees every cached segment (release_cached_blocks) and tries once more; a second failure is the
# OOM entry (addr_ = device free, size_ = the request) and the program raises.
#   argv: WEIGHTS_MIB ACT0_MIB GROWTH_MIB TEMP_MIB STEPS SLEEP_S
# Per step: the activation (ACT0 + k * GROWTH MiB), a temporary (TEMP MiB), both freed at the
# step's end. With GROW_FRACTION set, the program first calls set_per_process_memory_fraction
# and its model refuses a segment past the allowed bytes (fraction x the device total) as
# PyTorch's alloc_block does before cudaMalloc: the cached segments are freed and it tries once
# more. Prints "STEP k t=..." at each step's start and "OOM step=k t=... reserved=... free=..."
# at the failure.
import ctypes
import os
import sys
import time

import torch

MIB = 1 << 20
S = 0x5000
w_mib, a0, growth, temp, steps, sleep_s = (
    int(sys.argv[1]),
    int(sys.argv[2]),
    int(sys.argv[3]),
    int(sys.argv[4]),
    int(sys.argv[5]),
    float(sys.argv[6]),
)
cu = ctypes.CDLL("libcuda.so.1")
cu.cuInit(0)
ctx = ctypes.c_void_p()
cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
cu.cuCtxSetCurrent(ctx)
torch.cuda._lazy_init()
c = torch.cuda
allowed = None
if os.environ.get("GROW_FRACTION"):
    c.set_per_process_memory_fraction(float(os.environ["GROW_FRACTION"]))
    allowed = int(c.get_per_process_memory_fraction() * c.mem_get_info()[1])

segments = {}  # addr -> [size, in_use]


def reserved():
    return sum(s for s, _ in segments.values())


def device_free():
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    return free.value


def cuda_malloc(size):
    if allowed is not None and reserved() + size > allowed:
        return None
    p = ctypes.c_uint64()
    if cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size)) != 0:
        return None
    c._trace(c.SEGMENT_ALLOC, p.value, size, S)
    segments[p.value] = [size, False]
    return p.value


def malloc(size, step):
    fits = sorted((s, a) for a, (s, used) in segments.items() if not used and s >= size)
    if fits:
        s, a = fits[0]
        assert s == size, f"the model does not split blocks: a {s} B segment for {size} B"
    else:
        a = cuda_malloc(size)
        if a is None:
            for b in [b for b, (_, used) in segments.items() if not used]:
                assert cu.cuMemFree_v2(ctypes.c_uint64(b)) == 0
                c._trace(c.SEGMENT_FREE, b, segments.pop(b)[0], S)
            a = cuda_malloc(size)
        if a is None:
            free = device_free()
            c._trace(c.OOM, free, size, S)
            print(f"OOM step={step} t={time.monotonic_ns()} reserved={reserved()} request={size} free={free} allowed={allowed or 0}", flush=True)
            raise SystemExit(3)
    segments[a][1] = True
    c._trace(c.ALLOC, a, size, S)
    return a


def free(a):
    segments[a][1] = False
    c._trace(c.FREE_REQUESTED, a, segments[a][0], S)
    c._trace(c.FREE_COMPLETED, a, segments[a][0], S)


weights = malloc(w_mib * MIB, -1)
for k in range(steps):
    print(f"STEP {k} t={time.monotonic_ns()}", flush=True)
    act = malloc((a0 + k * growth) * MIB, k)
    tmp = malloc(temp * MIB, k)
    free(tmp)
    free(act)
    time.sleep(sleep_s)
print(f"DONE steps={steps} reserved={reserved()}", flush=True)
