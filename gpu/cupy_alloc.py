# CuPy's memory pool: 8 × 256 MiB, free every other one, release the pool's free blocks.
import cupy as cp
pool = cp.get_default_memory_pool()
a = [cp.ones(64 * 1024 * 1024, dtype=cp.float32) for _ in range(8)]
peak = pool.total_bytes()
del a[::2]
pool.free_all_blocks()
print("CUPY peak", peak, "total", pool.total_bytes(), "used", pool.used_bytes(), flush=True)
