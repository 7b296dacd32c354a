# A JAX program as far as gpufrag's hook can tell: its 64 MiB pool filled with 4 MiB buffers,
# every other one freed, then 20 MiB asked for: 32 MiB free, no free chunk above 4 MiB, and XLA
# raises RESOURCE_EXHAUSTED (uncaught: the program dies of it).
import time

import jax
import jax.numpy as jnp

MIB = 1 << 20
bufs = [jnp.zeros(4 * MIB) for _ in range(16)]
del bufs[::2]
time.sleep(0.2)  # a periodic read goes out too
s = jax.local_devices()[0].memory_stats()
print("STATS bytes_in_use=%d largest_free_block_bytes=%d pool_bytes=%d" % (s["bytes_in_use"], s["largest_free_block_bytes"], s["pool_bytes"]), flush=True)
x = jnp.zeros(20 * MIB)
