# As jax._src.xla_bridge: the backends made so far, by platform (`_backends`, filled under the
# module's non-reentrant `_backend_lock` by backends()), each a client with local_devices().
import threading

_backends = {}
_backend_lock = threading.Lock()


class Client:
    platform = "gpu"

    def __init__(self, devices):
        self._devices = devices

    def local_devices(self):
        return list(self._devices)


def backends():
    with _backend_lock:
        return _backends
