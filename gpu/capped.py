# A program capped with torch.cuda.set_per_process_memory_fraction (issue 13): fraction =
# CAP_GIB / the device total, a few tensors, then a request of ASK_GIB over the allowed bytes.
# PyTorch's caching allocator refuses it without any driver call ("... N GiB allowed ...").
# With CAP_GIB=0 no fraction is set and the request (ASK_GIB, larger than the card) fails at the
# driver. Writes $OUT/TAG.capped.json: PyTorch's message, its allowed bytes as PyTorch computes
# them (fraction × cudaMemGetInfo's total), memory_stats at the failure, and the pid.
import json, os, re, sys, time
import torch

tag, cap_gib, ask_gib = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
GiB = 1024**3
torch.cuda.init()
free, total = torch.cuda.mem_get_info()
props_total = torch.cuda.get_device_properties(0).total_memory
fraction = cap_gib * GiB / total if cap_gib > 0 else None
if fraction is not None:
    torch.cuda.set_per_process_memory_fraction(fraction)
get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
read_back = float(get(0)) if get else None
keep = [torch.empty(1 * GiB, dtype=torch.uint8, device="cuda") for _ in range(3)]
keep.append(torch.empty(300 * 1024**2, dtype=torch.uint8, device="cuda"))
msg = None
try:
    x = torch.empty(int(ask_gib * GiB), dtype=torch.uint8, device="cuda")
    print("no OOM?", flush=True)
except torch.OutOfMemoryError as e:
    msg = str(e).replace("\n", " ")
st = torch.cuda.memory_stats()
m = re.search(r"([0-9.]+) GiB allowed", msg or "")
out = {
    "tag": tag, "pid": os.getpid(), "torch": torch.__version__,
    "cudaMemGetInfo_total": total, "cudaMemGetInfo_free_at_start": free,
    "get_device_properties_total_memory": props_total,
    "fraction": fraction, "get_per_process_memory_fraction": read_back,
    # PyTorch's own computation: static_cast<size_t>(fraction * device_total), device_total from cudaMemGetInfo
    "allowed_expected": int(fraction * total) if fraction is not None else None,
    "requested": int(ask_gib * GiB),
    "oom_message": msg, "allowed_gib_in_message": m and float(m.group(1)),
    "memory_stats": {k: st.get(k) for k in ["num_ooms", "num_alloc_retries", "num_device_alloc", "reserved_bytes.all.current", "allocated_bytes.all.current", "reserved_bytes.all.peak"]},
}
print("CAPPED", json.dumps(out), flush=True)
with open(os.path.join(os.environ["OUT"], f"{tag}.capped.json"), "w") as f:
    json.dump(out, f)
time.sleep(0.5)
