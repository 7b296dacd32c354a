import os
import pickle

from . import memory  # noqa: F401

_initialized = False


def _lazy_init():
    global _initialized
    _initialized = True


def is_initialized():
    return _initialized


def get_allocator_backend():
    return os.environ.get("FAKE_TORCH_BACKEND", "native")


def current_device():
    return 0


def get_per_process_memory_fraction(device=None):
    # What torch.cuda.set_per_process_memory_fraction set (1.0: no cap).
    return float(os.environ.get("FAKE_TORCH_FRACTION", "1.0"))
