"""Framework out-of-memory errors seen the moment the framework makes them, whatever the program
then does with them (catches it and goes on, retries smaller, or dies of it).

An exception's constructor runs once, in the failing thread, before any handler of the program
sees the exception: jaxlib's C++ translator builds `jax.errors.JaxRuntimeError(msg, code)` when
XLA returns an error status (jaxlib/jax.cc, `translate_xla_runtime_error`), and CuPy's pool raises
`cupy.cuda.memory.OutOfMemoryError(size, total, limit)` (cupy/cuda/memory.pyx, `_try_malloc`).
`wrap_init` replaces the class's `__init__` with one that calls the original first, with the same
arguments (what it raises and what it sets are the program's, unchanged), then hands the new
instance to the hook inside a guard that swallows every error of the hook's own. Nothing runs on
any other path: no per-allocation cost, no tracing of every raise.

`xla_oom` and `cupy_oom` say whether an exception is the framework's out-of-memory error and give
its figures from the framework's own words: XLA's request from its message (exact where XLA
writes bytes, rounded where it writes `11.85GiB`), CuPy's request, pool total and limit from the
constructor's arguments.
"""

import re
import threading

# absl::StatusCode::kResourceExhausted (the `code` jaxlib passes to JaxRuntimeError).
RESOURCE_EXHAUSTED = 8
UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}

_guard = threading.local()


def wrap_init(cls, seen):
    """Makes `seen(instance, args, kwargs)` run after every construction of `cls`; returns False
    when the class cannot take it (the hook then falls back to the exception hooks)."""
    real = cls.__init__

    def __init__(self, *args, **kwargs):
        real(self, *args, **kwargs)
        if getattr(_guard, "busy", False):
            return  # an error raised inside the hook's own reading (memory_stats): not the program's
        _guard.busy = True
        try:
            seen(self, args, kwargs)
        except Exception:
            pass
        finally:
            _guard.busy = False

    __init__.__doc__ = getattr(real, "__doc__", None)
    __init__.__wrapped__ = real
    try:
        cls.__init__ = __init__
    except (TypeError, AttributeError):
        return False
    return True


def xla_oom(exc, args=(), kwargs=None):
    """An XLA RESOURCE_EXHAUSTED allocation failure: (requested bytes, the rounded text when the
    message writes the size in a unit, device or None); None for any other error."""
    code = (kwargs or {}).get("code", args[1] if len(args) > 1 else None)
    text = str(exc)
    if code is not None and code != RESOURCE_EXHAUSTED:
        return None
    if "RESOURCE_EXHAUSTED" not in text and code != RESOURCE_EXHAUSTED:
        return None
    if not re.search(r"[Oo]ut of (?:host )?memory|[Ff]ailed to allocate|ran out of memory", text):
        return None
    if "Out of host memory" in text:
        return None  # the pinned host allocator's, not the device's
    dev = re.search(r"GPU_(\d+)_bfc|device ordinal (\d+)", text)
    device = int(dev.group(1) or dev.group(2)) if dev else None
    # tf_allocator_adapter.cc: "Out of memory while trying to allocate 12723840768 bytes."
    m = re.search(r"allocate ([\d,]+) bytes", text)
    if m:
        return int(m.group(1).replace(",", "")), None, device
    # "Failed to allocate request for 154.06GiB (165425291480B) on device ordinal 0"
    m = re.search(r"\((\d+)B\)", text)
    if m:
        return int(m.group(1)), None, device
    # "Out of memory while trying to allocate 11.85GiB." (two decimals of its unit)
    m = re.search(r"allocate ([\d.]+)\s*(KiB|MiB|GiB|TiB|B)\b", text)
    if m:
        n = int(float(m.group(1)) * UNITS[m.group(2)])
        return n, (m.group(1) + m.group(2)) if m.group(2) != "B" else None, device
    return 0, None, device


def cupy_oom(exc, args=(), kwargs=None):
    """A CuPy OutOfMemoryError: (requested bytes, the pool's total bytes or None, the pool's limit
    or 0), from the constructor's arguments, else from its message."""
    kwargs = kwargs or {}
    names = ("size", "total", "limit")
    vals = [kwargs.get(n, args[i] if len(args) > i else None) for i, n in enumerate(names)]
    if all(isinstance(v, int) for v in vals[:2]):
        size, total, limit = vals[0], vals[1], vals[2] if isinstance(vals[2], int) else 0
        return size, (total if total >= 0 else None), limit
    text = str(exc)
    m = re.search(r"Out of memory allocating ([\d,]+) bytes", text)
    if not m:
        return None
    t = re.search(r"allocated so far: ([\d,]+) bytes", text)
    lim = re.search(r"limit set to: ([\d,]+) bytes", text)
    num = lambda g: int(g.group(1).replace(",", ""))  # noqa: E731
    return num(m), num(t) if t else None, num(lim) if lim else 0
