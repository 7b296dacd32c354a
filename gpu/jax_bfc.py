# JAX workloads for the frameworks validation (gpu/validate_frameworks.sh), each printing XLA's
# own figures (device.memory_stats()) as `BFCSTATS <when> {json}` lines to compare with gpufrag's.
#   train N   a training loop with variable shapes (batch and sequence change every step), N steps
#   frag      fill the pool with 256 MiB buffers, free every other one, ask for 11.85 GiB: a
#             fragmentation OOM inside BFC; the RESOURCE_EXHAUSTED is re-raised (uncaught) so that
#             gpufrag run's hook sees it too
#   bench N   N timed steps of a fixed-shape training step; prints `STEP_MS median`
import json
import sys
import time

import jax
import jax.numpy as jnp


def stats(when):
    s = jax.local_devices()[0].memory_stats()
    keys = ["bytes_in_use", "largest_free_block_bytes", "pool_bytes", "bytes_limit", "peak_bytes_in_use", "num_allocs", "bytes_reserved", "largest_alloc_size"]
    print("BFCSTATS", when, json.dumps({k: int(s.get(k, -1)) for k in keys}), flush=True)


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


def bench(n):
    key = jax.random.PRNGKey(0)
    params = [jax.random.normal(key, (2048, 2048)) * 0.01 for _ in range(6)]
    x = jax.random.normal(key, (512, 2048))
    step = jax.jit(lambda p, x: [pi - 1e-3 * gi for pi, gi in zip(p, jax.grad(mlp)(p, x))])
    for _ in range(20):
        params = step(params, x)
    jax.block_until_ready(params)
    times = []
    for _ in range(n):
        t = time.perf_counter()
        params = step(params, x)
        jax.block_until_ready(params)
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    print("STEP_MS %.4f" % times[len(times) // 2], flush=True)


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "train":
        train(int(sys.argv[2]) if len(sys.argv) > 2 else 60)
    elif what == "frag":
        frag()
    elif what == "bench":
        bench(int(sys.argv[2]) if len(sys.argv) > 2 else 200)
    time.sleep(1.0)
