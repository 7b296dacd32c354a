# Issue 15's GPU evaluation: what each way of getting PyTorch's blocks costs a training step.
# A GPT-2 small training step (as the shared step_bench.py) while the process holds HELD extra
# small tensors (100 k live blocks, or 0: plain GPT-2 small), under one in-process observer:
#   bare      nothing (run it under `gpufrag run` for today's snapshot hook)
#   tracker   c10::cuda::CUDACachingAllocator::attachAllocatorTraceTracker, through a tiny C++
#             extension (load_inline, cached in TORCH_EXTENSIONS_DIR) that stores each trace
#             entry into a preallocated ring (O(1) per allocator event), with history off
#   history   torch.cuda.memory._record_memory_history(enabled="all", context=None) alone
#   adaptive  snapshots spaced so that their measured cost (snapshot + pickle) stays under 0.2 %
#             of the time: next one after cost / 0.002
# and two probes:
#   compile   builds the extension, prints the TraceEntry struct of the installed header, and
#             whether the tracker fires with history off (entries counted for one allocation)
#   snapcost  _snapshot() (+ pickle) at 1 k / 11 k / 100 k live blocks, history off and on, and
#             the tracker's cost per allocation + free pair
# Prints "RESULT key=value ..." lines that validate_scale.sh collects.
import os, sys, time, random, pickle, statistics, threading
import torch

mode = sys.argv[1]
held_n = int(sys.argv[2]) if len(sys.argv) > 2 else 0
STEPS = int(os.environ.get("STEPS", "40"))
WARM = int(os.environ.get("WARM", "10"))

