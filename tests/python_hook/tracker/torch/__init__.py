# A stand-in torch for the trace tracker tests (tests/run_torch_tracker.rs): what gpufrag's hook
# reads to build, load and attach python/torch_tracker.cpp (version, ABI flag, cpp_extension's
# include and library paths, the lazy init), with a stand-in libc10_cuda.so (FAKE_TORCH_LIB) that
# calls the attached trace trackers for each entry the workload hands it.
import ctypes
import os

__version__ = "2.11.0+standin"


class version:
    cuda = "13.0"


# Like torch, which loads libc10_cuda.so at import.
_lib = ctypes.CDLL(os.path.join(os.environ["FAKE_TORCH_LIB"], "libc10_cuda.so"), mode=ctypes.RTLD_GLOBAL)
_lib.standin_trace.restype = ctypes.c_int
_lib.standin_trace.argtypes = [ctypes.c_int, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_int]

from . import _C, cuda, utils  # noqa: E402,F401
