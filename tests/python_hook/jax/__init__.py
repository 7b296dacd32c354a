# Stand-in for the parts of JAX 0.11 that gpufrag's Python hook uses, behaving like the real ones:
# jax.local_devices() with GPU devices whose memory_stats() is XLA's BFC statistics (the same
# keys), the client in jax._src.xla_bridge._backends, and an out-of-memory error raised as jaxlib's
# translator raises it: jax.errors.JaxRuntimeError(msg, code) with code 8 (RESOURCE_EXHAUSTED) and
# XLA's message. The message is the one measured on the H200 (JAX 0.11.2: the size rounded,
# "11.85GiB"), or with FAKE_JAX_OOM_MESSAGE=bytes the one of XLA's allocator adapter
# (xla/stream_executor/integrations/tf_allocator_adapter.cc, MemoryAllocationError:
# "Out of memory while trying to allocate <size> bytes.", as a RESOURCE_EXHAUSTED status). The
# pool is a small BFC allocator (256-byte rounding, best fit, split at twice the request or
# 128 MiB, merge on free) over one preallocated region; jax.numpy.zeros(nbytes) allocates from it.
import os

from . import errors, numpy  # noqa: F401
from ._src import xla_bridge

RESOURCE_EXHAUSTED = 8  # absl::StatusCode::kResourceExhausted

MIB = 1 << 20


class _Bfc:
    def __init__(self, pool):
        self.pool = pool
        self.chunks = [[0, pool, False]]  # [offset, size, in_use]
        self.peak = self.num_allocs = self.largest_alloc = 0

    def alloc(self, n):
        r = (n + 255) // 256 * 256
        fits = [c for c in self.chunks if not c[2] and c[1] >= r]
        if not fits:
            if os.environ.get("FAKE_JAX_OOM_MESSAGE") == "bytes":
                msg = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate %d bytes." % n
            else:
                msg = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate %.2fMiB with allocator GPU_0_bfc." % (n / MIB)
            raise errors.JaxRuntimeError(msg, RESOURCE_EXHAUSTED)
        c = min(fits, key=lambda c: (c[1], c[0]))
        if c[1] >= 2 * r or c[1] - r >= 128 * MIB:
            i = self.chunks.index(c)
            self.chunks.insert(i + 1, [c[0] + r, c[1] - r, False])
            c[1] = r
        c[2] = True
        self.num_allocs += 1
        self.largest_alloc = max(self.largest_alloc, c[1])
        self.peak = max(self.peak, self.in_use())
        return c[0]

    def free(self, off):
        i = next(i for i, c in enumerate(self.chunks) if c[0] == off)
        self.chunks[i][2] = False
        if i + 1 < len(self.chunks) and not self.chunks[i + 1][2]:
            self.chunks[i][1] += self.chunks.pop(i + 1)[1]
        if i > 0 and not self.chunks[i - 1][2]:
            self.chunks[i - 1][1] += self.chunks.pop(i)[1]

    def in_use(self):
        return sum(c[1] for c in self.chunks if c[2])


class GpuDevice:
    platform = "gpu"

    def __init__(self, i, pool):
        self.id = i
        self.local_hardware_id = i
        self._bfc = _Bfc(pool)

    def memory_stats(self):
        b = self._bfc
        return {
            "bytes_in_use": b.in_use(),
            "peak_bytes_in_use": b.peak,
            "largest_alloc_size": b.largest_alloc,
            "num_allocs": b.num_allocs,
            "bytes_limit": b.pool,
            "bytes_reserved": 0,
            "largest_free_block_bytes": max([c[1] for c in b.chunks if not c[2]] or [0]),
            "pool_bytes": b.pool,
            "peak_pool_bytes": b.pool,
        }


_devices = [GpuDevice(0, 64 * MIB)]
xla_bridge._backends["cuda"] = xla_bridge.Client(_devices)


def local_devices():
    return [d for c in xla_bridge.backends().values() for d in c.local_devices()]


def devices():
    return list(_devices)
