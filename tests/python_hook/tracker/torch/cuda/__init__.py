from . import memory  # noqa: F401

_initialized = False

# TraceEntry::Action (c10/core/CachingDeviceAllocator.h)
ALLOC, FREE_REQUESTED, FREE_COMPLETED, SEGMENT_ALLOC, SEGMENT_FREE, SEGMENT_MAP, SEGMENT_UNMAP, SNAPSHOT, OOM = range(9)


def _lazy_init():
    global _initialized
    _initialized = True


def is_initialized():
    return _initialized


def get_allocator_backend():
    return "native"


def current_device():
    return 0


def _trace(action, addr, size, stream=0, device=0):
    """The caching allocator records a trace entry: every attached tracker is called."""
    import torch

    return torch._lib.standin_trace(action, addr, size, stream, device)


_fraction = {}


def mem_get_info(device=None):
    """(free, total) of the device, from the driver (cuMemGetInfo), as PyTorch's does."""
    import ctypes

    cu = ctypes.CDLL("libcuda.so.1")
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def set_per_process_memory_fraction(fraction, device=None):
    """Caps the caching allocator at fraction × the device's total (PyTorch's check is in the
    program's allocator model: grow.py reads get_per_process_memory_fraction)."""
    _fraction[0 if device is None else int(device)] = float(fraction)


def get_per_process_memory_fraction(device=None):
    return _fraction.get(0 if device is None else int(device), 1.0)
