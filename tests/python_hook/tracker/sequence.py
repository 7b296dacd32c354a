# A PyTorch caching allocator's trace as its trace tracker sees it, in PyTorch's order (the
# driver call, then the entry), on the stand-in torch: segments from the (simulated) driver, block
# entries through the stand-in libc10_cuda.so into whatever trackers are attached. Prints the
# addresses and how many trackers received the entries.
#   malloc(1000) on stream S: no cached block, cudaMalloc 2 MiB (small pool) = A; block A, 1024 B
#   malloc(3000): the rest of A, split: block A+1024, 3072 B
#   free(A): requested, then completed (no other stream used it)
#   malloc(512): best fit is the 1024 B block at A, split: block A, 512 B
#   malloc(5 MiB): large pool, nothing cached, cudaMalloc 20 MiB (1-10 MiB requests) = B; block B, 5 MiB
# then, by the first argument: `oom` (the allocator's OOM entry), `retry` (a failed cudaMalloc
# that PyTorch's release-and-retry recovers), `driver_oom` (a failed cudaMalloc nobody reports).
import ctypes
import sys

import torch

MIB = 1 << 20
S = 0x5000
cu = ctypes.CDLL("libcuda.so.1")
cu.cuInit(0)
ctx = ctypes.c_void_p()
cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0)
cu.cuCtxSetCurrent(ctx)


def segment(size):
    p = ctypes.c_uint64()
    assert cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size)) == 0
    return p.value


torch.cuda._lazy_init()  # PyTorch's C++ side calls this on the first CUDA tensor
c = torch.cuda
A = segment(2 * MIB)
c._trace(c.SEGMENT_ALLOC, A, 2 * MIB, S)
n = c._trace(c.ALLOC, A, 1000, S)
c._trace(c.ALLOC, A + 1024, 3000, S)
c._trace(c.FREE_REQUESTED, A, 1000, S)
c._trace(c.FREE_COMPLETED, A, 1000, S)
c._trace(c.ALLOC, A, 512, S)
B = segment(20 * MIB)
c._trace(c.SEGMENT_ALLOC, B, 20 * MIB, S)
c._trace(c.ALLOC, B, 5 * MIB, S)
print(f"SEQ A={A} B={B} trackers={n}", flush=True)
mode = sys.argv[1] if len(sys.argv) > 1 else ""
last = B  # the block freed at teardown
if mode == "retry":
    # PyTorch's release-and-retry (memory_stats: num_alloc_retries 1, num_ooms 0): the program
    # frees the 5 MiB tensor (segment B cached, empty); a 30 MiB request finds no cached block and
    # cudaMalloc fails (26 MiB free); release_cached_blocks frees B; the retry gets 30 MiB = C
    c._trace(c.FREE_REQUESTED, B, 5 * MIB, S)
    c._trace(c.FREE_COMPLETED, B, 5 * MIB, S)
    p = ctypes.c_uint64()
    rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(30 * MIB))
    assert rc == 2, rc
    assert cu.cuMemFree_v2(ctypes.c_uint64(B)) == 0
    c._trace(c.SEGMENT_FREE, B, 20 * MIB, S)
    C = segment(30 * MIB)
    c._trace(c.SEGMENT_ALLOC, C, 30 * MIB, S)
    c._trace(c.ALLOC, C, 30 * MIB, S)
    last = C
    print(f"RETRY rc={rc} C={C}", flush=True)
elif mode == "driver_oom":
    # a raw cudaMalloc the device cannot serve, with no allocator's report and no retry: the
    # program goes on without it
    p = ctypes.c_uint64()
    rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(30 * MIB))
    assert rc == 2, rc
    print(f"DRIVER_OOM rc={rc}", flush=True)
if mode == "oom":
    # a 30 MiB request the device cannot serve: the allocator's retries, then its OOM entry
    # (addr_ = device free, size_ = the rounded request)
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    p = ctypes.c_uint64()
    rc = cu.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(30 * MIB))
    c._trace(c.OOM, free.value, 30 * MIB, S)
    print(f"OOM rc={rc} free={free.value}", flush=True)


class AtTeardown:
    """Frees block B while the interpreter tears down __main__ (after every exit handler), as a
    tensor held in a global is freed then: not part of the state at exit."""

    def __init__(self, trace, args):
        self.trace, self.args = trace, args

    def __del__(self):
        self.trace(*self.args)


late = AtTeardown(torch._lib.standin_trace, (c.FREE_COMPLETED, last, 30 * MIB if last != B else 5 * MIB, S, 0))
