def _snapshot():
    raise RuntimeError("the stand-in keeps no snapshot: its blocks reach gpufrag through the trace tracker only")


_settings = []


def _set_allocator_settings(env):
    """PyTorch parses `env` over the settings in force (CUDAAllocatorConfig); the stand-in keeps
    the strings (its sizes come from the sequence's entries)."""
    _settings.append(env)
