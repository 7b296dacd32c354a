import ctypes

_cuda = ctypes.CDLL("libcuda.so.1")
_cuda.cuInit(0)
_ctx = ctypes.c_void_p()
_cuda.cuDevicePrimaryCtxRetain(ctypes.byref(_ctx), 0)
_cuda.cuCtxSetCurrent(_ctx)


def getDevice():
    return 0


def memGetInfo():
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    _cuda.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
    return free.value, total.value


def _malloc(size):
    p = ctypes.c_uint64()
    rc = _cuda.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(size))
    return p.value if rc == 0 else None


def _free(ptr):
    _cuda.cuMemFree_v2(ctypes.c_uint64(ptr))
