# A CuPy workload for the frameworks validation: arrays of varied sizes, some freed, the pool's own
# used/total/free bytes printed as `POOL {json}` at the end (with the arrays still alive), then a
# request larger than any free chunk (a CuPy OutOfMemoryError, uncaught, for gpufrag run's hook).
import json
import sys
import time

import cupy

MIB = 1 << 20
pool = cupy.get_default_memory_pool()
big = cupy.empty(4096 * MIB, dtype=cupy.uint8)
del big
arrays = [cupy.empty((i % 9 + 1) * 37 * MIB // 8, dtype=cupy.uint8) for i in range(60)]
del arrays[::3]
cupy.cuda.Device().synchronize()
time.sleep(1.0)
print("POOL", json.dumps({"used_bytes": pool.used_bytes(), "total_bytes": pool.total_bytes(), "free_bytes": pool.free_bytes()}), flush=True)
if len(sys.argv) > 1 and sys.argv[1] == "oom":
    free, total = cupy.cuda.runtime.memGetInfo()
    print("FREE", free, flush=True)
    x = cupy.empty(int(free * 1.5), dtype=cupy.uint8)
time.sleep(1.0)
