"""JAX and CuPy under `gpufrag run`, once the program has imported them (never imported here).

- JAX: every GPU device's `memory_stats()` (XLA's BFC allocator: bytes_in_use, pool_bytes,
  largest_free_block_bytes, bytes_limit, peak_bytes_in_use, num_allocs...) every interval and at
  exit (frame 5, JSON, naming its source).
- CuPy: a `cupy.cuda.memory_hook.MemoryHook` installed for every thread (CuPy's hooks are
  per-thread; `threading.Thread.run` is wrapped so threads started later get it too) sends each
  pool chunk handed out (`malloc_postprocess`: size, mem_size, mem_ptr, pmem_id) and returned
  (`free_postprocess`) as gpufrag wire events (frame 4), so the address map holds CuPy's chunks
  exactly; the pool's own used/total/free bytes go with the periodic stats.
- Their out-of-memory errors, XLA's RESOURCE_EXHAUSTED (`jax.errors.JaxRuntimeError`) and CuPy's
  `cupy.cuda.memory.OutOfMemoryError`, are seen when the framework makes them (oom_errors: the
  class's constructor), caught by the program or not: the framework's statistics read at that
  moment (frame 5, `when` "oom") and the OOM (frame 6: the request from XLA's message or CuPy's
  arguments, CuPy's pool total and limit, `memGetInfo`'s free). sys.excepthook,
  threading.excepthook and the exit see those the constructor could not (a class that refused
  the wrapper); each error is sent once.
"""

import os
import sys
import threading
import time

from . import conn as wire
from . import oom_errors
from .imports import after_import

class Frameworks:
    def __init__(self, conn):
        self.conn = conn
        self.cupy_hooked = set()
        self.cupy_hook = None
        self.oom_sent = set()
        self.cupy_devices = set()
        self.jax_device_cache = []
        self.jax_error_types = []
        self.cupy_error_types = []

    @staticmethod
    def jax_devices():
        jax = sys.modules.get("jax")
        if jax is None:
            return []
        try:
            return [d for d in jax.local_devices() if getattr(d, "platform", "") == "gpu"]
        except Exception:
            return []

    def jax_stats(self, when, devices=None):
        if devices is None:
            devices = self.jax_devices()
            if devices:
                self.jax_device_cache = devices
        for d in devices:
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

    def jax_devices_at_failure(self):
        """JAX's GPU devices without jax.local_devices(), which takes xla_bridge's backend lock
        (not reentrant: an error raised while the thread holds it would hang the program): the
        clients already made, else the devices the periodic read last found."""
        xb = sys.modules.get("jax._src.xla_bridge")
        try:
            clients = list(getattr(xb, "_backends", {}).values()) if xb else []
            devs = [d for c in clients for d in c.local_devices() if getattr(d, "platform", "") == "gpu"]
        except Exception:
            devs = []
        return devs or list(self.jax_device_cache)

    def framework_oom(self, exc, args=(), kwargs=None, at="hook"):
        """An XLA RESOURCE_EXHAUSTED or a CuPy OutOfMemoryError becomes an OOM frame (6), after
        the framework's own statistics read now (frame 5, `when` "oom"). `at` says who saw it:
        "raised" (its constructor, oom_errors.wrap_init) or "hook" (an exception hook, at exit)."""
        if exc is None or id(exc) in self.oom_sent:
            return
        jax_types = tuple(self.jax_error_types)
        cupy_types = tuple(self.cupy_error_types)
        xla = oom_errors.xla_oom(exc, args, kwargs) if (jax_types and isinstance(exc, jax_types)) or (not jax_types and "jax" in sys.modules) else None
        if xla is not None:
            self.oom_sent.add(id(exc))
            req, rounded, dev = xla
            self.jax_stats("oom", self.jax_devices_at_failure())
            self.conn.send_json(wire.PY_FRAMEWORK_OOM, {"framework": "xla", "source": "XLA RESOURCE_EXHAUSTED", "seen": at,
                                                        "device": dev if dev is not None else 0, "requested": req,
                                                        "requested_text": rounded, "message": str(exc)[:400]})
            return
        is_cupy = isinstance(exc, cupy_types) if cupy_types else (type(exc).__name__ == "OutOfMemoryError" and "cupy" in sys.modules)
        got = oom_errors.cupy_oom(exc, args, kwargs) if is_cupy else None
        if got is None:
            return
        self.oom_sent.add(id(exc))
        req, total, limit = got
        cupy = sys.modules["cupy"]
        free = None
        try:
            dev = int(cupy.cuda.runtime.getDevice())
            free = int(cupy.cuda.runtime.memGetInfo()[0])
        except Exception:
            dev = 0
        self.cupy_stats("oom")
        self.conn.send_json(wire.PY_FRAMEWORK_OOM, {"framework": "cupy", "source": "cupy.cuda.memory.OutOfMemoryError", "seen": at, "device": dev,
                                                    "requested": req, "device_free": free, "pool_total": total, "pool_limit": limit,
                                                    "message": str(exc)[:400]})

    def hook_jax_errors(self, jax):
        """XLA's errors are seen as jaxlib makes them: JaxRuntimeError (jax.errors; XlaRuntimeError
        in older jaxlib)."""
        kinds = [getattr(getattr(jax, "errors", None), "JaxRuntimeError", None)]
        xc = sys.modules.get("jaxlib.xla_client")
        kinds.append(getattr(xc, "XlaRuntimeError", None) if xc else None)
        for cls in kinds:
            if isinstance(cls, type) and cls not in self.jax_error_types and oom_errors.wrap_init(cls, self.raised):
                self.jax_error_types.append(cls)

    def hook_cupy_errors(self, cupy):
        """CuPy's OutOfMemoryError is seen as its pool makes it."""
        try:
            cls = cupy.cuda.memory.OutOfMemoryError
        except AttributeError:
            return
        if isinstance(cls, type) and cls not in self.cupy_error_types and oom_errors.wrap_init(cls, self.raised):
            self.cupy_error_types.append(cls)

    def raised(self, exc, args, kwargs):
        if not self.conn.dead:
            self.framework_oom(exc, args, kwargs, at="raised")

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
        """Wraps Thread.run (CuPy's per-thread hook), the frameworks' OOM errors (when they are
        imported) and both exception hooks (the fallback)."""
        fw = self
        real_thread_run = threading.Thread.run

        def thread_run(self, *a, **k):
            fw.hook_cupy_thread()
            return real_thread_run(self, *a, **k)

        threading.Thread.run = thread_run
        # Hooks the importing (main) thread and CuPy's OOM error as soon as cupy finishes importing.
        after_import("cupy", lambda module: (self.hook_cupy_thread(), self.hook_cupy_errors(module)))
        after_import("jax", self.hook_jax_errors)

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
