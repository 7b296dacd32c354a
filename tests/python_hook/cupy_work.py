# A CuPy workload as far as gpufrag's hook can tell: one 40 MiB array freed, ten 4 MiB arrays
# carved from its chunk, every other one freed, then 30 MiB asked for: the pool has 20 MiB free
# in 4 MiB pieces, the device 24 MiB, and the request fails (a fragmentation OOM).
import cupy

MIB = 1 << 20
big = cupy.empty(40 * MIB)
del big
arrays = [cupy.empty(4 * MIB) for _ in range(10)]
del arrays[::2]
pool = cupy.get_default_memory_pool()
print("POOL used=%d total=%d free=%d" % (pool.used_bytes(), pool.total_bytes(), pool.free_bytes()), flush=True)
x = cupy.empty(30 * MIB)
