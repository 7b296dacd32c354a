import weakref


class Array:
    def __init__(self, nbytes):
        from . import _devices

        bfc = _devices[0]._bfc
        self.nbytes = nbytes
        self._off = bfc.alloc(nbytes)
        weakref.finalize(self, bfc.free, self._off)


def zeros(nbytes):
    return Array(nbytes)
