def _snapshot():
    raise RuntimeError("the stand-in keeps no snapshot: its blocks reach gpufrag through the trace tracker only")
