"""PyTorch's caching allocator under `gpufrag run`: how its blocks reach gpufrag.

The moment CUDA is up (the wrapper of `torch.cuda._lazy_init`, which PyTorch's C++ side calls on
the first CUDA use), `arm` says that a caching allocator manages this process's memory (frame 3),
chooses how the blocks come (`blocks_source`, frame 7) and attaches PyTorch's out-of-memory
observer. With the allocator trace tracker (tracker.py) every allocation, free and OOM reaches the
shim's ring as one event and no snapshot is taken; the observer then only adds an OOM's allowed
bytes when set_per_process_memory_fraction caps the allocator (frame 8). Without it, snapshots
(`torch.cuda.memory._snapshot()`, frame 1) every interval, at the observer (with frame 2) and at
exit. With `backend:cudaMallocAsync` there are no blocks to send (the driver's pools hold them)
and this part stays quiet. History recording is never turned on.
"""

import os
import pickle
import sys

from . import conn as wire
from . import tracker


class TorchBlocks:
    def __init__(self, conn, interval, tracker_mode):
        self.conn = conn
        self.interval = interval
        # GPUFRAG_TORCH_TRACKER: auto (use it when cached, else snapshots for this run while a
        # detached process builds it for the next), build (build it now, before the program's
        # first allocation), off (snapshots).
        self.tracker_mode = tracker_mode
        self.armed = False
        self.tracker = False
        self.tracker_lib = None
        self.choosing = False

    @staticmethod
    def cuda_ready():
        torch = sys.modules.get("torch")
        try:
            return torch is not None and torch.cuda.is_initialized()
        except Exception:
            return False

    def snapshot(self):
        if not self.cuda_ready():
            return
        try:
            snap = sys.modules["torch"].cuda.memory._snapshot()
            snap.pop("device_traces", None) if not any(snap.get("device_traces", [])) else None
            snap.setdefault("device_traces", [])
            self.conn.send(wire.PY_SNAPSHOT, pickle.dumps(snap, protocol=4))
        except Exception:
            pass

    @staticmethod
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

    def on_oom(self, device, alloc, limit, device_free):
        # PyTorch 2.11 calls observers with (device, alloc_size, set_fraction ?
        # allowed_memory_maximum : device_total, device_free), after releasing its lock.
        if self.tracker:
            # The tracker's OOM entry is in the ring, ordered with the blocks; what it cannot
            # carry is the cap: the allowed bytes go as an amendment of that OOM (frame 8).
            try:
                allowed = self.allowed_bytes(device, limit)
                if allowed:
                    self.conn.send_packed(wire.PY_OOM_ALLOWED, int(device), int(alloc), allowed)
            except Exception:
                pass
            return
        self.snapshot()
        try:
            allowed = self.allowed_bytes(device, limit)
        except Exception:
            allowed = 0
        try:
            self.conn.send_packed(wire.PY_OOM, int(device), int(alloc), int(limit), int(device_free), allowed)
        except Exception:
            pass

    @staticmethod
    def native_backend():
        try:
            return sys.modules["torch"].cuda.get_allocator_backend() == "native"
        except Exception:
            return False

    def arm(self, early=False):
        """early: called from the lazy-init wrapper, before any block exists (the tracker only
        attaches then: a block handed out before it would be freed unknown)."""
        with self.conn.lock:
            if self.armed or not self.cuda_ready():
                return
            self.armed = True
        if not self.native_backend():
            self.conn.dead = True
            return
        torch = sys.modules["torch"]
        try:
            self.conn.send_packed(wire.PY_ARMED, int(torch.cuda.current_device()))
        except Exception:
            pass
        try:
            self.state_facts(torch)
        except Exception:
            pass
        self.choosing = True
        try:
            self.blocks_source(torch, early)
        except Exception as e:
            self.say_snapshots(f"the trace tracker failed ({type(e).__name__}: {e})", sep=": ")
        self.choosing = False
        # with the tracker too: on_oom then sends only the cap's allowed bytes (frame 8)
        try:
            torch._C._cuda_attach_out_of_memory_observer(self.on_oom)
        except Exception:
            pass

    def state_facts(self, torch):
        """The facts the state sizes blocks and judges OOMs by, as events (frames 20-22): the
        framework and its version; then every later change of the allocator settings
        (torch.cuda.memory._set_allocator_settings: the string given) and of the memory fraction
        (set_per_process_memory_fraction: the fraction and the allowed bytes), sent right after
        PyTorch applied it. The settings at start come from the environment at exec (the shim's
        hello), so they are not sent here."""
        conn = self.conn
        conn.send_json(wire.PY_FRAMEWORK, {"framework": "pytorch", "version": str(getattr(torch, "__version__", ""))})
        memory = getattr(torch.cuda, "memory", None)
        set_settings = getattr(memory, "_set_allocator_settings", None) if memory is not None else None
        if set_settings is not None and not getattr(set_settings, "_gpufrag", False):

            def _set_allocator_settings(env, *a, **k):
                r = set_settings(env, *a, **k)
                conn.send_json(wire.PY_SETTINGS, {"conf": str(env)})
                return r

            _set_allocator_settings._gpufrag = True
            memory._set_allocator_settings = _set_allocator_settings
        set_fraction = getattr(torch.cuda, "set_per_process_memory_fraction", None)
        if set_fraction is not None and not getattr(set_fraction, "_gpufrag", False):

            def set_per_process_memory_fraction(fraction, device=None, *a, **k):
                r = set_fraction(fraction, device, *a, **k)
                try:
                    d = torch.cuda.current_device() if device is None else torch.cuda._utils._get_device_index(device)
                    total = int(torch.cuda.mem_get_info(d)[1])
                    conn.send_packed(wire.PY_FRACTION, int(d), float(fraction), int(float(fraction) * total))
                except Exception:
                    pass
                return r

            set_per_process_memory_fraction._gpufrag = True
            torch.cuda.set_per_process_memory_fraction = set_per_process_memory_fraction
            if memory is not None and getattr(memory, "set_per_process_memory_fraction", None) is set_fraction:
                memory.set_per_process_memory_fraction = set_per_process_memory_fraction

    def say_snapshots(self, why, sep=": ", **extra):
        note = f"PyTorch blocks from snapshots every {self.interval:g} s{sep}{why}"
        self.conn.send_json(wire.PY_BLOCKS_SOURCE, {"blocks": "snapshots", "note": note, **extra})

    def blocks_source(self, torch, early):
        """Picks how PyTorch's blocks reach gpufrag for this process and says so (frame 7)."""
        if self.tracker_mode == "off":
            self.say_snapshots("(--torch-tracker=off)", sep=" ")
            return
        if not early:
            self.say_snapshots("CUDA was initialised before the hook could wrap it, so the trace tracker would miss the blocks handed out before it")
            return
        plan = tracker.cached_library(torch)
        if isinstance(plan, str):
            self.say_snapshots(f"the trace tracker is unavailable: {plan}")
            return
        out, src_dir, srcs = plan
        built = ""
        if not os.path.exists(out):
            cmd = tracker.build_command(torch, src_dir)
            if isinstance(cmd, str):
                self.say_snapshots(f"the trace tracker is unavailable: {cmd}")
                return
            if self.tracker_mode == "build":
                secs, err = tracker.build_now(out, cmd, src_dir, srcs)
                if err:
                    self.say_snapshots(f"the trace tracker is unavailable: {err}")
                    return
                built = f"; built in {secs:.1f} s before the first allocation"
            else:
                started = tracker.build_detached(out, cmd, src_dir, srcs)
                what = "is being built" if started else "is being built by another process"
                self.say_snapshots(f"the trace tracker {what} for the next run (cached in {os.path.dirname(out)})", sep="; ", building=out)
                return
        lib, err = tracker.attach_library(out)
        if err:
            self.say_snapshots(f"the trace tracker did not attach: {err} ({out})")
            return
        self.tracker_lib = lib
        self.tracker = True
        self.conn.send_json(wire.PY_BLOCKS_SOURCE, {"blocks": "tracker", "note": f"PyTorch blocks: trace tracker (event level){built}, {out}", "library": out})

    def wrap_lazy_init(self, cuda):
        """Wraps torch.cuda._lazy_init so that `arm` runs the moment CUDA is up."""
        orig = getattr(cuda, "_lazy_init", None)
        if orig is None or getattr(orig, "_gpufrag", False):
            return
        hook = self

        def _lazy_init(*a, **k):
            r = orig(*a, **k)
            try:
                hook.arm(early=True)
            except Exception:
                pass
            return r

        _lazy_init._gpufrag = True
        cuda._lazy_init = _lazy_init

    def periodic(self):
        """The watcher thread's turn: arm once CUDA is up, then a snapshot when no tracker runs."""
        if self.cuda_ready():
            self.arm()
            if self.armed and not self.conn.dead and not self.tracker and not self.choosing:
                self.snapshot()

    def at_exit(self):
        self.arm()
        if self.tracker:
            # the state at exit, as a final snapshot would give it: not the teardown's frees
            try:
                self.tracker_lib.gpufrag_torch_tracker_stop()
            except Exception:
                pass
        elif not self.conn.dead:
            self.snapshot()
