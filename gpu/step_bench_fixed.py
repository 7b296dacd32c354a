# Training-step time of GPT-2 small at one fixed shape (batch 8, length 512: a periodic training
# loop, the case foresight predicts every step of), the mode in argv[1] printed beside the time.
# The same model, optimiser and timing as step_bench.py, whose random shape per step has no
# repeating step for foresight to find (its prediction stops there, so it cannot show
# foresight's cost).
import sys, time, torch
from transformers import GPT2Config, GPT2LMHeadModel
mode = sys.argv[1]
torch.manual_seed(0)
cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
m = GPT2LMHeadModel(cfg).cuda(); opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
def step(b, L):
    x = torch.randint(0, cfg.vocab_size, (b, L), device="cuda")
    loss = m(x, labels=x).loss; loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
for _ in range(20): step(8, 512)
torch.cuda.synchronize(); n0 = torch.cuda.memory_stats()["allocation.all.allocated"]; t0 = time.perf_counter()
for _ in range(100): step(8, 512)
torch.cuda.synchronize(); t1 = time.perf_counter(); n1 = torch.cuda.memory_stats()["allocation.all.allocated"]
print(f"MODE {mode} ms_per_step {(t1-t0)/100*1000:.2f} allocs_per_step {(n1-n0)/100:.0f}")
