"""JAX and CuPy under `gpufrag run`, once the program has imported them (never imported here).

- JAX: every GPU device's `memory_stats()` (XLA's BFC allocator: bytes_in_use, pool_bytes,
  largest_free_block_bytes, bytes_limit, peak_bytes_in_use, num_allocs...) every interval, at exit,
  and when an XLA RESOURCE_EXHAUSTED error ("Out of memory while trying to allocate N bytes")
  reaches sys.excepthook or threading.excepthook, with the request parsed from the message: frame 5
  (stats) and frame 6 (the OOM), JSON, each naming its source. An OOM the program catches itself is
  not seen here (the eBPF probes see it).
- CuPy: a `cupy.cuda.memory_hook.MemoryHook` installed for every thread (CuPy's hooks are
  per-thread; `threading.Thread.run` is wrapped so threads started later get it too) sends each
  pool chunk handed out (`malloc_postprocess`: size, mem_size, mem_ptr, pmem_id) and returned
  (`free_postprocess`) as gpufrag wire events (frame 4), so the address map holds CuPy's chunks
  exactly; the pool's own used/total/free bytes go with the periodic stats, and a
  cupy.cuda.memory.OutOfMemoryError is an OOM frame with the request and `memGetInfo`'s free.
"""

import os
import re
import sys
import threading
import time

from . import conn as wire
from .imports import after_import

UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}


def requested_of(text, pattern):
    m = re.search(pattern, text)
    if not m:
        return 0
    n = float(m.group(1).replace(",", ""))
    return int(n * UNITS.get(m.group(2) or "B", 1))


