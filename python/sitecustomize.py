"""gpufrag's Python start-up hook: PyTorch block-level figures under `gpufrag run`, without root.

`gpufrag run` writes this file into its private directory and puts that directory first on
PYTHONPATH, so every Python process it traces imports it at start-up. The hook does nothing until
the program itself has imported torch and initialised CUDA: an import hook wraps
`torch.cuda._lazy_init` (which PyTorch's C++ side calls on the first CUDA use), so the moment CUDA
is up the hook connects to the consumer's socket (GPUFRAG_SOCK), says that a caching allocator
manages this process's memory, attaches PyTorch's allocator trace tracker
(torch_tracker.cpp, built and cached per GPUFRAG_TORCH_TRACKER, see blocks_source) and PyTorch's
out-of-memory observer. With the tracker every allocation, free and OOM reaches the shim's ring as
one event and no snapshot is taken (the observer only adds the OOM's allowed bytes when
set_per_process_memory_fraction caps the allocator, frame 8). Without it (not built yet, no
compiler, --torch-tracker=off) it sends `torch.cuda.memory._snapshot()` (the caching allocator's
segments and blocks) every GPUFRAG_PY_INTERVAL seconds (default 1), when the out-of-memory
observer fires (with the request, the device free PyTorch measured and, when
set_per_process_memory_fraction caps the allocator, its allowed bytes), and at exit. Either way it
says which (frame 7). With `backend:cudaMallocAsync` there are no
blocks to send (the driver's pools hold them) and the hook stays quiet. It never turns on history
recording, never imports torch itself, and swallows its own errors: the traced program comes first.
Set GPUFRAG_PYTHON_HOOK=0 to switch it off. A sitecustomize the program had is imported after it.

JAX and CuPy, once the program has imported them (the hook never imports either):
- JAX: every GPU device's `memory_stats()` (XLA's BFC allocator: bytes_in_use, pool_bytes,
  largest_free_block_bytes, bytes_limit, peak_bytes_in_use, num_allocs...) is sent every
  GPUFRAG_PY_INTERVAL seconds, at exit, and when an XLA RESOURCE_EXHAUSTED error ("Out of memory
  while trying to allocate N bytes") reaches sys.excepthook or threading.excepthook, with the
  request parsed from the message: frame 5 (stats) and frame 6 (the OOM), JSON, each naming its
  source. An OOM the program catches itself is not seen here (the eBPF probes see it).
- CuPy: a `cupy.cuda.memory_hook.MemoryHook` installed for every thread (CuPy's hooks are
  per-thread; the hook wraps `threading.Thread.run` so threads started later get it too) sends
  each pool chunk handed out (`malloc_postprocess`: size, mem_size, mem_ptr, pmem_id) and
  returned (`free_postprocess`) as gpufrag wire events (frame 4), so the address map holds CuPy's
  chunks exactly; the pool's own used/total/free bytes go with the periodic stats, and a
  cupy.cuda.memory.OutOfMemoryError is an OOM frame with the request and `memGetInfo`'s free.
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
    st = {"sock": None, "dead": False, "armed": False, "pid": os.getpid(), "tracker": False}
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

    def allowed_bytes(device, limit):
        """The allowed bytes of set_per_process_memory_fraction, or 0 when no fraction caps the
        allocator: PyTorch passes its observers the allowed bytes when a fraction is set and the
        device total otherwise."""
        torch = sys.modules["torch"]
        get = getattr(torch.cuda, "get_per_process_memory_fraction", None)
        if get is not None:
            return int(limit) if float(get(int(device))) < 1.0 else 0
        total = int(torch.cuda.mem_get_info(int(device))[1])
        return int(limit) if int(limit) < total else 0

    def on_oom(device, alloc, limit, device_free):
        # PyTorch 2.11 calls observers with (device, alloc_size, set_fraction ?
        # allowed_memory_maximum : device_total, device_free), after releasing its lock.
        if st["tracker"]:
            # The tracker's OOM entry is in the ring, ordered with the blocks; what it cannot
            # carry is the cap: the allowed bytes go as an amendment of that OOM (frame 8).
            try:
                allowed = allowed_bytes(device, limit)
                if allowed:
                    send(8, struct.pack("<qQQ", int(device), int(alloc), allowed))
            except Exception:
                pass
            return
        snapshot()
        try:
            allowed = allowed_bytes(device, limit)
        except Exception:
            allowed = 0
        try:
            send(2, struct.pack("<qQQQQ", int(device), int(alloc), int(limit), int(device_free), allowed))
        except Exception:
            pass

    def native_backend():
        try:
            return sys.modules["torch"].cuda.get_allocator_backend() == "native"
        except Exception:
            return False

    def arm(early=False):
        """early: called from the lazy-init wrapper, before any block exists (the tracker only
        attaches then: a block handed out before it would be freed unknown)."""
        with lock:
            if st["armed"] or not cuda_ready():
                return
            st["armed"] = True
        if not native_backend():
            st["dead"] = True
            return
        torch = sys.modules["torch"]
        try:
            send(3, struct.pack("<q", int(torch.cuda.current_device())))
        except Exception:
            pass
        st["choosing"] = True
        try:
            blocks_source(torch, early)
        except Exception as e:
            send_json(7, {"blocks": "snapshots", "note": f"PyTorch blocks from snapshots every {interval:g} s: the trace tracker failed ({type(e).__name__}: {e})"})
        st["choosing"] = False
        # with the tracker too: on_oom then sends only the cap's allowed bytes (frame 8)
        try:
            torch._C._cuda_attach_out_of_memory_observer(on_oom)
        except Exception:
            pass

    # PyTorch's allocator trace tracker (python/torch_tracker.cpp): event-level blocks, O(1) per
    # allocation, instead of a snapshot a second. A plain shared library built once with the
    # system C++ compiler against torch's own headers, cached per torch version, CUDA version and
    # source hash, loaded with ctypes and attached right here, after CUDA's lazy initialisation
    # and before the first block. GPUFRAG_TORCH_TRACKER: auto (the default: use it when cached,
    # else snapshots for this run while a detached process builds it for the next), build (build
    # it now, before the program's first allocation), off (snapshots).
    tracker_mode = os.environ.get("GPUFRAG_TORCH_TRACKER", "auto")

    def cache_dir():
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.path.join(base, "gpufrag")

    def tracker_sources():
        here = os.environ.get("GPUFRAG_TRACKER_SRC") or os.path.dirname(os.path.abspath(__file__))
        out = {}
        for name in ("torch_tracker.cpp", "torch_trace.h"):
            with open(os.path.join(here, name), "rb") as f:
                out[name] = f.read()
        return out

    def compiler():
        import shutil

        for c in ([os.environ["CXX"]] if os.environ.get("CXX") else []) + ["c++", "g++", "clang++"]:
            path = shutil.which(c)
            if path:
                return path
        return None

    def cached_library(torch):
        """(library path, source dir, sources) of this torch's tracker (it may not be built yet),
        or a string saying why there is none. Cheap: no compiler, no cpp_extension import."""
        import hashlib

        try:
            srcs = tracker_sources()
        except OSError as e:
            return f"its source is missing ({e})"
        if not isinstance(getattr(torch, "__version__", None), str):
            return "this torch has no version string to key the library by"
        abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
        h = hashlib.sha256()
        for k in sorted(srcs):
            h.update(k.encode() + b"\0" + srcs[k] + b"\0")
        h.update(f"{torch.__version__}|{getattr(torch.version, 'cuda', None)}|{abi}".encode())
        key = h.hexdigest()[:16]
        safe = "".join(c if c.isalnum() or c in ".+-" else "_" for c in str(torch.__version__))
        d = cache_dir()
        return os.path.join(d, f"torch-tracker-{safe}-{key}.so"), os.path.join(d, f"src-{key}"), srcs

    def build_command(torch, src_dir):
        """The compile command (output path to append), or a string saying why it cannot be built."""
        import glob

        cxx = compiler()
        if cxx is None:
            return "no C++ compiler (c++, g++ or clang++; or set CXX)"
        try:
            from torch.utils import cpp_extension
        except Exception as e:
            return f"torch.utils.cpp_extension is unusable ({type(e).__name__}: {e})"
        try:
            try:
                incs = list(cpp_extension.include_paths("cuda"))
            except TypeError:
                incs = list(cpp_extension.include_paths(cuda=True))
        except Exception:
            try:
                incs = list(cpp_extension.include_paths())
            except Exception as e:
                return f"torch's include paths are unknown ({type(e).__name__}: {e})"
        if not any(os.path.exists(os.path.join(i, "c10", "cuda", "CUDACachingAllocator.h")) for i in incs):
            return "torch's headers (c10/cuda/CUDACachingAllocator.h) are not installed"
        # cuda_runtime_api.h: CUDA_HOME's, else the one the CUDA wheels install beside torch
        cuda_home = getattr(cpp_extension, "CUDA_HOME", None)
        site = os.path.dirname(os.path.dirname(torch.__file__))
        extra = [os.path.join(cuda_home, "include")] if cuda_home else []
        extra += sorted(os.path.dirname(h) for h in glob.glob(os.path.join(site, "nvidia", "*", "include", "cuda_runtime_api.h")))
        for e in extra:
            if os.path.isdir(e) and e not in incs:
                incs.append(e)
        abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
        try:
            lib = list(cpp_extension.library_paths())[0]
        except Exception:
            lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        cmd = [cxx, "-O2", "-shared", "-fPIC", "-std=c++20", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-I", src_dir]
        cmd += [f"-I{i}" for i in incs]
        cmd += [os.path.join(src_dir, "torch_tracker.cpp"), f"-L{lib}", f"-Wl,-rpath,{lib}", "-lc10_cuda", "-lc10", "-o"]
        return cmd

    def write_sources(src_dir, srcs):
        os.makedirs(src_dir, exist_ok=True)
        for name, body in srcs.items():
            tmp = os.path.join(src_dir, f".{name}.{os.getpid()}")
            with open(tmp, "wb") as f:
                f.write(body)
            os.replace(tmp, os.path.join(src_dir, name))

    def clean_env():
        # the build must not be traced (nor hold the consumer's socket open)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUFRAG_") and k != "LD_PRELOAD"}
        return env

    def build_now(out, cmd, src_dir, srcs):
        """Builds the library (temp file + rename: no process ever loads half of one); (seconds, error)."""
        import subprocess

        t0 = time.monotonic()
        write_sources(src_dir, srcs)
        tmp = f"{out}.{os.getpid()}.tmp"
        r = subprocess.run(cmd + [tmp], env=clean_env(), stdin=subprocess.DEVNULL, capture_output=True, timeout=600)
        if r.returncode != 0:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            last = (r.stderr or b"").decode(errors="replace").strip().splitlines()[-3:]
            return time.monotonic() - t0, f"the build failed (exit {r.returncode}): {' / '.join(last)}"
        os.replace(tmp, out)
        return time.monotonic() - t0, None

    def build_detached(out, cmd, src_dir, srcs):
        """Starts the build in a process of its own session that outlives this one; False when
        another build of the same library is under way."""
        import subprocess

        os.makedirs(os.path.dirname(out), exist_ok=True)
        lock = f"{out}.building"
        try:
            if time.time() - os.stat(lock).st_mtime < 900:
                return False
            os.unlink(lock)
        except OSError:
            pass
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            os.close(fd)
        except OSError:
            return False
        write_sources(src_dir, srcs)
        tmp = f"{out}.{os.getpid()}.tmp"
        script = 'start=$(date +%s); "$@" "$T" > "$L" 2>&1 && mv -f "$T" "$O" && echo "built in $(( $(date +%s) - start )) s" >> "$L"; rm -f "$T" "$K"'
        env = clean_env()
        env.update({"T": tmp, "O": out, "L": f"{out}.log", "K": lock})
        subprocess.Popen(["/bin/sh", "-c", script, "gpufrag-tracker-build"] + cmd, env=env, stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
        return True

    def attach_library(path):
        import ctypes

        lib = ctypes.CDLL(path)
        lib.gpufrag_torch_tracker_attach.restype = ctypes.c_int
        rc = lib.gpufrag_torch_tracker_attach()
        if rc < 0:
            return None, {-1: "the shim's annotation functions are not loaded", -2: "PyTorch refused the tracker"}.get(rc, f"attach returned {rc}")
        st["tracker_lib"] = lib
        return lib, None

    def blocks_source(torch, early):
        """Picks how PyTorch's blocks reach gpufrag for this process and says so (frame 7)."""
        snap = f"PyTorch blocks from snapshots every {interval:g} s"
        if tracker_mode == "off":
            send_json(7, {"blocks": "snapshots", "note": f"{snap} (--torch-tracker=off)"})
            return
        if not early:
            send_json(7, {"blocks": "snapshots", "note": f"{snap}: CUDA was initialised before the hook could wrap it, so the trace tracker would miss the blocks handed out before it"})
            return
        plan = cached_library(torch)
        if isinstance(plan, str):
            send_json(7, {"blocks": "snapshots", "note": f"{snap}: the trace tracker is unavailable: {plan}"})
            return
        out, src_dir, srcs = plan
        built = ""
        if not os.path.exists(out):
            cmd = build_command(torch, src_dir)
            if isinstance(cmd, str):
                send_json(7, {"blocks": "snapshots", "note": f"{snap}: the trace tracker is unavailable: {cmd}"})
                return
            if tracker_mode == "build":
                secs, err = build_now(out, cmd, src_dir, srcs)
                if err:
                    send_json(7, {"blocks": "snapshots", "note": f"{snap}: the trace tracker is unavailable: {err}"})
                    return
                built = f"; built in {secs:.1f} s before the first allocation"
            else:
                started = build_detached(out, cmd, src_dir, srcs)
                what = "is being built" if started else "is being built by another process"
                send_json(7, {"blocks": "snapshots", "note": f"{snap}; the trace tracker {what} for the next run (cached in {os.path.dirname(out)})",
                              "building": out})
                return
        _, err = attach_library(out)
        if err:
            send_json(7, {"blocks": "snapshots", "note": f"{snap}: the trace tracker did not attach: {err} ({out})"})
            return
        st["tracker"] = True
        send_json(7, {"blocks": "tracker", "note": f"PyTorch blocks: trace tracker (event level){built}, {out}", "library": out})

    def wrap_lazy_init(cuda):
        orig = getattr(cuda, "_lazy_init", None)
        if orig is None or getattr(orig, "_gpufrag", False):
            return

        def _lazy_init(*a, **k):
            r = orig(*a, **k)
            try:
                arm(early=True)
            except Exception:
                pass
            return r

        _lazy_init._gpufrag = True
        cuda._lazy_init = _lazy_init

    def after_import(name, then):
        """Calls then(module) as soon as module `name` has finished importing (at once if it has)."""
        if name in sys.modules:
            then(sys.modules[name])
            return

        class _Finder:
            def find_spec(self, fullname, path=None, target=None):
                if fullname != name:
                    return None
                import importlib.machinery

                spec = importlib.machinery.PathFinder.find_spec(fullname, path)
                if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                    return None
                real_exec = spec.loader.exec_module

                def exec_module(module):
                    real_exec(module)
                    try:
                        then(module)
                    except Exception:
                        pass

                spec.loader.exec_module = exec_module
                return spec

        sys.meta_path.insert(0, _Finder())

    # Wraps torch.cuda._lazy_init as soon as torch.cuda is imported.
    after_import("torch.cuda", wrap_lazy_init)

    import json
    import re

    # gpufrag's wire event (include/gpufrag_event.h): 80 bytes, little-endian.
    EVENT = struct.Struct("<QQQQQQQIIHhiIHH")
    EV_BLOCK_ALLOC, EV_BLOCK_FREE, EV_ADOPT = 14, 15, 22
    F_BLOCK_SIZE_KNOWN, F_ALLOC_CUPY = 1 << 5, 1 << 9
    fw = {"cupy_hooked": set(), "cupy_hook": None, "oom_sent": set(), "cupy_devices": set()}

    def send_json(kind, obj):
        try:
            send(kind, json.dumps(obj, separators=(",", ":")).encode())
        except Exception:
            pass

    def jax_devices():
        jax = sys.modules.get("jax")
        if jax is None:
            return []
        try:
            return [d for d in jax.local_devices() if getattr(d, "platform", "") == "gpu"]
        except Exception:
            return []

    def jax_stats(when):
        for d in jax_devices():
            try:
                stats = d.memory_stats()
            except Exception:
                continue
            if stats:
                send_json(5, {"framework": "xla", "source": "jax.Device.memory_stats()", "when": when,
                              "device": int(getattr(d, "local_hardware_id", None) or d.id), "stats": {k: int(v) for k, v in stats.items()}})

    def cupy_stats(when):
        cupy = sys.modules.get("cupy")
        if cupy is None or not fw["cupy_hooked"]:
            return
        try:
            pool = cupy.get_default_memory_pool()
            dev = int(cupy.cuda.runtime.getDevice())
            stats = {"used_bytes": int(pool.used_bytes()), "total_bytes": int(pool.total_bytes()), "free_bytes": int(pool.free_bytes())}
        except Exception:
            return
        send_json(5, {"framework": "cupy", "source": "cupy.get_default_memory_pool()", "when": when, "device": dev, "stats": stats})

    units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}

    def requested_of(text, pattern):
        m = re.search(pattern, text)
        if not m:
            return 0
        n = float(m.group(1).replace(",", ""))
        return int(n * units.get(m.group(2) or "B", 1))

    def framework_oom(exc):
        """An uncaught exception: an XLA RESOURCE_EXHAUSTED or a CuPy OutOfMemoryError becomes an OOM frame."""
        if exc is None or id(exc) in fw["oom_sent"]:
            return
        text = str(exc)
        name = type(exc).__name__
        if "RESOURCE_EXHAUSTED" in text or ("Out of memory while trying to allocate" in text and "jax" in sys.modules):
            fw["oom_sent"].add(id(exc))
            pat = r"Out of memory while trying to allocate ([\d.,]+)\s*(B|KiB|MiB|GiB|TiB)?"
            req = requested_of(text, pat)
            size = re.search(pat, text)
            # XLA writes the size rounded ("11.85GiB", HumanReadableNumBytes): exact only in bytes
            rounded = size.group(0).rsplit(" ", 1)[-1] if size and (size.group(2) or "B") != "B" else None
            dev = re.search(r"GPU_(\d+)_bfc", text)
            jax_stats("oom")
            send_json(6, {"framework": "xla", "source": "XLA RESOURCE_EXHAUSTED", "device": int(dev.group(1)) if dev else 0,
                          "requested": req, "requested_text": rounded, "message": text[:400]})
        elif name == "OutOfMemoryError" and "cupy" in sys.modules:
            fw["oom_sent"].add(id(exc))
            req = requested_of(text, r"Out of memory allocating ([\d,]+) bytes()")
            cupy = sys.modules["cupy"]
            free = None
            try:
                dev = int(cupy.cuda.runtime.getDevice())
                free = int(cupy.cuda.runtime.memGetInfo()[0])
            except Exception:
                dev = 0
            cupy_stats("oom")
            send_json(6, {"framework": "cupy", "source": "cupy.cuda.memory.OutOfMemoryError", "device": dev,
                          "requested": req, "device_free": free, "message": text[:400]})

    def make_cupy_hook(cupy):
        base = cupy.cuda.memory_hook.MemoryHook

        class GpufragMemoryHook(base):
            """Sends every chunk CuPy's pool hands out and takes back (pool ids in `handle`)."""

            name = "GpufragMemoryHook"

            def malloc_preprocess(self, device_id, size, mem_size):
                # Before the pool's first driver call on this device: CuPy's pool manages its
                # memory, so a failed cudaMalloc is the pool's try (it frees and retries), not the OOM.
                if device_id not in fw["cupy_devices"]:
                    fw["cupy_devices"].add(device_id)
                    send(4, EVENT.pack(time.monotonic_ns(), 0, 0, 0, 0, 0, 0, os.getpid(), threading.get_native_id(),
                                       EV_ADOPT, device_id, 0, F_ALLOC_CUPY, 0, 0))

            def malloc_postprocess(self, device_id, size, mem_size, mem_ptr, pmem_id):
                if mem_ptr:
                    ev = EVENT.pack(time.monotonic_ns(), mem_ptr, mem_size, size, pmem_id, 0, 0, os.getpid(),
                                    threading.get_native_id(), EV_BLOCK_ALLOC, device_id, 0, F_BLOCK_SIZE_KNOWN | F_ALLOC_CUPY, 0, 0)
                    send(4, ev)

            def free_postprocess(self, device_id, mem_size, mem_ptr, pmem_id):
                if mem_ptr:
                    ev = EVENT.pack(time.monotonic_ns(), mem_ptr, mem_size, 0, pmem_id, 0, 0, os.getpid(),
                                    threading.get_native_id(), EV_BLOCK_FREE, device_id, 0, F_ALLOC_CUPY, 0, 0)
                    send(4, ev)

        return GpufragMemoryHook()

    def hook_cupy_thread():
        """CuPy's memory hooks are per thread: installs ours in the calling thread."""
        cupy = sys.modules.get("cupy")
        if cupy is None or st["dead"]:
            return
        tid = threading.get_ident()
        if tid in fw["cupy_hooked"]:
            return
        try:
            if fw["cupy_hook"] is None:
                fw["cupy_hook"] = make_cupy_hook(cupy)
            fw["cupy_hook"].__enter__()
            fw["cupy_hooked"].add(tid)
        except Exception:
            pass

    real_thread_run = threading.Thread.run

    def thread_run(self, *a, **k):
        hook_cupy_thread()
        return real_thread_run(self, *a, **k)

    threading.Thread.run = thread_run

    # Hooks the importing (main) thread as soon as cupy finishes importing.
    after_import("cupy", lambda module: hook_cupy_thread())

    real_excepthook = sys.excepthook

    def excepthook(tp, value, tb):
        try:
            framework_oom(value)
        except Exception:
            pass
        return real_excepthook(tp, value, tb)

    sys.excepthook = excepthook
    real_thread_excepthook = threading.excepthook

    def thread_excepthook(args):
        try:
            framework_oom(args.exc_value)
        except Exception:
            pass
        return real_thread_excepthook(args)

    threading.excepthook = thread_excepthook

    def watcher():
        while not st["dead"]:
            if cuda_ready():
                arm()
                if st["armed"] and not st["dead"] and not st["tracker"] and not st.get("choosing"):
                    snapshot()
            jax_stats("periodic")
            cupy_stats("periodic")
            time.sleep(interval)

    def at_exit():
        arm()
        if st["tracker"]:
            # the state at exit, as a final snapshot would give it: not the teardown's frees
            try:
                st["tracker_lib"].gpufrag_torch_tracker_stop()
            except Exception:
                pass
        elif not st["dead"]:
            snapshot()
        framework_oom(getattr(sys, "last_value", None))
        jax_stats("exit")
        cupy_stats("exit")

    def in_child():
        # A forked child shares the parent's socket: it must not write into it.
        st["sock"] = None
        st["dead"] = True

    try:
        os.register_at_fork(after_in_child=in_child)
    except AttributeError:
        pass
    threading.Thread(target=watcher, name="gpufrag-hook", daemon=True).start()
    atexit.register(at_exit)


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
