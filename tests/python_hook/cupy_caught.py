# A CuPy program that catches its pool's OutOfMemoryError and runs on (cupy_work.py's sequence: one
# 40 MiB array freed, ten 4 MiB arrays carved from its chunk, every other one freed, then 30 MiB
# asked for: 20 MiB free in the pool in 4 MiB pieces, 24 MiB on the device, a fragmentation OOM).
# The handler prints what it got (the error reached it unchanged), frees and allocates again.
import cupy
import cupy.cuda.memory

MIB = 1 << 20
big = cupy.empty(40 * MIB)
del big
arrays = [cupy.empty(4 * MIB) for _ in range(10)]
del arrays[::2]
pool = cupy.get_default_memory_pool()
print("POOL used=%d total=%d free=%d" % (pool.used_bytes(), pool.total_bytes(), pool.free_bytes()), flush=True)
try:
    x = cupy.empty(30 * MIB)
    print("NO_OOM", flush=True)
except cupy.cuda.memory.OutOfMemoryError as e:
    print("CAUGHT type=%s args=%r" % (type(e).__name__, e.args), flush=True)
del arrays
y = cupy.empty(8 * MIB)
print("AFTER ok", flush=True)
