import weakref

from . import memory_hook, runtime

UNIT = 512


class OutOfMemoryError(MemoryError):
    """As cupy/cuda/memory.pyx's (CuPy 14): size about to be allocated, total allocated so far (-1
    when the async pool cannot say), the pool's limit (0: none), and the same message."""

    def __init__(self, size, total, limit=0):
        self._size = size
        self._total = total
        self._limit = limit
        if limit == 0:
            msg = "Out of memory allocating {:,} bytes".format(size)
            if total != -1:
                msg += " (allocated so far: {:,} bytes).".format(total)
        else:
            msg = "Out of memory allocating {:,} bytes (allocated so far: {:,} bytes, limit set to: {:,} bytes).".format(size, total, limit)
        super(OutOfMemoryError, self).__init__(msg)

    def __reduce__(self):
        return (type(self), (self._size, self._total, self._limit))


class _Memory:
    """One driver allocation (cupy.cuda.memory.Memory)."""

    def __init__(self, ptr, size):
        self.ptr, self.size = ptr, size


class MemoryPointer:
    def __init__(self, pool, ptr, size, mem):
        self.ptr = ptr
        weakref.finalize(self, pool._free, ptr, size, mem)


class SingleDeviceMemoryPool:
    def __init__(self):
        self._mems = []  # _Memory
        self._chunks = {}  # ptr -> [size, in_use, mem]

    def _hooks(self):
        return list(memory_hook.get_memory_hooks().values())

    def used_bytes(self):
        return sum(c[0] for c in self._chunks.values() if c[1])

    def total_bytes(self):
        return sum(m.size for m in self._mems)

    def free_bytes(self):
        return self.total_bytes() - self.used_bytes()

    def _alloc(self, size):
        for h in self._hooks():
            h.alloc_preprocess(device_id=0, mem_size=size)
        ptr = runtime._malloc(size)
        if ptr is None:
            return None
        m = _Memory(ptr, size)
        self._mems.append(m)
        self._chunks[ptr] = [size, False, m]
        for h in self._hooks():
            h.alloc_postprocess(device_id=0, mem_size=size, mem_ptr=ptr)
        return m

    def free_all_blocks(self):
        for m in list(self._mems):
            c = self._chunks.get(m.ptr)
            if c is not None and not c[1] and c[0] == m.size:
                runtime._free(m.ptr)
                del self._chunks[m.ptr]
                self._mems.remove(m)

    def _find(self, size):
        best = None
        for ptr, (s, used, m) in self._chunks.items():
            if not used and s >= size and (best is None or (s, ptr) < (self._chunks[best][0], best)):
                best = ptr
        return best

    def malloc(self, size):
        rounded = (size + UNIT - 1) // UNIT * UNIT
        for h in self._hooks():
            h.malloc_preprocess(device_id=0, size=size, mem_size=rounded)
        ptr = self._find(rounded)
        if ptr is None:
            if self._alloc(rounded) is None:
                self.free_all_blocks()
                if self._alloc(rounded) is None:
                    raise OutOfMemoryError(rounded, self.total_bytes(), 0)
            ptr = self._find(rounded)
        s, _, m = self._chunks[ptr]
        if s > rounded:
            self._chunks[ptr + rounded] = [s - rounded, False, m]
        self._chunks[ptr] = [rounded, True, m]
        for h in self._hooks():
            h.malloc_postprocess(device_id=0, size=size, mem_size=rounded, mem_ptr=ptr, pmem_id=id(m))
        return MemoryPointer(self, ptr, rounded, m)

    def _free(self, ptr, size, m):
        for h in self._hooks():
            h.free_preprocess(device_id=0, mem_size=size, mem_ptr=ptr, pmem_id=id(m))
        self._chunks[ptr][1] = False
        # merge with the free neighbours of the same driver allocation
        nxt = ptr + self._chunks[ptr][0]
        if nxt in self._chunks and not self._chunks[nxt][1] and self._chunks[nxt][2] is m:
            self._chunks[ptr][0] += self._chunks.pop(nxt)[0]
        for p, (s, used, mm) in list(self._chunks.items()):
            if p + s == ptr and not used and mm is m:
                self._chunks[p][0] += self._chunks.pop(ptr)[0]
                break
        for h in self._hooks():
            h.free_postprocess(device_id=0, mem_size=size, mem_ptr=ptr, pmem_id=id(m))


_default_pool = SingleDeviceMemoryPool()
