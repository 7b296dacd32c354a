# A GPT-2 small training loop that records nothing itself (no allocator history), so that it runs
# under any allocator backend; at the end it writes what PyTorch reports, for gpufrag's figures to
# be compared with. usage: python3 torch_workload.py TAG STEPS
import os, sys, json, random, torch
from transformers import GPT2Config, GPT2LMHeadModel
out = os.environ.get("OUT", "/tmp"); tag = sys.argv[1]; steps = int(sys.argv[2])
torch.manual_seed(0); random.seed(0)
cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
m = GPT2LMHeadModel(cfg).cuda(); opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
for step in range(steps):
    b = random.choice([4, 8, 12, 16]); L = random.randint(64, 1024)
    x = torch.randint(0, cfg.vocab_size, (b, L), device="cuda")
    loss = m(x, labels=x).loss; loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()
st = torch.cuda.memory_stats()
res = {"pid": os.getpid(), "backend": torch.cuda.get_allocator_backend(), "reserved": torch.cuda.memory_reserved(),
       "allocated": torch.cuda.memory_allocated(), "inactive_split_bytes": st.get("inactive_split_bytes.all.current"),
       "segment_count": st.get("segment.all.current"), "peak_reserved": st.get("reserved_bytes.all.peak"),
       "allocations": st.get("allocation.all.allocated"), "frees": st.get("allocation.all.freed")}
try:
    snap = torch.cuda.memory._snapshot()
    res["snapshot_segments"] = len(snap["segments"])
    res["largest_free_block"] = max([b["size"] for s in snap["segments"] for b in s["blocks"] if b["state"] == "inactive"], default=0)
except Exception as e:  # the cudaMallocAsync backend keeps no segments
    res["snapshot_error"] = repr(e)
json.dump(res, open(f"{out}/{tag}.torch.json", "w"))
print("TORCH", tag, json.dumps(res), flush=True)
