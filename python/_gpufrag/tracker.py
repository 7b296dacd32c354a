"""PyTorch's allocator trace tracker (python/torch_tracker.cpp): where its library is cached, how
it is built, and how it is loaded.

A plain shared library built once with the system C++ compiler against torch's own headers,
cached per torch version, CUDA version, C++ ABI and source hash, loaded with ctypes and attached
right after CUDA's lazy initialisation, before the first block (torch_blocks.blocks_source
decides when). The build writes to a temporary file then renames it, so no process ever loads
half of one.

No file another local user could have placed is ever loaded (the library runs in the traced
process, often as root): the cache folder must be this user's own (created 0700; owner and mode
checked, opened with O_NOFOLLOW; every folder above it owned by this user or root and writable by
nobody else unless sticky: the rule of src/private.rs), and the library is loaded only when it is
a regular file of this user, writable by nobody else, whose SHA-256 matches the one recorded when
it was built; it is loaded through its verified descriptor (/proc/self/fd/N), so a path swapped
after the check changes nothing. The build runs in a fresh private folder (tempfile.mkdtemp) and
its result, hash and log are renamed into place, never written through a symlink.
"""

import hashlib
import os
import stat
import time


class Refused(Exception):
    """A cache folder or file that is not this user's own: the message says which and why."""


def _check_ancestors(path):
    me = os.geteuid()
    p = os.path.realpath(path)
    while True:
        st = os.stat(p)
        if st.st_uid not in (me, 0):
            raise Refused(f"{path}: the folder {p} above it belongs to uid {st.st_uid}, not to you (uid {me}) or root")
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise Refused(f"{path}: the folder {p} above it may be changed by other users (mode {st.st_mode & 0o7777:o})")
        if p == "/":
            return
        p = os.path.dirname(p)


def _verify_dir_fd(fd, path):
    st = os.fstat(fd)
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        raise Refused(f"{path}: not a directory")
    if st.st_uid != me:
        raise Refused(f"{path}: the folder belongs to uid {st.st_uid}, not to you (uid {me})")
    if st.st_mode & 0o022:
        raise Refused(f"{path}: the folder is writable by other users (mode {st.st_mode & 0o7777:o})")
    if st.st_mode & 0o077:
        os.fchmod(fd, 0o700)  # ours, only readable by others: nothing can have been planted


def private_dir(path):
    """Creates (0700) or checks the folder `path`; returns an open descriptor of it, or raises Refused."""
    parent = os.path.dirname(path)
    os.makedirs(parent, mode=0o700, exist_ok=True)
    _check_ancestors(parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise Refused(f"{path}: a symlink or not a directory ({e.strerror})")
    try:
        _verify_dir_fd(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def cache_dir():
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gpufrag")


def file_hash(fd):
    h = hashlib.sha256()
    os.lseek(fd, 0, os.SEEK_SET)
    while True:
        b = os.read(fd, 1 << 20)
        if not b:
            break
        h.update(b)
    return h.hexdigest()


def _open_own_file(name, dfd, shown):
    """A regular file of this user in the private folder `dfd`, writable by nobody else, opened
    without following a symlink; raises Refused."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dfd)
    except OSError as e:
        raise Refused(f"{shown}: {e.strerror}")
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise Refused(f"{shown}: not a regular file of yours that only you can write (uid {st.st_uid}, mode {st.st_mode & 0o7777:o})")
    return fd


def verified_library(path):
    """Opens the cached library at `path` after checking its folder, owner, mode and the hash
    recorded at build time: (descriptor, None) or (None, why)."""
    d, name = os.path.split(path)
    try:
        dfd = private_dir(d)
    except (Refused, OSError) as e:
        return None, f"the cache folder is refused: {e}"
    try:
        try:
            hfd = _open_own_file(name + ".sha256", dfd, path + ".sha256")
            try:
                want = os.read(hfd, 256).decode(errors="replace").strip()
            finally:
                os.close(hfd)
        except Refused as e:
            return None, f"no hash recorded at its build ({e}); it is not loaded"
        fd = _open_own_file(name, dfd, path)
        got = file_hash(fd)
        if got != want:
            os.close(fd)
            return None, f"its SHA-256 {got[:16]}… is not the one recorded at its build ({want[:16]}…); it is not loaded"
        return fd, None
    except Refused as e:
        return None, f"refused: {e}"
    finally:
        os.close(dfd)


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
    try:
        dfd = private_dir(d)
    except (Refused, OSError) as e:
        return f"the cache folder is refused: {e}"
    lib = f"torch-tracker-{safe}-{key}.so"
    try:
        # A library without the hash of its build (an older gpufrag's, or a half-finished one):
        # removed from our own folder so that it is rebuilt, never loaded.
        try:
            os.lstat(lib, dir_fd=dfd)
            os.lstat(lib + ".sha256", dir_fd=dfd)
        except FileNotFoundError:
            try:
                os.unlink(lib, dir_fd=dfd)
            except OSError:
                pass
    finally:
        os.close(dfd)
    return os.path.join(d, lib), os.path.join(d, f"src-{key}"), srcs


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
    os.close(private_dir(src_dir))
    for name, body in srcs.items():
        tmp = os.path.join(src_dir, f".{name}.{os.getpid()}")
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.replace(tmp, os.path.join(src_dir, name))


def build_folder(out):
    """A fresh private folder beside `out` for one build (mkdtemp: 0700, made by this call)."""
    import tempfile

    os.close(private_dir(os.path.dirname(out)))
    return tempfile.mkdtemp(prefix=".build-", dir=os.path.dirname(out))


HASH_SCRIPT = "import hashlib,sys;print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())"


def clean_env():
    """The build's environment: it must not be traced (nor hold the consumer's socket open)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("GPUFRAG_") and k != "LD_PRELOAD"}