CPP = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <atomic>
#include <cstdint>
#include <vector>
namespace A = c10::cuda::CUDACachingAllocator;
struct Rec { uint64_t action, addr, size, stream; int64_t device; };
static Rec* ring = nullptr;
static uint64_t mask = 0;
static std::atomic<uint64_t> pos{0};
static std::atomic<uint64_t> counts[16];
static bool attached = false;
// Called under the allocator's lock for every trace entry: one slot write, two relaxed adds.
void attach(int64_t capacity) {
  if (attached) return;
  uint64_t cap = 1; while (cap < (uint64_t)capacity) cap <<= 1;
  ring = new Rec[cap]; mask = cap - 1; attached = true;
  A::attachAllocatorTraceTracker([](const A::TraceEntry& te) {
    uint64_t p = pos.fetch_add(1, std::memory_order_relaxed);
    Rec& r = ring[p & mask];
    r.action = (uint64_t)te.action_; r.addr = (uint64_t)te.addr_; r.size = (uint64_t)te.size_;
    r.stream = (uint64_t)reinterpret_cast<uintptr_t>(te.stream_); r.device = (int64_t)te.device_;
    counts[(int)te.action_ & 15].fetch_add(1, std::memory_order_relaxed);
  });
}
std::vector<int64_t> stats() {
  std::vector<int64_t> v; v.push_back((int64_t)pos.load());
  for (int i = 0; i < 16; i++) v.push_back((int64_t)counts[i].load());
  return v;
}
// The last n entries (oldest first) as (action, addr, size, stream, device) rows.
std::vector<std::vector<int64_t>> tail(int64_t n) {
  std::vector<std::vector<int64_t>> out; uint64_t end = pos.load();
  uint64_t cap = mask + 1; uint64_t k = std::min<uint64_t>({(uint64_t)n, end, cap});
  for (uint64_t p = end - k; p < end; p++) { Rec& r = ring[p & mask];
    out.push_back({(int64_t)r.action, (int64_t)r.addr, (int64_t)r.size, (int64_t)r.stream, r.device}); }
  return out;
}
"""
ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap", "snapshot", "oom"]


def ext():
    from torch.utils.cpp_extension import load_inline
    return load_inline(name="gpufrag_trace_tracker", cpp_sources=CPP, functions=["attach", "stats", "tail"], with_cuda=True, extra_cflags=["-O2"], verbose=False)


def hold(n, into):
    for i in range(n):
        into.append(torch.empty(64 + (i % 7) * 64, device="cuda"))


def blocks():
    s = torch.cuda.memory._snapshot()
    return sum(1 for seg in s["segments"] for b in seg["blocks"] if b["state"] == "active_allocated")


def time_snapshot(reps=5):
    costs, pk = [], []
    for _ in range(reps):
        t0 = time.perf_counter(); s = torch.cuda.memory._snapshot(); t1 = time.perf_counter()
        b = pickle.dumps(s, protocol=4); t2 = time.perf_counter()
        costs.append((t1 - t0) * 1e3); pk.append((t2 - t1) * 1e3)
    return statistics.median(costs), statistics.median(pk), len(b)


if mode == "compile":
    import glob
    inc = os.path.join(os.path.dirname(torch.__file__), "include", "c10", "cuda", "CUDACachingAllocator.h")
    src = open(inc).read() if os.path.exists(inc) else ""
    i = src.find("struct TraceEntry")
    print("HEADER", inc, "found" if i >= 0 else "no struct TraceEntry")
    print(src[i:i + 2200] if i >= 0 else "")
    j = src.find("attachAllocatorTraceTracker")
    print("HEADER attachAllocatorTraceTracker:", src[max(0, j - 200):j + 300] if j >= 0 else "absent")
    t0 = time.perf_counter(); e = ext(); print(f"RESULT probe=compile seconds={time.perf_counter() - t0:.1f}")
    torch.cuda.init(); x = torch.empty(1, device="cuda"); torch.cuda.synchronize()
    e.attach(1 << 16); before = e.stats()[0]
    y = torch.empty(1000, device="cuda"); del y; torch.cuda.synchronize()
    z = torch.empty(300 << 20, dtype=torch.uint8, device="cuda"); del z; torch.cuda.empty_cache()
    st = e.stats()
    print(f"RESULT probe=fires_with_history_off entries={st[0] - before} " + " ".join(f"{a}={st[1 + k]}" for k, a in enumerate(ACTIONS)))
    print("TAIL", e.tail(8))
    sys.exit(0)

if mode == "snapcost":
    keep = []
    torch.cuda.init()
    for target in (1000, 11000, 100000):
        hold(target - len(keep), keep)
        torch.cuda.synchronize()
        n = blocks(); snap, pk, nb = time_snapshot()
        print(f"RESULT probe=snapshot history=off blocks={n} snapshot_ms={snap:.2f} pickle_ms={pk:.2f} bytes={nb}")
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=1000000)
    keep2 = []
    hold(1000, keep2); del keep2  # some history entries
    for target in (100000, 11000, 1000):
        del keep[target:]
        torch.cuda.synchronize()
        n = blocks(); snap, pk, nb = time_snapshot()
        print(f"RESULT probe=snapshot history=context_none blocks={n} snapshot_ms={snap:.2f} pickle_ms={pk:.2f} bytes={nb}")
    torch.cuda.memory._record_memory_history(enabled=None)
    del keep
    # Cost per allocation + free pair (small tensors, the allocator's fast path): bare, with
    # history (context=None), then with the tracker (history off), in that order.
    def pairs(n=200000):
        torch.cuda.synchronize(); t0 = time.perf_counter()
        for _ in range(n):
            t = torch.empty(256, device="cuda"); del t
        torch.cuda.synchronize(); return (time.perf_counter() - t0) / n * 1e9
    base = statistics.median(pairs() for _ in range(3))
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=1000000)
    h = statistics.median(pairs() for _ in range(3))
    torch.cuda.memory._record_memory_history(enabled=None)
    print(f"RESULT probe=pair_cost_history_context_none bare_ns={base:.0f} history_ns={h:.0f} added_ns={h - base:.0f}")
    try:
        e = ext()
        e.attach(1 << 20)
        with_t = statistics.median(pairs() for _ in range(3))
        print(f"RESULT probe=pair_cost_tracker bare_ns={base:.0f} tracker_ns={with_t:.0f} added_ns={with_t - base:.0f}")
    except Exception as ex:
        print(f"RESULT probe=pair_cost_tracker error={type(ex).__name__}: {ex}".replace("\n", " "))
    sys.exit(0)

from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0); random.seed(0)
cfg = GPT2Config(n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257)
m = GPT2LMHeadModel(cfg).cuda(); opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
shapes = [(random.choice([4, 8, 12, 16]), random.randint(64, 1024)) for _ in range(WARM + STEPS)]
keep = []
hold(held_n, keep)
tracker = None
if mode == "tracker":
    tracker = ext(); tracker.attach(1 << 22)
elif mode == "history":
    torch.cuda.memory._record_memory_history(enabled="all", context=None, max_entries=1000000)
adaptive = {"n": 0, "cost_ms": 0.0}
if mode == "adaptive":
    BUDGET = 0.002
    def spaced():
        while True:
            t0 = time.perf_counter()
            b = pickle.dumps(torch.cuda.memory._snapshot(), protocol=4)
            c = time.perf_counter() - t0
            adaptive["n"] += 1; adaptive["cost_ms"] += c * 1e3
            time.sleep(max(1.0, c / BUDGET))
    threading.Thread(target=spaced, daemon=True).start()


def step(b, L):
    x = torch.randint(0, cfg.vocab_size, (b, L), device="cuda")
    loss = m(x, labels=x).loss; loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)


for b, L in shapes[:WARM]:
    step(b, L)
torch.cuda.synchronize(); s0 = torch.cuda.memory_stats(); t0 = time.perf_counter()
e0 = tracker.stats() if tracker else None
for b, L in shapes[WARM:]:
    step(b, L)
torch.cuda.synchronize(); t1 = time.perf_counter(); s1 = torch.cuda.memory_stats()
allocs = (s1["allocation.all.allocated"] - s0["allocation.all.allocated"]) / STEPS
extra = ""
if tracker:
    e1 = tracker.stats()
    d = {a: e1[1 + k] - e0[1 + k] for k, a in enumerate(ACTIONS)}
    # Exactness: one alloc entry per allocation PyTorch counted, one free_completed per free.
    extra = (f" tracker_alloc={d['alloc']} torch_alloc={s1['allocation.all.allocated'] - s0['allocation.all.allocated']}"
             f" tracker_free_completed={d['free_completed']} torch_freed={s1['allocation.all.freed'] - s0['allocation.all.freed']}"
             f" tracker_entries={e1[0] - e0[0]}")
if mode == "adaptive":
    extra = f" snapshots={adaptive['n']} snapshot_ms_total={adaptive['cost_ms']:.1f}"
name = os.environ.get("SCALE_MODE_NAME", mode)  # "run": this bare workload under gpufrag run
print(f"RESULT mode={name} held={held_n} blocks={blocks()} ms_per_step={(t1 - t0) / STEPS * 1000:.3f} allocs_per_step={allocs:.0f}{extra}")
