# JAX workloads for the frameworks validation (gpu/validate_frameworks.sh), each printing XLA's
# own figures (device.memory_stats()) as `BFCSTATS <when> {json}` lines to compare with gpufrag's.
#   train N   a training loop with variable shapes (batch and sequence change every step), N steps
#   frag      fill the pool with 256 MiB buffers, free every other one, ask for 11.85 GiB: a
#             fragmentation OOM inside BFC; the RESOURCE_EXHAUSTED is re-raised (uncaught) so that
#             gpufrag run's hook sees it too
#   bench N [DIR]  a GPT-2-small training step (12 layers, d 768, seq 1024, batch 8, Adam):
#             N timed steps, `STEP_MS median`; with DIR, alternated phases driven by files there
#             (see bench())
# With JAX_BFC_MARK=DIR each BFCSTATS line is followed by a file DIR/<when> and a pause of
# JAX_BFC_HOLD_S seconds (3), so that the validation script can stop a tracer at that moment.
import json
import os
import sys
import time

import jax
import jax.numpy as jnp


def stats(when):
    s = jax.local_devices()[0].memory_stats()
    keys = ["bytes_in_use", "largest_free_block_bytes", "pool_bytes", "bytes_limit", "peak_bytes_in_use", "num_allocs", "bytes_reserved", "largest_alloc_size"]
    print("BFCSTATS", when, json.dumps({k: int(s.get(k, -1)) for k in keys}), flush=True)
    mark = os.environ.get("JAX_BFC_MARK")
    if mark:  # the validation script stops the tracer now: its summary holds the live figures
        with open(os.path.join(mark, when), "w") as f:
            f.write(str(time.time()))
        time.sleep(float(os.environ.get("JAX_BFC_HOLD_S", "3")))


def mlp(params, x):
    for w in params:
        x = jnp.tanh(x @ w)
    return x.sum()


grad = jax.jit(jax.grad(mlp))


def train(n):
    key = jax.random.PRNGKey(0)
    params = [jax.random.normal(key, (1024, 1024)) * 0.01 for _ in range(4)]
    keep = []
    for i in range(n):
        b = 64 * (1 + i % 7)
        x = jax.random.normal(key, (b, 1024))
        g = grad(params, x)
        params = [p - 1e-3 * gi for p, gi in zip(params, g)]
        if i % 5 == 0:
            keep.append(jnp.ones((b * 37, 1000)))  # live buffers of odd sizes between steps
        if len(keep) > 6:
            keep.pop(0)
    jax.block_until_ready(params)
    stats("end")
    return params, keep  # kept alive until exit: the hook's last periodic read sees these figures


