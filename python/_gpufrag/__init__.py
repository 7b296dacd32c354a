"""gpufrag's Python start-up hook: framework block-level figures under `gpufrag run`, without root.

`gpufrag run` writes this package and python/sitecustomize.py (which calls `start`) into its
private directory and puts that directory first on PYTHONPATH, so every Python process it traces
runs it at start-up. It does nothing until the program itself has imported a framework; it never
imports torch, jax or cupy, and swallows its own errors: the traced program comes first. Set
GPUFRAG_PYTHON_HOOK=0 to switch it off.

The parts, one module each: conn (the socket, the hello, every frame kind and format),
torch_blocks (PyTorch's caching allocator: the trace tracker or snapshots, the OOM observer),
tracker (the trace tracker library: cache, build, load), frameworks (JAX's and CuPy's statistics,
chunks and OOMs), imports (waiting for a module to be imported).
"""

import os


def start():
    """Starts the hook in this process (called once, by sitecustomize)."""
    import atexit
    import threading
    import time

    from .conn import Conn
    from .frameworks import Frameworks
    from .imports import after_import
    from .torch_blocks import TorchBlocks

    path = os.environ.get("GPUFRAG_SOCK")
    if not path or os.environ.get("GPUFRAG_PYTHON_HOOK", "1") == "0":
        return
    try:
        interval = max(0.05, float(os.environ.get("GPUFRAG_PY_INTERVAL", "1")))
    except ValueError:
        interval = 1.0
    conn = Conn(path)
    torch_blocks = TorchBlocks(conn, interval, os.environ.get("GPUFRAG_TORCH_TRACKER", "auto"))
    frameworks = Frameworks(conn)

    # Wraps torch.cuda._lazy_init as soon as torch.cuda is imported.
    after_import("torch.cuda", torch_blocks.wrap_lazy_init)
    frameworks.install()

    def watcher():
        while not conn.dead:
            torch_blocks.periodic()
            frameworks.stats("periodic")
            time.sleep(interval)

    def at_exit():
        torch_blocks.at_exit()
        frameworks.at_exit()

    try:
        os.register_at_fork(after_in_child=conn.in_child)
    except AttributeError:
        pass
    threading.Thread(target=watcher, name="gpufrag-hook", daemon=True).start()
    atexit.register(at_exit)
