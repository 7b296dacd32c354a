# frag_oom.py (shared/gpu) as a job that dies of its OOM: the same fragmentation OOM (more than
# the request is free, device + cached, none of it contiguous), then os._exit right after it, so
# the process's memory is back in NVML within ~100 ms. A tracer must judge it with the figures of
# the moment of failure. Writes $OUT/TAG.oom.json (PyTorch's message and its "of which X is free")
# before exiting; nothing else.
import os, sys, json, re, torch, ctypes
out = os.environ["OUT"]; tag = sys.argv[1]
GiB = 1024**3; MiB = 1024**2
torch.cuda.init(); free, total = torch.cuda.mem_get_info()
cuda = ctypes.CDLL("libcuda.so.1"); ptr = ctypes.c_uint64(0)
bal = free - 12 * GiB
print("balloon rc", cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(bal)), bal, flush=True)
a = [torch.empty(500 * MiB, dtype=torch.uint8, device="cuda") for _ in range(20)]
del a[::2]                                        # 10 whole cached 500 MiB segments
b = [torch.empty(300 * MiB, dtype=torch.uint8, device="cuda") for _ in range(10)]   # each splits one
try:
    c = torch.empty(int(2.5 * GiB), dtype=torch.uint8, device="cuda")
    print("no OOM?", flush=True)
    os._exit(1)
except torch.OutOfMemoryError as e:
    msg = str(e).replace("\n", " ")
    m = re.search(r"of which ([0-9.]+) GiB is free", msg)
    u = re.search(r"([0-9.]+) GiB is reserved by PyTorch but unallocated", msg)
    with open(f"{out}/{tag}.oom.json", "w") as f:
        json.dump({"oom_message": msg, "free_gib": m and float(m.group(1)), "reserved_unallocated_gib": u and float(u.group(1)), "pid": os.getpid()}, f)
    print("OOM_MESSAGE", msg, flush=True)
    os._exit(3)
