"""PyTorch's allocator trace tracker (python/torch_tracker.cpp): where its library is cached, how
it is built, and how it is loaded.

A plain shared library built once with the system C++ compiler against torch's own headers,
cached per torch version, CUDA version, C++ ABI and source hash, loaded with ctypes and attached
right after CUDA's lazy initialisation, before the first block (torch_blocks.blocks_source
decides when). The build writes to a temporary file then renames it, so no process ever loads
half of one.
"""

import os
import time


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gpufrag")


def tracker_sources():
    """The tracker's source files, from GPUFRAG_TRACKER_SRC or beside the hook (python/)."""
    here = os.environ.get("GPUFRAG_TRACKER_SRC") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
    """The build's environment: it must not be traced (nor hold the consumer's socket open)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GPUFRAG_") and k != "LD_PRELOAD"}


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
    """Loads the library and attaches it to PyTorch's allocator: (library, None) or (None, why)."""
    import ctypes

    lib = ctypes.CDLL(path)
    lib.gpufrag_torch_tracker_attach.restype = ctypes.c_int
    rc = lib.gpufrag_torch_tracker_attach()
    if rc < 0:
        return None, {-1: "the shim's annotation functions are not loaded", -2: "PyTorch refused the tracker"}.get(rc, f"attach returned {rc}")
    return lib, None