def frag():
    bufs = []
    try:
        while True:
            bufs.append(jnp.ones((64, 1024, 1024), dtype=jnp.float32))  # 256 MiB
            bufs[-1].block_until_ready()
    except Exception as e:  # the pool is full
        print("FILLED", len(bufs), type(e).__name__, flush=True)
    del bufs[::2]
    time.sleep(1.5)
    stats("before_oom")
    try:
        x = jnp.ones((int(11.85 * (1 << 30)) // 4,), dtype=jnp.float32)
        x.block_until_ready()
        print("NO_OOM", flush=True)
    except Exception as e:
        print("OOM_MESSAGE", str(e)[:300].replace("\n", " "), flush=True)
        stats("oom")
        time.sleep(1.5)  # the live tools read everything before the process dies
        raise


def gpt_init(key, layers=12, d=768, vocab=50257, seq=1024):
    """GPT-2 small's shapes: 12 layers, d_model 768, 12 heads, MLP 4 d, tied embeddings; the
    layers' weights stacked on a leading axis (one lax.scan: compiled once, not 12 times)."""
    ks = iter(jax.random.split(key, 16))
    w = lambda shape, s=0.02: jax.random.normal(next(ks), shape, jnp.float32) * s
    L = layers
    blocks = {"ln1": jnp.ones((L, d)), "qkv": w((L, d, 3 * d)), "proj": w((L, d, d)), "ln2": jnp.ones((L, d)),
              "fc": w((L, d, 4 * d)), "out": w((L, 4 * d, d)), "b_fc": jnp.zeros((L, 4 * d)), "b_out": jnp.zeros((L, d))}
    return {"wte": w((vocab, d)), "wpe": w((seq, d), 0.01), "blocks": blocks, "lnf": jnp.ones((d,))}


def layer_norm(x, g):
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(v + 1e-5) * g


def gpt_loss(p, tokens, heads=12):
    b, t = tokens.shape
    x = p["wte"][tokens] + p["wpe"][:t]
    d = x.shape[-1]
    causal = jnp.tril(jnp.ones((t, t), bool))

    def block(x, blk):
        h = layer_norm(x, blk["ln1"]) @ blk["qkv"]
        q, k, v = [a.reshape(b, t, heads, d // heads).transpose(0, 2, 1, 3) for a in jnp.split(h, 3, axis=-1)]
        att = jnp.where(causal, (q @ k.transpose(0, 1, 3, 2)) / jnp.sqrt(d // heads), -1e9)
        y = (jax.nn.softmax(att, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        x = x + y @ blk["proj"]
        x = x + jax.nn.gelu(layer_norm(x, blk["ln2"]) @ blk["fc"] + blk["b_fc"]) @ blk["out"] + blk["b_out"]
        return x, None

    x, _ = jax.lax.scan(block, x, p["blocks"])
    logits = layer_norm(x, p["lnf"]) @ p["wte"].T
    logp = jax.nn.log_softmax(logits[:, :-1], axis=-1)
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()


def adam_step(p, m, v, tokens, i, lr=3e-4, b1=0.9, b2=0.95):
    loss, g = jax.value_and_grad(gpt_loss)(p, tokens)
    m = jax.tree_util.tree_map(lambda m, g: b1 * m + (1 - b1) * g, m, g)
    v = jax.tree_util.tree_map(lambda v, g: b2 * v + (1 - b2) * g * g, v, g)
    c1, c2 = 1 - b1 ** (i + 1), 1 - b2 ** (i + 1)
    p = jax.tree_util.tree_map(lambda p, m, v: p - lr * (m / c1) / (jnp.sqrt(v / c2) + 1e-8), p, m, v)
    return p, m, v, loss


def bench(n, phases=None):
    """A GPT-2-small training step (batch 8, sequence 1024, Adam, the state donated as a JAX
    training loop does). Without `phases`: n timed steps, `STEP_MS median`. With `phases` (a
    directory): the step is compiled once, then for each file `bare_R` / `agent_R` that appears
    there (the validation script starts and stops the agent between them) n timed steps run and
    `PHASE name median_ms allocs_per_step` is printed, then `name.done` is written; `stop` ends."""
    key = jax.random.PRNGKey(0)
    p = gpt_init(key)
    m = jax.tree_util.tree_map(jnp.zeros_like, p)
    v = jax.tree_util.tree_map(jnp.zeros_like, p)
    tokens = jax.random.randint(key, (8, 1024), 0, 50257)
    step = jax.jit(adam_step, donate_argnums=(0, 1, 2))
    i = 0

    def run(k):
        nonlocal p, m, v, i
        times = []
        a0 = jax.local_devices()[0].memory_stats().get("num_allocs", 0)
        for _ in range(k):
            t = time.perf_counter()
            p, m, v, loss = step(p, m, v, tokens, i)
            loss.block_until_ready()
            times.append((time.perf_counter() - t) * 1e3)
            i += 1
        a1 = jax.local_devices()[0].memory_stats().get("num_allocs", 0)
        times.sort()
        return times[len(times) // 2], (a1 - a0) / k

    run(10)  # compile and warm up
    if phases is None:
        med, allocs = run(n)
        print("STEP_MS %.4f ALLOCS_PER_STEP %.1f" % (med, allocs), flush=True)
        return
    done = set()
    while not os.path.exists(os.path.join(phases, "stop")):
        todo = sorted(f for f in os.listdir(phases) if (f.startswith("bare_") or f.startswith("agent_")) and not f.endswith(".done") and f not in done)
        if not todo:
            time.sleep(0.05)
            continue
        name = todo[0]
        med, allocs = run(n)
        print("PHASE %s %.4f %.1f" % (name, med, allocs), flush=True)
        done.add(name)
        open(os.path.join(phases, name + ".done"), "w").close()


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "train":
        alive = train(int(sys.argv[2]) if len(sys.argv) > 2 else 60)
    elif what == "frag":
        frag()
    elif what == "bench":
        bench(int(sys.argv[2]) if len(sys.argv) > 2 else 200, sys.argv[3] if len(sys.argv) > 3 else None)
    time.sleep(1.0)