def build_now(out, cmd, src_dir, srcs):
    """Builds the library (temp file + rename: no process ever loads half of one); (seconds, error)."""
    import subprocess

    import shutil

    t0 = time.monotonic()
    try:
        write_sources(src_dir, srcs)
        work = build_folder(out)
    except (Refused, OSError) as e:
        return time.monotonic() - t0, f"the cache folder is refused: {e}"
    try:
        tmp = os.path.join(work, "lib.so")
        r = subprocess.run(cmd + [tmp], env=clean_env(), stdin=subprocess.DEVNULL, capture_output=True, timeout=600)
        if r.returncode != 0:
            last = (r.stderr or b"").decode(errors="replace").strip().splitlines()[-3:]
            return time.monotonic() - t0, f"the build failed (exit {r.returncode}): {' / '.join(last)}"
        fd = os.open(tmp, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            digest = file_hash(fd)
        finally:
            os.close(fd)
        hfd = os.open(os.path.join(work, "lib.sha256"), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(hfd, "w") as f:
            f.write(digest + "\n")
        os.replace(os.path.join(work, "lib.sha256"), out + ".sha256")
        os.replace(tmp, out)
        return time.monotonic() - t0, None
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build_detached(out, cmd, src_dir, srcs):
    """Starts the build in a process of its own session that outlives this one; False when
    another build of the same library is under way."""
    import subprocess

    import sys

    try:
        os.close(private_dir(os.path.dirname(out)))
    except (Refused, OSError):
        return False
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
    try:
        write_sources(src_dir, srcs)
        work = build_folder(out)
    except (Refused, OSError):
        os.unlink(lock)
        return False
    # Everything is made in the private build folder (the log too: never written through a
    # symlink someone placed at OUT.log), then renamed into place: hash first, then the library.
    script = ('start=$(date +%s); "$@" "$D/lib.so" > "$D/build.log" 2>&1'
              ' && "$PY" -I -S -c "$H" "$D/lib.so" > "$D/lib.sha256" && mv -fT "$D/lib.sha256" "$O.sha256" && mv -fT "$D/lib.so" "$O"'
              ' && echo "built in $(( $(date +%s) - start )) s" >> "$D/build.log"; mv -fT "$D/build.log" "$O.log"; rm -rf "$D"; rm -f "$K"')
    env = clean_env()
    env.update({"D": work, "O": out, "K": lock, "PY": sys.executable, "H": HASH_SCRIPT})
    subprocess.Popen(["/bin/sh", "-c", script, "gpufrag-tracker-build"] + cmd, env=env, stdin=subprocess.DEVNULL,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    return True


def attach_library(path):
    """Loads the library and attaches it to PyTorch's allocator: (library, None) or (None, why)."""
    import ctypes

    fd, why = verified_library(path)
    if fd is None:
        return None, why
    try:
        lib = ctypes.CDLL(f"/proc/self/fd/{fd}")
    finally:
        os.close(fd)
    lib.gpufrag_torch_tracker_attach.restype = ctypes.c_int
    rc = lib.gpufrag_torch_tracker_attach()
    if rc < 0:
        return None, {-1: "the shim's annotation functions are not loaded", -2: "PyTorch refused the tracker"}.get(rc, f"attach returned {rc}")
    return lib, None
