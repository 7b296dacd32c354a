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