class Frameworks:
    def __init__(self, conn):
        self.conn = conn
        self.cupy_hooked = set()
        self.cupy_hook = None
        self.oom_sent = set()
        self.cupy_devices = set()

    @staticmethod
    def jax_devices():
        jax = sys.modules.get("jax")
        if jax is None:
            return []
        try:
            return [d for d in jax.local_devices() if getattr(d, "platform", "") == "gpu"]
        except Exception:
            return []

    def jax_stats(self, when):
        for d in self.jax_devices():
            try:
                stats = d.memory_stats()
            except Exception:
                continue
            if stats:
                self.conn.send_json(wire.PY_STATS, {"framework": "xla", "source": "jax.Device.memory_stats()", "when": when,
                                                    "device": int(getattr(d, "local_hardware_id", None) or d.id),
                                                    "stats": {k: int(v) for k, v in stats.items()}})

    def cupy_stats(self, when):
        cupy = sys.modules.get("cupy")
        if cupy is None or not self.cupy_hooked:
            return
        try:
            pool = cupy.get_default_memory_pool()
            dev = int(cupy.cuda.runtime.getDevice())
            stats = {"used_bytes": int(pool.used_bytes()), "total_bytes": int(pool.total_bytes()), "free_bytes": int(pool.free_bytes())}
        except Exception:
            return
        self.conn.send_json(wire.PY_STATS, {"framework": "cupy", "source": "cupy.get_default_memory_pool()", "when": when, "device": dev, "stats": stats})

    def stats(self, when):
        self.jax_stats(when)
        self.cupy_stats(when)

    def framework_oom(self, exc):
        """An uncaught exception: an XLA RESOURCE_EXHAUSTED or a CuPy OutOfMemoryError becomes an OOM frame."""
        if exc is None or id(exc) in self.oom_sent:
            return
        text = str(exc)
        name = type(exc).__name__
        if "RESOURCE_EXHAUSTED" in text or ("Out of memory while trying to allocate" in text and "jax" in sys.modules):
            self.oom_sent.add(id(exc))
            pat = r"Out of memory while trying to allocate ([\d.,]+)\s*(B|KiB|MiB|GiB|TiB)?"
            req = requested_of(text, pat)
            size = re.search(pat, text)
            # XLA writes the size rounded ("11.85GiB", HumanReadableNumBytes): exact only in bytes
            rounded = size.group(0).rsplit(" ", 1)[-1] if size and (size.group(2) or "B") != "B" else None
            dev = re.search(r"GPU_(\d+)_bfc", text)
            self.jax_stats("oom")
            self.conn.send_json(wire.PY_FRAMEWORK_OOM, {"framework": "xla", "source": "XLA RESOURCE_EXHAUSTED", "device": int(dev.group(1)) if dev else 0,
                                                        "requested": req, "requested_text": rounded, "message": text[:400]})
        elif name == "OutOfMemoryError" and "cupy" in sys.modules:
            self.oom_sent.add(id(exc))
            req = requested_of(text, r"Out of memory allocating ([\d,]+) bytes()")
            cupy = sys.modules["cupy"]
            free = None
            try:
                dev = int(cupy.cuda.runtime.getDevice())
                free = int(cupy.cuda.runtime.memGetInfo()[0])
            except Exception:
                dev = 0
            self.cupy_stats("oom")
            self.conn.send_json(wire.PY_FRAMEWORK_OOM, {"framework": "cupy", "source": "cupy.cuda.memory.OutOfMemoryError", "device": dev,
                                                        "requested": req, "device_free": free, "message": text[:400]})

    def make_cupy_hook(self, cupy):
        base = cupy.cuda.memory_hook.MemoryHook
        fw, conn = self, self.conn

        class GpufragMemoryHook(base):
            """Sends every chunk CuPy's pool hands out and takes back (pool ids in `handle`)."""

            name = "GpufragMemoryHook"

            def malloc_preprocess(self, device_id, size, mem_size):
                # Before the pool's first driver call on this device: CuPy's pool manages its
                # memory, so a failed cudaMalloc is the pool's try (it frees and retries), not the OOM.
                if device_id not in fw.cupy_devices:
                    fw.cupy_devices.add(device_id)
                    conn.send(wire.PY_EVENTS, wire.EVENT.pack(time.monotonic_ns(), 0, 0, 0, 0, 0, 0, os.getpid(), threading.get_native_id(),
                                                              wire.EV_ADOPT, device_id, 0, wire.F_ALLOC_CUPY, 0, 0))

            def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
                if mem_ptr:
                    conn.send(wire.PY_EVENTS, wire.EVENT.pack(time.monotonic_ns(), mem_ptr, mem_size, size, pmem_id, 0, 0, os.getpid(),
                                                              threading.get_native_id(), wire.EV_BLOCK_ALLOC, device_id, 0,
                                                              wire.F_BLOCK_SIZE_KNOWN | wire.F_ALLOC_CUPY, 0, 0))

            def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
                if mem_ptr:
                    conn.send(wire.PY_EVENTS, wire.EVENT.pack(time.monotonic_ns(), mem_ptr, mem_size, 0, pmem_id, 0, 0, os.getpid(),
                                                              threading.get_native_id(), wire.EV_BLOCK_FREE, device_id, 0, wire.F_ALLOC_CUPY, 0, 0))

        return GpufragMemoryHook()

    def hook_cupy_thread(self):
        """CuPy's memory hooks are per thread: installs ours in the calling thread."""
        cupy = sys.modules.get("cupy")
        if cupy is None or self.conn.dead:
            return
        tid = threading.get_ident()
        if tid in self.cupy_hooked:
            return
        try:
            if self.cupy_hook is None:
                self.cupy_hook = self.make_cupy_hook(cupy)
            self.cupy_hook.__enter__()
            self.cupy_hooked.add(tid)
        except Exception:
            pass

    def install(self):
        """Wraps Thread.run (CuPy's per-thread hook) and both exception hooks (framework OOMs)."""
        fw = self
        real_thread_run = threading.Thread.run

        def thread_run(self, *a, **k):
            fw.hook_cupy_thread()
            return real_thread_run(self, *a, **k)

        threading.Thread.run = thread_run
        # Hooks the importing (main) thread as soon as cupy finishes importing.
        after_import("cupy", lambda module: self.hook_cupy_thread())

        real_excepthook = sys.excepthook

        def excepthook(tp, value, tb):
            try:
                fw.framework_oom(value)
            except Exception:
                pass
            return real_excepthook(tp, value, tb)

        sys.excepthook = excepthook
        real_thread_excepthook = threading.excepthook

        def thread_excepthook(args):
            try:
                fw.framework_oom(args.exc_value)
            except Exception:
                pass
            return real_thread_excepthook(args)

        threading.excepthook = thread_excepthook

    def at_exit(self):
        self.framework_oom(getattr(sys, "last_value", None))
        self.stats("exit")
