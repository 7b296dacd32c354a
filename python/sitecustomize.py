"""gpufrag's Python start-up hook: PyTorch block-level figures under `gpufrag run`, without root.

`gpufrag run` writes this file into its private directory and puts that directory first on
PYTHONPATH, so every Python process it traces imports it at start-up. The hook does nothing until
the program itself has imported torch and initialised CUDA: an import hook wraps
`torch.cuda._lazy_init` (which PyTorch's C++ side calls on the first CUDA use), so the moment CUDA
is up the hook connects to the consumer's socket (GPUFRAG_SOCK), says that a caching allocator
manages this process's memory, and attaches PyTorch's out-of-memory observer. It then sends
`torch.cuda.memory._snapshot()` (the caching allocator's segments and blocks) every
GPUFRAG_PY_INTERVAL seconds (default 1), when the out-of-memory observer fires (with the request
and the device free PyTorch measured), and at exit. With `backend:cudaMallocAsync` there are no
blocks to send (the driver's pools hold them) and the hook stays quiet. It never turns on history
recording, never imports torch itself, and swallows its own errors: the traced program comes first.
Set GPUFRAG_PYTHON_HOOK=0 to switch it off. A sitecustomize the program had is imported after it.
"""

import os
import sys


def _gpufrag_hook():
    import atexit
    import pickle
    import socket
    import struct
    import threading
    import time

    path = os.environ.get("GPUFRAG_SOCK")
    if not path or os.environ.get("GPUFRAG_PYTHON_HOOK", "1") == "0":
        return
    try:
        interval = max(0.05, float(os.environ.get("GPUFRAG_PY_INTERVAL", "1")))
    except ValueError:
        interval = 1.0
    st = {"sock": None, "dead": False, "armed": False, "pid": os.getpid()}
    lock = threading.Lock()

    def hello():
        try:
            with open("/proc/self/comm", "rb") as f:
                comm = f.read().strip()[:23]
            with open("/proc/self/stat", "rb") as f:
                start = int(f.read().rsplit(b")", 1)[1].split()[19])
        except (OSError, ValueError, IndexError):
            comm, start = b"python", 0
        return b"GFHELLO1" + struct.pack("<IIQQII", os.getpid(), os.getppid(), 0, start, 0, 2) + comm.ljust(24, b"\0")

    def send(kind, body):
        with lock:
            if st["dead"] or st["pid"] != os.getpid():
                return
            try:
                if st["sock"] is None:
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.connect(path)
                    s.sendall(hello())
                    st["sock"] = s
                st["sock"].sendall(struct.pack("<4sIQ", b"GFPY", kind, len(body)) + body)
            except OSError:
                st["dead"] = True

    def cuda_ready():
        torch = sys.modules.get("torch")
        try:
            return torch is not None and torch.cuda.is_initialized()
        except Exception:
            return False

    def snapshot():
        if not cuda_ready():
            return
        try:
            snap = sys.modules["torch"].cuda.memory._snapshot()
            snap.pop("device_traces", None) if not any(snap.get("device_traces", [])) else None
            snap.setdefault("device_traces", [])
            send(1, pickle.dumps(snap, protocol=4))
        except Exception:
            pass

    def on_oom(device, alloc, device_allocated, device_free):
        snapshot()
        try:
            send(2, struct.pack("<qQQQ", int(device), int(alloc), int(device_allocated), int(device_free)))
        except Exception:
            pass

    def native_backend():
        try:
            return sys.modules["torch"].cuda.get_allocator_backend() == "native"
        except Exception:
            return False

    def arm():
        if st["armed"] or not cuda_ready():
            return
        st["armed"] = True
        if not native_backend():
            st["dead"] = True
            return
        torch = sys.modules["torch"]
        try:
            send(3, struct.pack("<q", int(torch.cuda.current_device())))
            torch._C._cuda_attach_out_of_memory_observer(on_oom)
        except Exception:
            pass

    def wrap_lazy_init(cuda):
        orig = getattr(cuda, "_lazy_init", None)
        if orig is None or getattr(orig, "_gpufrag", False):
            return

        def _lazy_init(*a, **k):
            r = orig(*a, **k)
            try:
                arm()
            except Exception:
                pass
            return r

        _lazy_init._gpufrag = True
        cuda._lazy_init = _lazy_init

    class _TorchCudaFinder:
        """Wraps torch.cuda._lazy_init as soon as torch.cuda is imported."""

        def find_spec(self, name, path=None, target=None):
            if name != "torch.cuda":
                return None
            import importlib.machinery

            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return None
            real_exec = spec.loader.exec_module

            def exec_module(module):
                real_exec(module)
                try:
                    wrap_lazy_init(module)
                except Exception:
                    pass

            spec.loader.exec_module = exec_module
            return spec

    if "torch.cuda" in sys.modules:
        wrap_lazy_init(sys.modules["torch.cuda"])
    else:
        sys.meta_path.insert(0, _TorchCudaFinder())

    def watcher():
        while not st["dead"]:
            if cuda_ready():
                arm()
                if st["armed"] and not st["dead"]:
                    snapshot()
            time.sleep(interval)

    def in_child():
        # A forked child shares the parent's socket: it must not write into it.
        st["sock"] = None
        st["dead"] = True

    try:
        os.register_at_fork(after_in_child=in_child)
    except AttributeError:
        pass
    threading.Thread(target=watcher, name="gpufrag-hook", daemon=True).start()
    atexit.register(lambda: (arm(), None if st["dead"] else snapshot()))


def _gpufrag_chain():
    """Imports the sitecustomize this one shadows, if there is one."""
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    for p in sys.path:
        if not p or os.path.abspath(p) == here:
            continue
        cand = os.path.join(p, "sitecustomize.py")
        if os.path.isfile(cand):
            spec = importlib.util.spec_from_file_location("_gpufrag_next_sitecustomize", cand)
            if spec and spec.loader:
                mod = importlib.util.module_from_spec(spec)
                spec.loader.exec_module(mod)
            return


try:
    _gpufrag_hook()
except Exception:
    pass
_gpufrag_chain()
