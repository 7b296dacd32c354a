from . import memory, memory_hook, runtime  # noqa: F401
