# A JAX program that catches its BFC fragmentation OOM and runs on: its 64 MiB pool filled with
# 4 MiB buffers, every other one freed, then 20 MiB + 1 asked for (32 MiB free, no free chunk above
# 4 MiB): XLA raises RESOURCE_EXHAUSTED, the program's own handler takes it (printing what it got,
# to show the error reached it unchanged), frees, allocates again and ends normally.
import jax
import jax.errors
import jax.numpy as jnp

MIB = 1 << 20
bufs = [jnp.zeros(4 * MIB) for _ in range(16)]
del bufs[::2]
s = jax.local_devices()[0].memory_stats()
print("STATS bytes_in_use=%d largest_free_block_bytes=%d pool_bytes=%d" % (s["bytes_in_use"], s["largest_free_block_bytes"], s["pool_bytes"]), flush=True)
try:
    x = jnp.zeros(20 * MIB + 1)
    print("NO_OOM", flush=True)
except jax.errors.JaxRuntimeError as e:
    print("CAUGHT type=%s code=%d args=%r" % (type(e).__name__, e.error_code, e.args), flush=True)
    print("MESSAGE " + str(e), flush=True)
del bufs
y = jnp.zeros(20 * MIB + 1)
print("AFTER ok", flush=True)
