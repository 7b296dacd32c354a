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
