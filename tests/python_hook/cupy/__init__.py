# Stand-in for the parts of CuPy 14 that gpufrag's Python hook uses, behaving like the real ones:
# cupy.get_default_memory_pool() (SingleDeviceMemoryPool: 512-byte rounding, best fit, split,
# merge inside one driver allocation, free_all_blocks and one retry before OutOfMemoryError),
# cupy.cuda.memory_hook.MemoryHook (per-thread hooks called with the same keyword arguments),
# cupy.cuda.runtime.getDevice / memGetInfo. Driver memory comes from the real libcuda.so.1 on
# LD_LIBRARY_PATH (simcuda in CI) through cuMemAlloc_v2, so the LD_PRELOAD shim sees it.
from . import cuda  # noqa: F401
from .cuda import memory as _memory


def get_default_memory_pool():
    return _memory._default_pool


class ndarray:
    """Just enough of an array to hold pool memory (freed when it is collected, as in CuPy)."""

    def __init__(self, nbytes):
        self.nbytes = nbytes
        self.data = _memory._default_pool.malloc(nbytes)


def empty(nbytes):
    return ndarray(nbytes)
