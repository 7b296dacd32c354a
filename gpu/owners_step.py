"""A GPT-2-like training step that uses cuBLAS (its matmuls) and a single-rank NCCL communicator
(torch.distributed, world_size 1, an all_reduce), for gpu/validate_owners.sh (issue 25, item 3).

After the step, while everything is still held, it writes to $OUT/owners_step.json its pid,
PyTorch's reserved bytes (memory_reserved()) and NVML's used bytes for this process
(nvidia-smi --query-compute-apps), then leaves with os._exit(0): no teardown frees, so the
summary's owners are the bytes held at the moment of the figures."""
import json, os, subprocess, sys
import torch
import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
torch.cuda.set_device(0)
dist.init_process_group("nccl", rank=0, world_size=1)

d, heads, layers, seq, batch, vocab = 768, 12, 12, 512, 8, 50257


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.fc, self.out = torch.nn.Linear(d, 4 * d), torch.nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
        att = torch.softmax((q @ k.transpose(-1, -2)) / (d // heads) ** 0.5, dim=-1) @ v
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(seq, d)
        self.blocks = torch.nn.Sequential(*[Block() for _ in range(layers)])
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        x = self.emb(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return self.head(self.blocks(x))


model = GPT().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for _ in range(2):
    idx = torch.randint(0, vocab, (batch, seq), device="cuda")
    loss = torch.nn.functional.cross_entropy(model(idx).view(-1, vocab), idx.view(-1))
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    opt.zero_grad(set_to_none=True)
torch.cuda.synchronize()

pid = os.getpid()
used = None
q = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"], capture_output=True, text=True)
for line in q.stdout.splitlines():
    f = [x.strip() for x in line.split(",")]
    if len(f) == 2 and f[0] == str(pid):
        used = int(f[1]) << 20
out = {
    "pid": pid,
    "torch": torch.__version__,
    "nccl": ".".join(map(str, torch.cuda.nccl.version())),
    "reserved": torch.cuda.memory_reserved(),
    "allocated": torch.cuda.memory_allocated(),
    "nvml_used": used,
    "loss": float(loss),
}
json.dump(out, open(os.path.join(os.environ["OUT"], "owners_step.json"), "w"))
print(json.dumps(out), flush=True)
sys.stdout.flush()
os._exit(0)
