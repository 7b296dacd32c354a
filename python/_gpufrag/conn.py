"""The hook's connection to gpufrag's consumer: the hello, the frames, and the wire event.

One Unix socket per process (GPUFRAG_SOCK), opened on the first frame and written under one lock.
The hello is the 64-byte `Hello` of wire/src/hello.rs (source 2: a Python hook, no ring); each
frame is a 16-byte header (magic "GFPY", kind, body length) and its body, read by
src/consumer/conn.rs. Every frame kind and every struct format is named here once, and
tests/event_layout.rs checks each against the Rust side. A forked child never writes into its
parent's socket; a write that fails ends the connection for good: the traced program comes first.
"""

import os
import socket
import struct
import threading
import json

# Frame kinds (src/consumer/conn.rs's PY_*).
PY_SNAPSHOT = 1  # a pickled torch.cuda.memory._snapshot()
PY_OOM = 2  # PyTorch's OOM observer fired (snapshot mode)
PY_ARMED = 3  # PyTorch's native caching allocator manages this process's memory
PY_EVENTS = 4  # wire events packed with EVENT (CuPy's pool chunks)
PY_STATS = 5  # JSON: a framework's own statistics
PY_FRAMEWORK_OOM = 6  # JSON: a framework's out-of-memory error
PY_BLOCKS_SOURCE = 7  # JSON: how PyTorch's blocks reach gpufrag
PY_OOM_ALLOWED = 8  # the allowed bytes of an OOM the trace tracker reported
PY_SETTINGS = 20  # JSON: the allocator settings (at arm: those in force; after a change: the string given)
PY_FRACTION = 21  # set_per_process_memory_fraction
PY_FRAMEWORK = 22  # JSON: the framework managing this process's memory and its version

FRAME_HEADER = "<4sIQ"
FRAME_MAGIC = b"GFPY"
# Struct-packed frame bodies, by kind.
BODY_FORMATS = {
    PY_OOM: "<qQQQQ",  # device, requested, limit, device free, allowed (0: no fraction)
    PY_OOM_ALLOWED: "<qQQ",  # device, requested, allowed
    PY_ARMED: "<q",  # device
    PY_FRACTION: "<qdQ",  # device, fraction, allowed bytes (fraction x the device total)
}
# Frames whose bodies are not struct-packed.
JSON_FRAMES = (PY_STATS, PY_FRAMEWORK_OOM, PY_BLOCKS_SOURCE, PY_SETTINGS, PY_FRAMEWORK)
RAW_FRAMES = (PY_SNAPSHOT, PY_EVENTS)

HELLO_MAGIC = b"GFHELLO1"
HELLO_FORMAT = "<IIQQII"  # pid, parent, ring bytes, start time, flags, source
SOURCE_PYTHON = 2

# gpufrag's wire event (include/gpufrag_event.h): 80 bytes, little-endian.
EVENT = struct.Struct("<QQQQQQQIIHhiIHH")
EV_BLOCK_ALLOC, EV_BLOCK_FREE, EV_ADOPT = 14, 15, 22
F_BLOCK_SIZE_KNOWN, F_ALLOC_CUPY = 1 << 5, 1 << 9


def hello():
    """The 64-byte hello this process sends first."""
    try:
        with open("/proc/self/comm", "rb") as f:
            comm = f.read().strip()[:23]
        with open("/proc/self/stat", "rb") as f:
            start = int(f.read().rsplit(b")", 1)[1].split()[19])
    except (OSError, ValueError, IndexError):
        comm, start = b"python", 0
    return HELLO_MAGIC + struct.pack(HELLO_FORMAT, os.getpid(), os.getppid(), 0, start, 0, SOURCE_PYTHON) + comm.ljust(24, b"\0")


class Conn:
    """The process's one connection to the consumer at `path`."""

    def __init__(self, path):
        self.path = path
        self.sock = None
        self.dead = False
        self.pid = os.getpid()
        self.lock = threading.Lock()

    def send(self, kind, body):
        """Sends one frame; never raises."""
        with self.lock:
            if self.dead or self.pid != os.getpid():
                return
            try:
                if self.sock is None:
                    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    s.connect(self.path)
                    s.sendall(hello())
                    self.sock = s
                self.sock.sendall(struct.pack(FRAME_HEADER, FRAME_MAGIC, kind, len(body)) + body)
            except OSError:
                self.dead = True

    def send_packed(self, kind, *values):
        """Sends a struct-packed frame of `kind` (its format is BODY_FORMATS[kind])."""
        try:
            self.send(kind, struct.pack(BODY_FORMATS[kind], *values))
        except Exception:
            pass

    def send_json(self, kind, obj):
        try:
            self.send(kind, json.dumps(obj, separators=(",", ":")).encode())
        except Exception:
            pass

    def in_child(self):
        """After fork, in the child: the socket is the parent's."""
        self.sock = None
        self.dead = True
