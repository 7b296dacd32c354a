# One deterministic PyTorch workload, run once per allocator setting in a fresh process, for the
# ground truth of `gpufrag whatif`: the allocator history is recorded from before the first
# allocation (context=None keeps the pickle small), the program stops at its first OOM, and the
# run writes its snapshot (gzip pickle) and a JSON of what PyTorch measured: memory_stats(), the
# allowed bytes of set_per_process_memory_fraction, whether it OOMed, the first failing request
# (from the trace's `oom` entry and from the OOM observer) and PyTorch's OOM message.
# The allocator setting comes from PYTORCH_CUDA_ALLOC_CONF, set by the caller.
# usage: python3 whatif_workload.py WORKLOAD TAG LIMIT_BYTES|none   (writes $OUT/TAG.*)
#   WORKLOAD: train (a small GPT with random batch sizes and sequence lengths, AdamW),
#             kvcache (a decoder growing its KV cache with torch.cat, random prompt and chunk sizes),
#             frag (PyTorch strands memory inside split segments, then asks for 2.5 GiB)
import os, sys, json, gzip, pickle, random, time, math
import torch, torch.nn as nn, torch.nn.functional as F

out = os.environ["OUT"]; work, tag, limit = sys.argv[1], sys.argv[2], sys.argv[3]
MiB, GiB = 1024**2, 1024**3
t0 = time.time()
torch.cuda.init()
free0, total = torch.cuda.mem_get_info()
meta = {"workload": work, "tag": tag, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
        "torch": torch.__version__, "device": torch.cuda.get_device_name(), "device_total": total,
        "device_free_at_start": free0}
if limit != "none":
    fraction = int(limit) / total
    torch.cuda.set_per_process_memory_fraction(fraction)
    # what CUDACachingAllocator computes: static_cast<size_t>(fraction * total) in double
    meta.update(fraction=fraction, fraction_repr=repr(fraction), limit_requested=int(limit),
                allowed=int(fraction * total))
else:
    meta.update(fraction=None, allowed=None)
observed = []
if hasattr(torch._C, "_cuda_attach_out_of_memory_observer"):
    torch._C._cuda_attach_out_of_memory_observer(
        lambda device, alloc, device_allocated, device_free: observed.append(
            {"device": device, "alloc": alloc, "device_allocated": device_allocated, "device_free": device_free}))
torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python", max_entries=2_000_000)
torch.manual_seed(0); random.seed(0)


def train():
    V, D, NL, NH, LMAX = 16384, 768, 6, 12, 1024

    class Block(nn.Module):
        def __init__(s):
            super().__init__()
            s.ln1, s.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
            s.qkv, s.proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
            s.fc, s.out = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)

        def forward(s, x):
            B, L, _ = x.shape
            q, k, v = s.qkv(s.ln1(x)).view(B, L, 3, NH, D // NH).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + s.proj(a.transpose(1, 2).reshape(B, L, D))
            return x + s.out(F.gelu(s.fc(s.ln2(x))))

    class GPT(nn.Module):
        def __init__(s):
            super().__init__()
            s.tok, s.pos = nn.Embedding(V, D), nn.Embedding(LMAX, D)
            s.blocks = nn.ModuleList(Block() for _ in range(NL))
            s.ln, s.head = nn.LayerNorm(D), nn.Linear(D, V, bias=False)

        def forward(s, x):
            h = s.tok(x) + s.pos(torch.arange(x.shape[1], device=x.device))
            for b in s.blocks:
                h = b(h)
            return s.head(s.ln(h))

    m = GPT().cuda(); opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for step in range(10):
        b = random.choice([4, 8, 12, 16]); L = random.randint(64, 1024)
        x = torch.randint(0, V, (b, L), device="cuda")
        loss = F.cross_entropy(m(x).view(-1, V), x.view(-1))
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        del x, loss


def kvcache():
    NLAY, B, H, HD = 6, 8, 16, 128
    D = H * HD
    w = [(torch.randn(D, 3 * D, device="cuda", dtype=torch.float16) * 0.02,
          torch.randn(D, D, device="cuda", dtype=torch.float16) * 0.02) for _ in range(NLAY)]
    for req in range(3):
        T0 = random.randint(128, 512); gen = random.randint(768, 1536)
        cache = [(torch.randn(B, H, T0, HD, device="cuda", dtype=torch.float16),
                  torch.randn(B, H, T0, HD, device="cuda", dtype=torch.float16)) for _ in range(NLAY)]
        done = 0
        while done < gen:
            c = random.choice([8, 16, 32]); done += c
            h = torch.randn(B, c, D, device="cuda", dtype=torch.float16)
            for i, (wqkv, wo) in enumerate(w):
                q, k, v = (h @ wqkv).view(B, c, 3, H, HD).permute(2, 0, 3, 1, 4)
                kc, vc = cache[i]
                kc = torch.cat([kc, k], dim=2); vc = torch.cat([vc, v], dim=2)
                cache[i] = (kc, vc)
                a = F.scaled_dot_product_attention(q, kc, vc)
                h = h + a.transpose(1, 2).reshape(B, c, D) @ wo
                del q, k, v, kc, vc, a
            del h
        del cache


def frag():
    a = [torch.empty(500 * MiB, dtype=torch.uint8, device="cuda") for _ in range(20)]
    del a[::2]                                        # 10 whole cached 500 MiB segments
    b = [torch.empty(300 * MiB, dtype=torch.uint8, device="cuda") for _ in range(10)]   # each splits one
    c = torch.empty(int(2.5 * GiB), dtype=torch.uint8, device="cuda")
    d = [torch.empty(40 * MiB, dtype=torch.uint8, device="cuda") for _ in range(8)]
    del b[::3], c
    e = torch.empty(3 * GiB, dtype=torch.uint8, device="cuda")


oom = None
try:
    {"train": train, "kvcache": kvcache, "frag": frag}[work]()
    torch.cuda.synchronize()
except torch.OutOfMemoryError as ex:
    oom = {"message": str(ex)}
snap = torch.cuda.memory._snapshot()
stats = torch.cuda.memory_stats()
torch.cuda.memory._record_memory_history(enabled=None)
trace = snap["device_traces"][torch.cuda.current_device()]
oom_entries = [e for e in trace if e["action"] == "oom"]
if oom is not None:
    oom["trace_entry"] = {k: v for k, v in oom_entries[0].items() if k != "frames"} if oom_entries else None
    oom["observer"] = observed[:1]
meta.update(oom=oom, oomed=oom is not None, stats=stats, events=len(trace),
            allocator_settings=snap.get("allocator_settings"), seconds=round(time.time() - t0, 2),
            final_reserved=torch.cuda.memory_reserved(), final_allocated=torch.cuda.memory_allocated())
with gzip.open(f"{out}/{tag}.pickle.gz", "wb", compresslevel=9) as f:
    pickle.dump(snap, f)
json.dump(meta, open(f"{out}/{tag}.json", "w"), indent=1, default=str)
print("WHATIF", tag, "events", len(trace), "oom", oom is not None,
      "peak_reserved", stats.get("reserved_bytes.all.peak"), "retries", stats.get("num_alloc_retries"),
      "seconds", meta["seconds"], flush=True)
