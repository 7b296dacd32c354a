# Workloads of gpu/validate_foresight.sh (issue 24 item 1), PyTorch on the H200. Each writes a
# JSON line to argv[2] with its own figures: the start of each step (CLOCK_MONOTONIC ns, the clock
# gpufrag stamps its events with), and at an OOM the step, the time, PyTorch's reserved bytes
# right after the failure (memory_stats()), the segment it tried to allocate (the OOM observer's
# alloc_size, exact) and the OOM message.
#   train_grow  an MLP over tokens whose sequence length grows by 256 each step (activations grow
#               linearly) on a device filled by a balloon tensor to leave ~3 GiB: OOMs
#   decode_grow a decoder step whose KV cache grows by torch.cat each token, same balloon: OOMs
#   periodic    fixed-shape training, 40 steps                          (finishes)
#   shapes      training with batches of varying shape, 40 steps        (finishes)
#   infer       inference (no_grad) of a fixed batch, 60 iterations     (finishes)
#   generate    3 generations of 96 tokens, the KV cache reset between  (finishes)
#   conv        a small conv net trained on images of varying size      (finishes)
import json
import sys
import time

import torch

mode, out = sys.argv[1], sys.argv[2]
dev = torch.device("cuda")
MIB = 1 << 20
own = {"mode": mode, "steps": [], "oom": None}
alloc_seen = []
torch._C._cuda_attach_out_of_memory_observer(lambda device, alloc, dev_alloc, dev_free: alloc_seen.append(int(alloc)))


def balloon(leave):
    free, _ = torch.cuda.mem_get_info()
    return torch.empty(max(free - leave, 0), dtype=torch.uint8, device=dev)


def mlp(h=1024, w=4096):
    return torch.nn.Sequential(torch.nn.Linear(h, w), torch.nn.GELU(), torch.nn.Linear(w, h), torch.nn.Linear(h, w), torch.nn.GELU(), torch.nn.Linear(w, h)).to(dev)


def train_step(model, opt, x):
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def run(steps, body, pause=0.06):
    try:
        for k in range(steps):
            own["steps"].append(time.monotonic_ns())
            body(k)
            torch.cuda.synchronize()
            time.sleep(pause)
    except torch.OutOfMemoryError as e:
        t = time.monotonic_ns()
        own["oom"] = {
            "step": len(own["steps"]) - 1,
            "t_ns": t,
            "reserved": torch.cuda.memory_stats()["reserved_bytes.all.current"],
            "alloc": alloc_seen[-1] if alloc_seen else None,
            "message": str(e).splitlines()[0][:400],
        }


if mode == "train_grow":
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    keep = balloon(3 << 30)
    run(400, lambda k: train_step(model, opt, torch.randn(8, 256 + 256 * k, 1024, device=dev)))
elif mode == "decode_grow":
    keep = balloon(3 << 30)
    B, H, D = 16, 16, 128
    k_cache = torch.zeros(B, H, 0, D, device=dev)
    v_cache = torch.zeros(B, H, 0, D, device=dev)
    wq = torch.randn(H * D, H * D, device=dev) / 64

    def decode(k):
        global k_cache, v_cache
        x = torch.randn(B, 1, H * D, device=dev)
        q = (x @ wq).view(B, 1, H, D).transpose(1, 2)
        # 64 tokens a step (a chunk of the prompt, or a speculative block)
        new = torch.randn(B, H, 64, D, device=dev)
        k_cache = torch.cat([k_cache, new], dim=2)
        v_cache = torch.cat([v_cache, new], dim=2)
        a = torch.softmax(q @ k_cache.transpose(-1, -2) / D**0.5, dim=-1)
        y = a @ v_cache
        del a, y, q, x, new

    run(4000, decode, pause=0.03)
elif mode == "periodic":
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    run(40, lambda k: train_step(model, opt, torch.randn(8, 512, 1024, device=dev)))
elif mode == "shapes":
    model = mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    seqs = [384, 512, 256, 448, 320, 512, 128]
    run(40, lambda k: train_step(model, opt, torch.randn(8, seqs[k % len(seqs)], 1024, device=dev)))
elif mode == "infer":
    model = mlp().eval()

    def infer(k):
        with torch.no_grad():
            model(torch.randn(32, 512, 1024, device=dev)).sum().item()

    run(60, infer, pause=0.03)
elif mode == "generate":
    B, H, D = 8, 16, 128

    def generation(k):
        kc = torch.zeros(B, H, 0, D, device=dev)
        for _ in range(96):
            new = torch.randn(B, H, 1, D, device=dev)
            kc = torch.cat([kc, new], dim=2)
            (new @ kc.transpose(-1, -2)).softmax(-1).sum().item()
            time.sleep(0.002)

    run(3, generation, pause=0.1)
elif mode == "conv":
    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(64, 64, 3, padding=1), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10)
    ).to(dev)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    sizes = [224, 160, 192, 256, 128]

    def conv(k):
        s = sizes[k % len(sizes)]
        loss = torch.nn.functional.cross_entropy(net(torch.randn(16, 3, s, s, device=dev)), torch.randint(0, 10, (16,), device=dev))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    run(30, conv, pause=0.03)
else:
    raise SystemExit(f"unknown mode {mode}")
own["done"] = own["oom"] is None
with open(out, "w") as f:
    json.dump(own, f)
